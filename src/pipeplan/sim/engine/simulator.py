"""simulate(): a schedule and its costs in, iteration time, memory, lower bound and timeline out."""

from __future__ import annotations

import gc
from collections.abc import Callable

from pipeplan.core.errors import CostError, DeadlockError
from pipeplan.core.hardware.bandwidth_trace import BandwidthTrace, finish_time
from pipeplan.core.schedule import Schedule
from pipeplan.core.validate import waiting_grid
from pipeplan.sim.cost.types import Costs, StageCost, ring_links
from pipeplan.sim.engine.loops import Outcome, run_dataflow, run_events, timeline
from pipeplan.sim.engine.lower_bound import bound_from_parts, rank_optimizer_ms
from pipeplan.sim.engine.program import Program, peak_saved_bytes, program_for
from pipeplan.sim.engine.transfers import TransferTable, fresh_table
from pipeplan.sim.result import CollectiveSpan, ExchangeSpan, FlowSpan, RankStats, SimResult


def simulate(
    schedule: Schedule,
    costs: Costs,
    trace: BandwidthTrace | None = None,
    record: bool = True,
    offset_ms: float = 0.0,
    program: Program | None = None,
) -> SimResult:
    """Simulate one iteration of `schedule` under `costs` (and a bandwidth `trace`).

    Each rank runs its actions in order; an action starts when the rank is free
    and its input is delivered (ARCHITECTURE.md, "Cost model (sim)").

    Args:
        schedule: per-rank action lists (assumed to pass `validate`; a missing
            producer shows up as a deadlock).
        costs: per-stage compute and memory, per-boundary flows.
        trace: bandwidth multipliers over time per link.
        record: build the timeline (`compute`, `transfers`, `flows`); False leaves them empty, for speed.
        offset_ms: where the iteration starts on the trace's clock (a later iteration of a run); every time in
            the result stays relative to the iteration's start.
        program: `schedule` compiled (sim.engine.program.compile_schedule) by a caller that simulates it many times
            (the adaptive controller); None compiles it here (program_for remembers the most recently used).

    Raises:
        CostError: costs cover a different number of stages than the schedule.
        ScheduleError: an action on a rank that does not hold its stage.
        DeadlockError: the schedule cannot finish; the message holds each rank's blocked action.

    Note: the cyclic garbage collector is paused during the call. Everything
    allocated here is acyclic tuples (instructions, timeline spans); the
    collector's repeated passes over them while they pile up cost as much as
    the simulation itself, whereas one pass after the call untracks them.
    """
    return _without_gc(schedule, costs, trace, record, run_dataflow, offset_ms, program)


def simulate_in_time_order(
    schedule: Schedule, costs: Costs, trace: BandwidthTrace | None = None, record: bool = True, offset_ms: float = 0.0
) -> SimResult:
    """`simulate` forced onto the global-time-order loop (the general one), to cross-check the dataflow loop."""
    return _without_gc(schedule, costs, trace, record, run_events, offset_ms, None)


def _without_gc(
    schedule: Schedule,
    costs: Costs,
    trace: BandwidthTrace | None,
    record: bool,
    preferred: Callable[..., Outcome],
    offset_ms: float,
    program: Program | None,
) -> SimResult:
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _simulate(schedule, costs, trace, record, preferred, offset_ms, program)
    finally:
        if collecting:
            gc.enable()


def iteration_time(schedule: Schedule, costs: Costs, program: Program | None = None) -> float:
    """`simulate(schedule, costs, record=False, program=program).iteration_time` without the rest of the result
    (memory, busy and idle times, the lower bound): what a planner ranks by and the adaptive controller predicts
    with. The same run and tails as simulate, so the same float.

    Raises:
        as simulate.
    """
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _run(schedule, costs, None, False, run_dataflow, 0.0, program).iteration
    finally:
        if collecting:
            gc.enable()


class _Run:
    """What the event loop and the tails after it leave: the compiled program, the transfer table, the loop's
    outcome, the collectives' and exchanges' spans, each rank's optimizer step and the iteration's end."""

    __slots__ = ("collectives", "durations", "exchanges", "iteration", "optimizer", "outcome", "program", "table")

    def __init__(
        self,
        program: Program,
        durations: list[float],
        table: TransferTable,
        outcome: Outcome,
        collectives: list[CollectiveSpan],
        exchanges: tuple[ExchangeSpan, ...],
        optimizer: list[float],
        iteration: float,
    ) -> None:
        self.program = program
        self.durations = durations
        self.table = table
        self.outcome = outcome
        self.collectives = collectives
        self.exchanges = exchanges
        self.optimizer = optimizer
        self.iteration = iteration


