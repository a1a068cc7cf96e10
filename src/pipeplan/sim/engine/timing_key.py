"""What a trace-free simulation's iteration time reads of its costs: costs with equal keys simulate to equal times.

A planner scores many placements of one partition: swapping two devices renames the resources and links its flows
use and the devices of its rings, and often changes nothing else. Without a bandwidth trace the event loops see
resources only as the ids TransferTable numbers them with (first appearance, boundary by boundary, flow by flow), and
never read a flow's link or a ring's devices. So two costs whose `timing_key`s are equal give the same TransferTable
(ids, latencies, works, fast forms, which resources have one producer), the same durations and the same all-reduce
and exchange tails: equal iteration times under one schedule (tests/test_timing_key.py).
"""

from __future__ import annotations

from pipeplan.sim.cost.types import Costs, Flow

TimingKey = tuple[object, ...]


def timing_key(costs: Costs) -> TimingKey:
    """The parts of `costs` that `simulate(schedule, costs, trace=None)`'s iteration time depends on, resources named
    by their TransferTable ids; links, rings and bytes left out (a trace reads the first two, memory the last)."""
    stages = tuple(
        (
            c.fwd_ms,
            c.bwd_ms,
            c.bwd_input_ms,
            c.bwd_weight_ms,
            c.optimizer_ms,
            c.allreduce_ms,
            tuple((b.ready_fraction, b.allreduce_ms) for b in c.allreduce_buckets),
        )
        for c in costs.stages
    )
    ids: dict[str, int] = {}
    transfers = tuple(_flows(flows, ids) for flows in costs.forward + costs.backward)
    shared = tuple((x.stages, x.exchange_ms) for x in costs.shared)
    return (stages, transfers, shared)


def _flows(flows: tuple[Flow, ...], ids: dict[str, int]) -> tuple[tuple[tuple[int, ...], float, float], ...]:
    """One transfer's flows as (resource ids, latency, work); `ids` numbers resources as TransferTable does."""
    return tuple((tuple(ids.setdefault(name, len(ids)) for name in f.resources), f.latency_ms, f.work_ms) for f in flows)
