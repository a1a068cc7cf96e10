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

    A tensor-parallel stage (tp = t > 1) runs each replica on t processes, its TP ranks 0..t-1, which all hold the
    replica's samples whole: a block's row-parallel all-reduce leaves its output (and a column-parallel one's input
    gradient) replicated over the group. So TP rank j of the receiving stage takes each piece from TP rank j mod t'
    of the sending stage (t' its tp): with equal tp, rank j to rank j over parallel links and no broadcast inside
    the group; from tp 2 to tp 1 only rank 0 sends; from tp 1 to tp 2 the one sender sends to both.
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
    """What one process runs: schedule rank, pipeline replica, data-parallel replica and its stages; on a
    tensor-parallel stage also its TP rank in its replica's group of `tp` processes."""

    process: int
    sched_rank: int
    pipeline_replica: int
    replica: int
    replicas: int
    stages: tuple[int, ...]
    tp_rank: int = 0
    tp: int = 1


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

    def tp(self, stage: int) -> int:
        """The tensor-parallel degree of `stage` (its schedule rank's)."""
        return self.plan.stages[self.schedule.stage_to_rank[stage]].tp

    def process(self, stage: int, pipeline_replica: int, replica: int, tp_rank: int = 0) -> int:
        """The process running TP rank `tp_rank` of `replica` of `stage` in `pipeline_replica`."""
        rank = self.schedule.stage_to_rank[stage]
        device = self.plan.replica_devices(rank, pipeline_replica)[replica * self.plan.stages[rank].tp + tp_rank]
        return self.process_of[device]

    @cached_property
    def roles(self) -> tuple[Role, ...]:
        """The role of every process, indexed by process."""
        found: dict[int, Role] = {}
        for r in range(self.plan.num_ranks):
            reps, tp = self.plan.replicas_of(r), self.plan.stages[r].tp
            for i, device in enumerate(self.plan.stages[r].devices):
                group, k = divmod(i, tp)
                t, j = divmod(group, reps)
                p = self.process_of[device]
                found[p] = Role(p, r, t, j, reps, self.schedule.stages_of(r), k, tp)
        return tuple(found[p] for p in range(self.world_size))

    def stage_group(self, sched_rank: int, tp_rank: int = 0) -> tuple[int, ...]:
        """Processes that hold a copy of schedule rank `sched_rank`'s weights (they all-reduce gradients): on a
        tensor-parallel stage, those of TP rank `tp_rank` (each holds the same shard)."""
        stage = self.plan.stages[sched_rank]
        return tuple(sorted(self.process_of[d] for d in stage.devices[tp_rank :: stage.tp]))

    def tp_groups(self, sched_rank: int) -> tuple[tuple[int, ...], ...]:
        """The tensor-parallel groups of schedule rank `sched_rank`: each replica's processes in TP-rank order (one
        group of one process each when its tp is 1)."""
        stage = self.plan.stages[sched_rank]
        devices = stage.devices
        return tuple(tuple(self.process_of[d] for d in devices[i : i + stage.tp]) for i in range(0, len(devices), stage.tp))

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
        src_tp, dst_tp = self.tp(src_stage), self.tp(dst_stage)
        if sending:  # TP rank i sends to every receiving TP rank j with j mod src_tp == i (module docstring)
            pairs = [(role.replica, k, role.tp_rank, t) for k in range(len(dst_ranges))
                     for t in range(role.tp_rank, dst_tp, src_tp)]  # fmt: skip
        else:
            pairs = [(j, role.replica, role.tp_rank % src_tp, role.tp_rank) for j in range(len(src_ranges))]
        for j, k, src_rank, dst_rank in pairs:
            lo = max(src_ranges[j][0], dst_ranges[k][0])
            hi = min(src_ranges[j][1], dst_ranges[k][1])
            if lo >= hi:
                continue
            src = self.process(src_stage, role.pipeline_replica, j, src_rank)
            dst = self.process(dst_stage, role.pipeline_replica, k, dst_rank)
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