def _run(
    schedule: Schedule,
    costs: Costs,
    trace: BandwidthTrace | None,
    record: bool,
    preferred: Callable[..., Outcome],
    offset_ms: float,
    program: Program | None,
) -> _Run:
    if len(costs.stages) != schedule.num_stages:
        raise CostError(f"costs cover {len(costs.stages)} stages but schedule {schedule.name!r} has {schedule.num_stages} stages")
    if program is None or program.schedule is not schedule:
        program = program_for(schedule)
    durations: list[float] = []
    for c in costs.stages:
        durations += [c.fwd_ms, c.bwd_ms, c.bwd_input_ms, c.bwd_weight_ms, c.optimizer_ms]  # type: ignore[list-item]
    table = fresh_table(schedule.stage_to_rank, costs, trace, offset_ms)
    if record:
        table.flow_log = []
    run = preferred if table.single_producer else run_events
    outcome = run(program, durations, table, record)
    stuck = [r for r, code in enumerate(program.code) if outcome.pos[r] < len(code)]
    if stuck:
        grid = waiting_grid(schedule, outcome.pos)
        raise DeadlockError(f"schedule {schedule.name!r} cannot finish: ranks {stuck} wait forever; blocked ranks:\n{grid}")

    # a rank steps its optimizer once, after its last action and the all-reduces of all its stages (the runtime's
    # order); asynchronous schedules step inside the schedule instead (U actions)
    ready = list(outcome.free)
    collectives = []
    for s, c in enumerate(costs.stages):
        start = outcome.backward_end[s]
        if start >= 0:
            rank = schedule.stage_to_rank[s]
            if c.allreduce_buckets:
                last_task_ms = _last_backward_ms(c, s in program.split_stages)
                spans = bucket_spans(s, c, start, last_task_ms, trace, offset_ms)
                collectives += spans
                ready[rank] = max(ready[rank], spans[-1].end_ms)
                continue
            end = ring_end(start, c.allreduce_ms, c.allreduce_latency_ms, c.allreduce_ring, trace, offset_ms)
            ready[rank] = max(ready[rank], end)
            if c.allreduce_ms > 0:
                collectives.append(CollectiveSpan(s, start, end))
    exchanges = shared_spans(costs, outcome.backward_end, trace, offset_ms)
    for span in exchanges:  # a shared parameter's copies are summed before the ranks holding them step
        for s in span.stages:
            rank = schedule.stage_to_rank[s]
            ready[rank] = max(ready[rank], span.end_ms)
    optimizer = rank_optimizer_ms(schedule, costs, program.stages_with_u)
    iteration = max((ready[r] + optimizer[r] for r in range(len(ready))), default=0.0)
    return _Run(program, durations, table, outcome, collectives, exchanges, optimizer, iteration)


def _simulate(
    schedule: Schedule,
    costs: Costs,
    trace: BandwidthTrace | None,
    record: bool,
    preferred: Callable[..., Outcome],
    offset_ms: float,
    program: Program | None,
) -> SimResult:
    run = _run(schedule, costs, trace, record, preferred, offset_ms, program)
    program, durations, optimizer, iteration = run.program, run.durations, run.optimizer, run.iteration
    compute = [sum((durations[col] * n for col, n in cols.items()), 0.0) for cols in program.columns]
    # a rank's busy time is its actions and its optimizer step: both are work only it can do
    busy = [c + optimizer[r] for r, c in enumerate(compute)]
    saved = tuple(c.saved_bytes for c in costs.stages)
    per_rank = []
    for rank, rank_busy in enumerate(busy):
        static = sum(costs.stages[s].static_bytes for s in schedule.stages_of(rank))
        memory = static + peak_saved_bytes(program, rank, saved)
        per_rank.append(RankStats(rank_busy, iteration - rank_busy, program.peak_inflight[rank], memory))
    ranks = schedule.num_ranks
    bubble = max(0.0, 1.0 - sum(busy) / (ranks * iteration)) if iteration > 0 else 0.0  # no -0.0 from rounding
    lower = bound_from_parts(schedule, costs, compute, program.split_stages, program.stages_with_u, trace)
    return SimResult(
        iteration,
        lower,
        bubble,
        tuple(per_rank),
        program.stage_peak_inflight,
        *(timeline(program, run.outcome) if record else ((), ())),
        schedule.name,
        flow_spans(costs, run.table.flow_log) if record else (),
        run.exchanges,
        tuple(run.collectives),
    )


