"""Shared by the runtime adaptive tests: a job's iterations replayed without processes. Each process walks its
schedule with fixed compute per action, its messages go through the runtime's own link emulation under a trace,
and what every process would pack into the shared all-reduce is fed to `AdaptiveK.after_step` (its decision path,
its controller built as the runtime builds it)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch

from pipeplan.core.hardware.bandwidth_trace import BandwidthTrace
from pipeplan.core.plan import Plan
from pipeplan.runtime.execution.executor import ActionSpan, StepRecord
from pipeplan.runtime.execution.replicas import AllReduceSpan
from pipeplan.runtime.measurement import observations
from pipeplan.runtime.placement import Message, Topology
from pipeplan.runtime.training.adaptive import AdaptiveK
from pipeplan.runtime.transport.comm import TransferRecord
from pipeplan.runtime.transport.link_emulation import EmulatedLinks
from pipeplan.schedules.registry import make_schedule

ORIGIN_S = 50.0
"""The run's start on the replay's clock (s)."""


@dataclass
class ReplayExecutor:
    """What AdaptiveK asks of an executor: the topology it walks (switched by `use`)."""

    topology: Topology
    switches: list[int] = field(default_factory=list)

    def use(self, topology: Topology) -> None:
        self.topology = topology
        self.switches.append(topology.plan.k)


def walk(
    topology: Topology, links: EmulatedLinks, start_ms: float, compute_ms: dict[str, float], nbytes: int
) -> list[StepRecord]:
    """Every process's record of one iteration from `start_ms` (run's clock): each action takes compute_ms[op], its
    messages leave at its end through `links` and are consumed at their emulated arrival."""

    def s(t_ms: float) -> float:
        return ORIGIN_S + t_ms / 1000.0

    world = topology.world_size
    devices = topology.devices
    position, clock = [0] * world, [start_ms] * world
    arrived: dict[Message, tuple[float, float]] = {}
    spans: list[list[ActionSpan]] = [[] for _ in range(world)]
    moved: list[list[TransferRecord]] = [[] for _ in range(world)]
    while any(position[q] < len(topology.schedule.ranks[topology.roles[q].sched_rank]) for q in range(world)):
        progressed = False
        for q in range(world):
            role = topology.roles[q]
            actions = topology.schedule.ranks[role.sched_rank]
            while position[q] < len(actions):
                action = actions[position[q]]
                needed = topology.recvs(role, action)
                if any(m not in arrived for m in needed):
                    break
                ready = max([clock[q]] + [arrived[m][1] for m in needed])
                for m in needed:
                    wait = max(0.0, arrived[m][1] - clock[q]) / 1000.0
                    moved[q].append(TransferRecord(m, s(ready), False, nbytes, wait, arrived[m], s(clock[q])))
                end = ready + compute_ms[action.op]
                spans[q].append(ActionSpan(q, action.stage, action.op, action.microbatch, s(ready), s(end)))
                for m in topology.sends(role, action):
                    arrived[m] = links.transfer((devices[m.src], devices[m.dst]), nbytes, end)
                    moved[q].append(TransferRecord(m, s(end), True, nbytes))
                clock[q] = end
                position[q] += 1
                progressed = True
        assert progressed, "the replay deadlocked"
    return [StepRecord(0.0, tuple(spans[q]), tuple(moved[q]), 1, ((topology.roles[q].stages[0], 1),)) for q in range(world)]


def with_allreduces(topology: Topology, links: EmulatedLinks, records: list[StepRecord], nbytes: int) -> list[StepRecord]:
    """Each replicated stage's processes' records with the stage's emulated ring all-reduce of `nbytes` (over the
    plan's stage devices, from the last of their last backwards), as runtime.execution.replicas times it."""
    out = list(records)
    for s, stage in enumerate(topology.plan.stages):
        members = [q for q in range(topology.world_size) if topology.roles[q].stages[0] == s]
        if len(stage.devices) < 2 or not nbytes:
            continue
        start = max(records[q].compute[-1].end_s for q in members) * 1000.0 - ORIGIN_S * 1000.0
        end = links.ring_end(tuple(stage.devices), nbytes, start)
        span = AllReduceSpan(s, start, end, nbytes, links.ring_parts(tuple(stage.devices), nbytes)[0])
        for q in members:
            out[q] = dataclasses.replace(records[q], collectives=(span,))
    return out


def replay(plan: Plan, trace: BandwidthTrace, gb_per_s: float, iterations: int, compute_ms: dict[str, float],
           nbytes: int, gradient_bytes: int = 0, activation_bytes: float = 0.0,
           memory_limit_bytes: float = 1e12) -> AdaptiveK:  # fmt: skip
    """`iterations` of `plan` (kfkb) under `trace` on links emulated at `gb_per_s`, every decision AdaptiveK's; with
    `gradient_bytes`, each replicated stage all-reduces that many bytes after its last backward. Every process holds
    1,000 static bytes and `activation_bytes` per microbatch in flight, within `memory_limit_bytes`."""
    schedule = make_schedule("kfkb", len(plan.stages), plan.microbatches, k=plan.k)
    topology = Topology(plan, schedule, len(plan.all_devices))
    links = EmulatedLinks.uniform(topology.devices, gb_per_s, trace)
    executor: Any = ReplayExecutor(topology)
    loop = AdaptiveK(plan, schedule, executor, ORIGIN_S, SimpleNamespace(links=links), memory_limit_bytes)  # type: ignore[arg-type]
    start = 0.0
    for index in range(iterations):
        records = with_allreduces(executor.topology, links, walk(executor.topology, links, start, compute_ms, nbytes),
                                  gradient_bytes)  # fmt: skip
        shared = torch.zeros(loop.size, dtype=torch.float64)
        ends = []
        for q, record in enumerate(records):
            done_ms = record.compute[-1].end_s * 1000.0 - ORIGIN_S * 1000.0
            done_ms = max([done_ms] + [c.end_ms for c in record.collectives])
            end_ms = done_ms + 0.5  # a 0.5 ms optimizer step
            ends.append(end_ms)
            times = (ORIGIN_S + start / 1000.0, ORIGIN_S + end_ms / 1000.0)
            stage = executor.topology.roles[q].stages[0]
            values = observations.pack(record, ORIGIN_S, loop.k, stage, times, 0.5, 1000.0, activation_bytes,
                                       memory_limit_bytes)  # fmt: skip
            shared[q * loop.slot : q * loop.slot + len(values)] = torch.tensor(values, dtype=torch.float64)
        loop.after_step(index, shared)
        start = max(ends) + 0.2  # the loss's all-reduce
    return loop
