"""Who runs what: processes, stage replicas, sample ranges and the messages between them (no torch).

Process i runs the plan's i-th device in sorted order. A schedule rank is a
position in the pipeline; every device of plan stage r (all data-parallel
replicas in all pipeline replicas) runs schedule rank r's actions on its own
share of the samples.

Note:
    Each microbatch of b samples is split over a stage's r replicas as
    `torch.tensor_split` does (the first b mod r replicas take one sample
    more). Between stage s and s+1 every replica sends each receiving
    replica exactly the samples both hold, so any pair of replica counts
    works (DAPPLE's split/concat); with equal counts this is the cost model's
    replica-t-to-replica-t pairing.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from pipeplan.core.errors import PlanError
from pipeplan.core.partition import replica_split
from pipeplan.core.plan import Plan
from pipeplan.core.schedule import Action, Schedule


@dataclass(frozen=True, slots=True)
class Role:
    """What one process runs: schedule rank, pipeline replica, data-parallel replica and its stages."""

    process: int
    sched_rank: int
    pipeline_replica: int
    replica: int
    replicas: int
    stages: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Message:
    """One tensor sent between processes: activations ('act') or gradients ('grad') across `boundary`.

    `boundary` b sits between stage b and b+1. The sender's tensor rows
    [src_lo, src_hi) become the receiver's rows [dst_lo, dst_hi).
    """

    kind: str
    boundary: int
    microbatch: int
    src: int
    dst: int
    src_lo: int
    src_hi: int
    dst_lo: int

    @property
    def channel(self) -> tuple[str, int, int, int]:
        """(kind, boundary, src, dst): every message on a channel has the same shape."""
        return (self.kind, self.boundary, self.src, self.dst)

    def describe(self) -> str:
        """Human form, e.g. 'act 0->1 of microbatch 3 from process 0'."""
        arrow = f"{self.boundary}->{self.boundary + 1}" if self.kind == "act" else f"{self.boundary + 1}->{self.boundary}"
        return f"{self.kind} {arrow} of microbatch {self.microbatch} from process {self.src}"


class Topology:
    """The placement of a Plan and its Schedule on processes, and the messages each action moves.

    Raises:
        PlanError: the plan and schedule disagree, the world size does not
            match the plan's devices, or a microbatch is smaller than a stage's replicas.
    """

    def __init__(self, plan: Plan, schedule: Schedule, world_size: int) -> None:
        self.plan = plan
        self.schedule = schedule
        self.devices = plan.all_devices
        if len(self.devices) != world_size:
            raise PlanError(f"plan uses {len(self.devices)} devices {list(self.devices)} but the job has {world_size} processes")
        if schedule.num_ranks != plan.num_ranks:
            raise PlanError(f"schedule has {schedule.num_ranks} ranks but plan has {plan.num_ranks} pipeline ranks")
        if schedule.num_stages != len(plan.stages):
            raise PlanError(f"schedule has {schedule.num_stages} stages but plan has {len(plan.stages)}")
        if schedule.num_microbatches != plan.microbatches:
            raise PlanError(f"schedule has {schedule.num_microbatches} microbatches but plan has {plan.microbatches}")
        for s, rank in enumerate(schedule.stage_to_rank):
            if plan.stages[s].devices != plan.stages[rank].devices:
                raise PlanError(
                    f"stage {s} runs on schedule rank {rank}, so its devices must be those of stage {rank} "
                    f"({plan.stages[rank].devices}), got {plan.stages[s].devices}"
                )
        for r in range(plan.num_ranks):
            if plan.replicas_of(r) > plan.microbatch_size:
                raise PlanError(
                    f"stage {r} has {plan.replicas_of(r)} replicas but a microbatch has only {plan.microbatch_size} samples"
                )
        self.process_of = {d: i for i, d in enumerate(self.devices)}
        self.world_size = world_size

    @property
    def num_stages(self) -> int:
        """Stages (chunk-stages for interleaved schedules)."""
        return self.schedule.num_stages

    def replicas(self, stage: int) -> int:
        """Data-parallel replicas of `stage` within one pipeline replica."""
        return self.plan.replicas_of(self.schedule.stage_to_rank[stage])

    def process(self, stage: int, pipeline_replica: int, replica: int) -> int:
        """The process running `replica` of `stage` in `pipeline_replica`."""
        device = self.plan.replica_devices(self.schedule.stage_to_rank[stage], pipeline_replica)[replica]
        return self.process_of[device]

    @cached_property
    def roles(self) -> tuple[Role, ...]:
        """The role of every process, indexed by process."""
        found: dict[int, Role] = {}
        for r in range(self.plan.num_ranks):
            reps = self.plan.replicas_of(r)
            for i, device in enumerate(self.plan.stages[r].devices):
                t, j = divmod(i, reps)
                p = self.process_of[device]
                found[p] = Role(p, r, t, j, reps, self.schedule.stages_of(r))
        return tuple(found[p] for p in range(self.world_size))

    def stage_group(self, sched_rank: int) -> tuple[int, ...]:
        """Processes that hold a copy of schedule rank `sched_rank`'s weights (they all-reduce gradients)."""
        return tuple(sorted(self.process_of[d] for d in self.plan.stages[sched_rank].devices))

    def sample_range(self, role: Role, microbatch: int, stage: int) -> tuple[int, int]:
        """[lo, hi) in the global batch of the samples `role` handles for `microbatch` on `stage`."""
        b = self.plan.microbatch_size
        base = (role.pipeline_replica * self.plan.microbatches + microbatch) * b
        lo, hi = replica_split(b, self.replicas(stage))[role.replica]
        return base + lo, base + hi

    def _pieces(self, kind: str, boundary: int, microbatch: int, role: Role, sending: bool) -> list[Message]:
        """Messages across `boundary` that `role` sends (sending) or receives, in peer-replica order."""
        b = self.plan.microbatch_size
        up = replica_split(b, self.replicas(boundary))
        down = replica_split(b, self.replicas(boundary + 1))
        src_ranges, dst_ranges = (up, down) if kind == "act" else (down, up)
        src_stage, dst_stage = (boundary, boundary + 1) if kind == "act" else (boundary + 1, boundary)
        out = []
        if sending:
            pairs = [(role.replica, k) for k in range(len(dst_ranges))]
        else:
            pairs = [(j, role.replica) for j in range(len(src_ranges))]
        for j, k in pairs:
            lo = max(src_ranges[j][0], dst_ranges[k][0])
            hi = min(src_ranges[j][1], dst_ranges[k][1])
            if lo >= hi:
                continue
            src = self.process(src_stage, role.pipeline_replica, j)
            dst = self.process(dst_stage, role.pipeline_replica, k)
            src_lo, dst_lo = src_ranges[j][0], dst_ranges[k][0]
            out.append(Message(kind, boundary, microbatch, src, dst, lo - src_lo, hi - src_lo, lo - dst_lo))
        return out

    def sends(self, role: Role, action: Action) -> list[Message]:
        """Messages `action` produces on `role`: activations after F, input gradients after B or I."""
        last = self.num_stages - 1
        if action.op == "F" and action.stage < last:
            return self._pieces("act", action.stage, action.microbatch, role, sending=True)
        if action.op in "BI" and action.stage > 0:
            return self._pieces("grad", action.stage - 1, action.microbatch, role, sending=True)
        return []

    def recvs(self, role: Role, action: Action) -> list[Message]:
        """Messages `action` needs on `role` before it can run."""
        last = self.num_stages - 1
        if action.op == "F" and action.stage > 0:
            return self._pieces("act", action.stage - 1, action.microbatch, role, sending=False)
        if action.op in "BI" and action.stage < last:
            return self._pieces("grad", action.stage, action.microbatch, role, sending=False)
        return []

    def send_order(self, src: int, dst: int) -> list[Message]:
        """Every message from process src to process dst in one iteration, in the order src sends them."""
        role = self.roles[src]
        return [m for a in self.schedule.ranks[role.sched_rank] for m in self.sends(role, a) if m.dst == dst]

    def peers(self, process: int) -> tuple[int, ...]:
        """Processes that send to `process` in an iteration."""
        role = self.roles[process]
        return tuple(sorted({m.src for a in self.schedule.ranks[role.sched_rank] for m in self.recvs(role, a)}))