def ring_end(
    start_ms: float,
    total_ms: float,
    latency_ms: float,
    ring: tuple[int, ...],
    trace: BandwidthTrace | None,
    offset_ms: float,
) -> float:
    """When a ring all-reduce over `ring` (devices in ring order) that starts at `start_ms` ends: after its latency,
    its work (total - latency) at the factor of its slowest ring link at each moment (BandwidthTrace.ring_segments,
    on the trace's clock: offset_ms); start + total, the same float as without a trace, when no step changes its
    links."""
    segments = trace.ring_segments(ring_links(ring)) if trace is not None and len(ring) > 1 else None
    if segments is None:
        return start_ms + total_ms
    work = total_ms - latency_ms
    if offset_ms:
        return finish_time(*segments, offset_ms + start_ms + latency_ms, work) - offset_ms
    return finish_time(*segments, start_ms + latency_ms, work)


def _last_backward_ms(cost: StageCost, split: bool) -> float:
    """The part of a stage's last backward task its buckets' readiness is placed in: its B; 0 for a split stage's W,
    whose weight gradients are accumulated by hand (models.stage.StageModule.backward_weight), where no gradient
    hook sees them: its buckets all start at W's end (sim.cost.grad_buckets)."""
    return 0.0 if split else cost.bwd_ms


def bucket_spans(
    stage: int,
    cost: StageCost,
    backward_end_ms: float,
    last_task_ms: float,
    trace: BandwidthTrace | None,
    offset_ms: float,
) -> list[CollectiveSpan]:
    """The spans of a stage's bucketed all-reduce (StageCost.allreduce_buckets) whose last backward task of
    `last_task_ms` ends at `backward_end_ms`: bucket k starts at the later of its ready time (the task's start +
    its ready_fraction x the task) and the end of bucket k - 1, and runs as a ring all-reduce (ring_end)."""
    begin = backward_end_ms - last_task_ms
    previous = begin
    spans = []
    for bucket in cost.allreduce_buckets:
        start = max(begin + bucket.ready_fraction * last_task_ms, previous)
        previous = ring_end(start, bucket.allreduce_ms, bucket.latency_ms, cost.allreduce_ring, trace, offset_ms)
        spans.append(CollectiveSpan(stage, start, previous))
    return spans


def shared_spans(
    costs: Costs, backward_end: list[float], trace: BandwidthTrace | None = None, offset_ms: float = 0.0
) -> tuple[ExchangeSpan, ...]:
    """Each shared parameter's exchange in time: from the last backward of the stages holding a copy, for its
    all-reduce's time (sim.cost.shared; under `trace` stretched as a stage's all-reduce, ring_end); groups whose
    stages ran no backward (none in the schedule) are left out."""
    out = []
    for x in costs.shared:
        ends = [backward_end[s] for s in x.stages]
        if min(ends) >= 0:
            start = max(ends)
            end = ring_end(start, x.exchange_ms, x.latency_ms, x.ring, trace, offset_ms)
            out.append(ExchangeSpan(x.name, x.stages, start, end))
    return tuple(out)


def flow_spans(costs: Costs, log: list[tuple[int, int, float, float]] | None) -> tuple[FlowSpan, ...]:
    """The transfer table's flow log as FlowSpans (transfer index t < S-1: activation of boundary t, else gradient),
    in time order (start, end, then kind, boundary, link), whichever order the event loop timed them in."""
    boundaries = len(costs.forward)
    spans = []
    for transfer, index, start, end in log or ():
        if transfer < boundaries:
            spans.append(FlowSpan("act", transfer, costs.forward[transfer][index].link, start, end))
        else:
            b = transfer - boundaries
            spans.append(FlowSpan("grad", b, costs.backward[b][index].link, start, end))
    return tuple(sorted(spans, key=lambda f: (f.start_ms, f.end_ms, f.kind, f.boundary, f.link)))
