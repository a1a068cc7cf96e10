"""Lower bounds on the iteration time: the busiest rank, and one microbatch's critical path."""

from __future__ import annotations

from collections.abc import Sequence

from pipeplan.core.errors import CostError
from pipeplan.core.hardware.bandwidth_trace import BandwidthTrace
from pipeplan.core.schedule import Schedule
from pipeplan.sim.cost.shared import stage_exchange_ms
from pipeplan.sim.cost.types import Costs, Flow, StageCost, ring_links
from pipeplan.sim.engine.program import program_for


def lower_bound(schedule: Schedule, costs: Costs, trace: BandwidthTrace | None = None) -> float:
    """A time no run of `schedule` under `costs` can beat.

    The maximum of (1) per rank: its total compute plus the shortest
    all-reduce tail among its stages (its last action is some stage's last
    backward, whose all-reduce follows) plus its optimizer step, and (2) per
    stage s: one microbatch's path through every forward and transfer, the
    backwards from the last stage down to s (I for split stages, then W of s),
    s's all-reduce (a bucketed one: what of it must run past the last backward, _allreduce_tail) and its rank's
    optimizer step. Transfers count
    their unqueued duration, at the fastest rate `trace` ever gives their link; an all-reduce (and a shared
    parameter's exchange) its latency plus its work at the fastest rate its ring ever runs at (a factor may
    exceed 1: core.limits.MAX_FACTOR).

    Raises:
        CostError: costs cover a different number of stages than the schedule.
    """
    if len(costs.stages) != schedule.num_stages:
        raise CostError(f"costs cover {len(costs.stages)} stages but schedule {schedule.name!r} has {schedule.num_stages} stages")
    program = program_for(schedule)
    durations = []
    for c in costs.stages:
        durations += [c.fwd_ms, c.bwd_ms, c.bwd_input_ms, c.bwd_weight_ms, c.optimizer_ms]
    busy = [sum((durations[col] * n for col, n in cols.items()), 0.0) for cols in program.columns]
    return bound_from_parts(schedule, costs, busy, program.split_stages, program.stages_with_u, trace)


def bound_from_parts(
    schedule: Schedule,
    costs: Costs,
    busy: Sequence[float],
    split_stages: frozenset[int],
    stages_with_u: frozenset[int],
    trace: BandwidthTrace | None,
) -> float:
    """`lower_bound` from per-rank busy time and which stages split backward or run U (shared with the simulator)."""
    stages = costs.stages
    if not any(busy):
        return 0.0
    optimizer = rank_optimizer_ms(schedule, costs, stages_with_u)
    # after its last backward a stage waits for its all-reduce and for the exchange of every shared parameter it holds
    exchange = stage_exchange_ms(costs.shared, len(stages)) if trace is None else _fastest_exchanges(costs, trace)
    tails = [
        max(_allreduce_tail(c, s in split_stages, trace), exchange[s]) + optimizer[schedule.stage_to_rank[s]]
        for s, c in enumerate(stages)
    ]
    best = 0.0
    for rank, rank_busy in enumerate(busy):
        own = schedule.stages_of(rank)
        best = max(best, rank_busy + (min(tails[s] for s in own) if own and rank_busy > 0 else 0.0))
    forward_path = sum(c.fwd_ms for c in stages) + sum(_unqueued(flows, trace) for flows in costs.forward)
    back: float = 0.0  # backward path from the last stage down to (and excluding) stage s
    for s in range(len(stages) - 1, -1, -1):
        c = stages[s]
        split = s in split_stages
        here = (c.bwd_input_ms + c.bwd_weight_ms) if split else c.bwd_ms  # type: ignore[operator]
        best = max(best, forward_path + back + here + tails[s])
        back += (c.bwd_input_ms if split else c.bwd_ms) or 0.0
        if s > 0:
            back += _unqueued(costs.backward[s - 1], trace)
    return best


def rank_optimizer_ms(schedule: Schedule, costs: Costs, stages_with_u: frozenset[int]) -> list[float]:
    """Per rank, its optimizer step: the steps of all its stages, one after the other, after the rank's last action
    and its stages' all-reduces (stages whose schedule holds U actions step inside it and count 0 here)."""
    steps = [0.0] * schedule.num_ranks
    for s, cost in enumerate(costs.stages):
        if s not in stages_with_u:
            steps[schedule.stage_to_rank[s]] += cost.optimizer_ms
    return steps


def _fastest_ring(total_ms: float, latency_ms: float, ring: tuple[int, ...], trace: BandwidthTrace | None) -> float:
    """A ring all-reduce's least duration under `trace`: latency + work / the ring's fastest factor (its total, the
    same float, when no step changes its links)."""
    if trace is None or len(ring) < 2:
        return total_ms
    links = ring_links(ring)
    if trace.ring_segments(links) is None:
        return total_ms
    return latency_ms + (total_ms - latency_ms) / trace.ring_max_factor(links)


def _allreduce_tail(cost: StageCost, split: bool, trace: BandwidthTrace | None) -> float:
    """The least time a stage's all-reduce runs past its last backward. Unbucketed: its fastest ring time. Bucketed
    (sim.engine.simulator.bucket_spans): bucket k is ready (1 - f_k) x the last task (B; none for a split W) before
    that task ends and the buckets from k on run one after another, so the tail is at least the largest over k of
    their fastest times summed less that lead (the last bucket, f = 1, keeps it positive)."""
    if not cost.allreduce_buckets:
        return _fastest_ring(cost.allreduce_ms, cost.allreduce_latency_ms, cost.allreduce_ring, trace)
    task = 0.0 if split else cost.bwd_ms  # a split stage's buckets all start at its W's end (simulator)
    tail = 0.0
    after = 0.0  # the fastest times of the buckets from k on
    for bucket in reversed(cost.allreduce_buckets):
        after += _fastest_ring(bucket.allreduce_ms, bucket.latency_ms, cost.allreduce_ring, trace)
        tail = max(tail, after - (1.0 - bucket.ready_fraction) * task)
    return tail


def _fastest_exchanges(costs: Costs, trace: BandwidthTrace) -> list[float]:
    """stage_exchange_ms with each exchange at its ring's fastest rate under `trace` (_fastest_ring)."""
    out = [0.0] * len(costs.stages)
    for x in costs.shared:
        fastest = _fastest_ring(x.exchange_ms, x.latency_ms, x.ring, trace)
        for s in x.stages:
            out[s] = max(out[s], fastest)
    return out


def _unqueued(flows: tuple[Flow, ...], trace: BandwidthTrace | None) -> float:
    """A transfer's duration with every resource free, at the link's fastest rate under `trace`."""
    longest = 0.0
    for flow in flows:
        speedup = trace.max_factor(flow.link) if trace is not None else 1.0
        longest = max(longest, flow.latency_ms + flow.work_ms / speedup)
    return longest
