"""The discrete-event simulator: one heap event per compute action, transfers timed first-come first-served."""

from __future__ import annotations

import math
from collections import OrderedDict
from heapq import heappop, heappush

from pipeplan.core.errors import CostError, DeadlockError
from pipeplan.core.schedule import Schedule
from pipeplan.core.validate import waiting_grid
from pipeplan.sim.bounds import bound_from_parts
from pipeplan.sim.costs import Costs
from pipeplan.sim.program import ALWAYS_READY, NO_SLOT, Program, compile_schedule, peak_saved_bytes
from pipeplan.sim.result import ComputeSpan, RankStats, SimResult, TransferSpan
from pipeplan.sim.trace import BandwidthTrace, finish_time

INF = math.inf
_NO_TRANSFER = -1
_GENERAL = -2

_PROGRAMS: OrderedDict[int, Program] = OrderedDict()
_PROGRAM_CACHE_SIZE = 4


def program_for(schedule: Schedule) -> Program:
    """The compiled form of `schedule`, reused while the same object is simulated again (planner searches)."""
    key = id(schedule)
    program = _PROGRAMS.get(key)
    if program is not None and program.schedule is schedule:
        _PROGRAMS.move_to_end(key)
        return program
    program = compile_schedule(schedule)
    _PROGRAMS[key] = program  # holds the schedule, so its id cannot be reused while cached
    if len(_PROGRAMS) > _PROGRAM_CACHE_SIZE:
        _PROGRAMS.popitem(last=False)
    return program


class _Transfers:
    """Per boundary transfer: a fast form (one resource, no trace) or the general list of flows."""

    def __init__(self, costs: Costs, trace: BandwidthTrace | None) -> None:
        boundaries = costs.forward + costs.backward
        resource_ids: dict[str, int] = {}
        self.fast_resource: list[int] = []
        self.fast_ms: list[float] = []
        self.general: list[list[tuple[tuple[int, ...], tuple[tuple[float, ...], tuple[float, ...]] | None, float, float]]] = []
        for flows in boundaries:
            compiled = []
            for flow in flows:
                rids = tuple(resource_ids.setdefault(name, len(resource_ids)) for name in flow.resources)
                segments = trace.segments(flow.link) if trace is not None and trace.affects(flow.link) else None
                compiled.append((rids, segments, flow.latency_ms, flow.work_ms))
            self.general.append(compiled)
            if not compiled:
                self.fast_resource.append(_NO_TRANSFER)
                self.fast_ms.append(0.0)
            elif len(compiled) == 1 and len(compiled[0][0]) == 1 and compiled[0][1] is None:
                self.fast_resource.append(compiled[0][0][0])
                self.fast_ms.append(compiled[0][2] + compiled[0][3])
            else:
                self.fast_resource.append(_GENERAL)
                self.fast_ms.append(0.0)
        self.free = [0.0] * len(resource_ids)

    def run(self, boundary: int, request: float) -> tuple[float, float]:
        """Queue every flow of `boundary` at time `request`; return (first flow start, last flow end)."""
        free = self.free
        first = INF
        last = request
        for rids, segments, latency, work in self.general[boundary]:
            start = request
            for rid in rids:
                if free[rid] > start:
                    start = free[rid]
            end = start + latency + work if segments is None else finish_time(*segments, start + latency, work)
            for rid in rids:
                free[rid] = end
            first = min(first, start)
            last = max(last, end)
        return first, last


def simulate(schedule: Schedule, costs: Costs, trace: BandwidthTrace | None = None, record: bool = True) -> SimResult:
    """Simulate one iteration of `schedule` under `costs` (and a bandwidth `trace`).

    Each rank runs its actions in order; an action starts when the rank is free
    and its input is delivered (ARCHITECTURE.md, "Cost model (sim)").

    Args:
        schedule: per-rank action lists (assumed to pass `validate`; a missing
            producer shows up as a deadlock).
        costs: per-stage compute and memory, per-boundary flows.
        trace: bandwidth multipliers over time per link.
        record: build the timeline (`compute`, `transfers`); False leaves them empty, for speed.

    Raises:
        CostError: costs cover a different number of stages than the schedule.
        ScheduleError: an action on a rank that does not hold its stage.
        DeadlockError: the schedule cannot finish; the message holds each rank's blocked action.
    """
    if len(costs.stages) != schedule.num_stages:
        raise CostError(
            f"costs cover {len(costs.stages)} stages but schedule {schedule.name!r} has {schedule.num_stages} stages"
        )
    program = program_for(schedule)
    durations: list[float] = []
    for c in costs.stages:
        durations += [c.fwd_ms, c.bwd_ms, c.bwd_input_ms, c.bwd_weight_ms, c.optimizer_ms]  # type: ignore[list-item]
    transfers = _Transfers(costs, trace)
    compute: list[ComputeSpan] = []
    moved: list[TransferSpan] = []
    backward_end = _run(program, durations, transfers, compute if record else None, moved if record else None)

    stage_tail = [
        c.allreduce_ms + (0.0 if s in program.stages_with_u else c.optimizer_ms) for s, c in enumerate(costs.stages)
    ]
    iteration = backward_end[-1]
    for s, tail in enumerate(stage_tail):
        if backward_end[s] >= 0:
            iteration = max(iteration, backward_end[s] + tail)
    busy = [sum(durations[col] * n for col, n in cols.items()) for cols in program.columns]
    saved = tuple(c.saved_bytes for c in costs.stages)
    per_rank = []
    for rank, rank_busy in enumerate(busy):
        static = sum(costs.stages[s].static_bytes for s in schedule.stages_of(rank))
        memory = static + peak_saved_bytes(program, rank, saved)
        per_rank.append(RankStats(rank_busy, iteration - rank_busy, program.peak_inflight[rank], memory))
    ranks = schedule.num_ranks
    bubble = 1.0 - sum(busy) / (ranks * iteration) if iteration > 0 else 0.0
    lower = bound_from_parts(schedule, costs, busy, program.split_stages, program.stages_with_u, trace)
    return SimResult(
        iteration,
        lower,
        bubble,
        tuple(per_rank),
        program.stage_peak_inflight,
        tuple(compute),
        tuple(moved),
        schedule.name,
    )


def _run(
    program: Program,
    durations: list[float],
    transfers: _Transfers,
    compute: list[ComputeSpan] | None,
    moved: list[TransferSpan] | None,
) -> list[float]:
    """The event loop. Returns per stage the end of its last backward (-1 if none), then the last compute end.

    Note: a transfer's end is known the moment its producer finishes, because
    flows are served first-come first-served in request order and the heap
    pops completions in time order (ties by push order). So the consumer's start
    = max(its rank free, delivery) is fixed then, and one heap event per
    compute action suffices.
    """
    code = program.code
    stages = program.num_stages
    ranks = len(code)
    ready = [INF] * (3 * stages * program.num_microbatches) + [0.0]
    assert ready[ALWAYS_READY] == 0.0
    pos = [0] * ranks
    free = [0.0] * ranks
    began = [0.0] * ranks
    waiting = [NO_SLOT] * ranks
    backward_end = [-1.0] * (stages + 1)
    fast_resource = transfers.fast_resource
    fast_ms = transfers.fast_ms
    resource_free = transfers.free
    general = transfers.run
    heap: list[tuple[float, int, int]] = []
    seq = 0
    record = compute is not None

    for rank in range(ranks):
        if code[rank]:
            dep = code[rank][0][1]
            t = ready[dep]
            if t == INF:
                waiting[rank] = dep
            else:
                began[rank] = t
                heappush(heap, (t + durations[code[rank][0][0]], seq, rank))
                seq += 1

    while heap:
        end, _, rank = heappop(heap)
        rank_code = code[rank]
        i = pos[rank]
        _, _, out, boundary, consumer, own, last_backward, action = rank_code[i]
        if record:
            compute.append(ComputeSpan(rank, action.stage, action.op, action.microbatch, began[rank], end))  # type: ignore[union-attr]
        if out != NO_SLOT:
            if boundary < 0:
                delivered = end
            else:
                rid = fast_resource[boundary]
                if rid >= 0:
                    start = resource_free[rid]
                    if start < end:
                        start = end
                    delivered = start + fast_ms[boundary]
                    resource_free[rid] = delivered
                elif rid == _NO_TRANSFER:
                    start = INF
                    delivered = end
                else:
                    start, delivered = general(boundary, end)
                if record and start != INF:
                    forward = boundary < stages - 1
                    s = action.stage
                    moved.append(  # type: ignore[union-attr]
                        TransferSpan(
                            rank,
                            consumer,
                            s,
                            s + 1 if forward else s - 1,
                            "act" if forward else "grad",
                            action.microbatch,
                            start,
                            delivered,
                        )
                    )
            ready[out] = delivered
            if waiting[consumer] == out:
                waiting[consumer] = NO_SLOT
                start = free[consumer]
                if start < delivered:
                    start = delivered
                began[consumer] = start
                heappush(heap, (start + durations[code[consumer][pos[consumer]][0]], seq, consumer))
                seq += 1
        if own != NO_SLOT:
            ready[own] = end
        if last_backward >= 0:
            backward_end[last_backward] = end
        free[rank] = end
        i += 1
        pos[rank] = i
        if i < len(rank_code):
            nxt = rank_code[i]
            t = ready[nxt[1]]
            if t == INF:
                waiting[rank] = nxt[1]
            else:
                if t < end:
                    t = end
                began[rank] = t
                heappush(heap, (t + durations[nxt[0]], seq, rank))
                seq += 1

    stuck = [r for r in range(ranks) if pos[r] < len(code[r])]
    if stuck:
        schedule = program.schedule
        done = {(a.stage, a.op, a.microbatch) for r in range(ranks) for a in schedule.ranks[r][: pos[r]]}
        grid = waiting_grid(schedule, pos, done)
        raise DeadlockError(f"schedule {schedule.name!r} cannot finish: ranks {stuck} wait forever; blocked ranks:\n{grid}")
    backward_end[stages] = max(free, default=0.0)
    return backward_end
