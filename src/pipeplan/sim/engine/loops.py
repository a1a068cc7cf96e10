"""The two event loops: dataflow order (each resource fed by one rank) and global time order (shared resources).

Both compute, for every action, start = max(its rank free, its input
delivered) and end = start + duration, and time each transfer at its
producer's end with first-come first-served resources. They differ only in
the order they visit actions, and give identical results whenever each
resource is requested by a single rank (tests check this).
"""

from __future__ import annotations

import math
from functools import partial
from heapq import heappop, heappush
from itertools import compress, repeat
from operator import add, itemgetter, le, ne

from pipeplan.sim.engine.program import NO_SLOT, Program
from pipeplan.sim.engine.transfers import NO_TRANSFER, PlainFlow, TransferTable
from pipeplan.sim.result import ComputeSpan, TransferSpan

INF = math.inf


class Outcome:
    """What a loop leaves: positions reached, last backward end per stage, and raw per-rank times.

    `starts[r][i]`, `ends[r][i]` belong to rank r's i-th action; `sent[r][j]`,
    `delivered[r][j]` to its j-th action that has a boundary transfer (sent is
    inf where the two stages share the rank). Plain float lists cost little
    to fill, so the loops always keep them; `timeline` turns them into spans.
    """

    __slots__ = ("backward_end", "delivered", "ends", "free", "pos", "sent", "starts")

    def __init__(self, ranks: int, stages: int) -> None:
        self.pos = [0] * ranks
        self.free = [0.0] * ranks
        self.backward_end = [-1.0] * stages
        self.starts: list[list[float]] = [[] for _ in range(ranks)]
        self.ends: list[list[float]] = [[] for _ in range(ranks)]
        self.sent: list[list[float]] = [[] for _ in range(ranks)]
        self.delivered: list[list[float]] = [[] for _ in range(ranks)]


def run_dataflow(program: Program, durations: list[float], table: TransferTable, times: bool = True) -> Outcome:
    """Run each rank as far as its inputs allow, resuming a blocked rank when its input arrives.

    Both loops time a transfer of one flow on one resource inline (`table.fast_resource`), one of several flows or
    resources without a trace by plain_run, and the rest by `table.run`; with `times` off they leave the Outcome's
    per-action times empty (only a timeline reads them).

    Note: valid when every resource has one requesting rank (`table.single_producer`):
    a rank's actions finish in time order, so the requests on its resources
    arrive in time order too, and first-come first-served needs no global clock.
    Each action is visited once; there is no heap.
    """
    code = program.code
    stages = program.num_stages
    ranks = len(code)
    result = Outcome(ranks, stages)
    pos, free, backward_end = result.pos, result.free, result.backward_end
    ready = ready_table(program)
    waiting = [NO_SLOT] * ranks
    fast_resource, fast_ms, resource_free, general = table.fast_resource, table.fast_ms, table.free, table.run
    plain = table.plain_flows()
    runnable = list(range(ranks - 1, -1, -1))
    lists = zip(result.starts, result.ends, result.sent, result.delivered, strict=True)
    adders = [(s.append, e.append, x.append, d.append) for s, e, x, d in lists]
    while runnable:
        rank = runnable.pop()
        rank_code = code[rank]
        n = len(rank_code)
        i = pos[rank]
        rank_free = free[rank]
        add_start, add_end, add_sent, add_delivered = adders[rank]
        while i < n:
            column, dep, out, boundary, consumer, extra, _, _, _ = rank_code[i]
            start = ready[dep]
            if start == INF:
                waiting[rank] = dep
                break
            if start < rank_free:
                start = rank_free
            end = start + durations[column]
            if times:
                add_start(start)
                add_end(end)
            if out != NO_SLOT:
                if boundary < 0:
                    delivered = end
                else:
                    rid = fast_resource[boundary]
                    if rid >= 0:
                        sent = resource_free[rid]
                        if sent < end:
                            sent = end
                        delivered = sent + fast_ms[boundary]
                        resource_free[rid] = delivered
                    elif rid == NO_TRANSFER:
                        sent = INF
                        delivered = end
                    else:
                        flows = plain[boundary]
                        if flows is None:
                            sent, delivered = general(boundary, end)
                        else:
                            sent, delivered = plain_run(flows, end, resource_free)
                    if times:
                        add_sent(sent)
                        add_delivered(delivered)
                ready[out] = delivered
                if waiting[consumer] == out:
                    waiting[consumer] = NO_SLOT
                    runnable.append(consumer)
            if extra:
                if extra > 0:
                    ready[extra - 1] = end
                else:
                    backward_end[-extra - 1] = end
            rank_free = end
            i += 1
        pos[rank] = i
        free[rank] = rank_free
    return result


def run_events(program: Program, durations: list[float], table: TransferTable, times: bool = True) -> Outcome:
    """Visit compute completions in global time order (a heap of (end, sequence, rank)).

    Note: a transfer's end is known the moment its producer finishes, because
    flows are served first-come first-served in request order and the heap
    pops completions in time order (ties by push order). So the consumer's
    start = max(its rank free, delivery) is fixed then, and one heap event per
    compute action suffices. An action is pushed when its rank is free and its input known ("begin", written out
    at its two places: a call per action cost a third of the loop).
    """
    code = program.code
    stages = program.num_stages
    ranks = len(code)
    result = Outcome(ranks, stages)
    pos, free, backward_end = result.pos, result.free, result.backward_end
    ready = ready_table(program)
    waiting = [NO_SLOT] * ranks
    began = [0.0] * ranks
    fast_resource, fast_ms, resource_free, general = table.fast_resource, table.fast_ms, table.free, table.run
    plain = table.plain_flows()
    lengths = [len(rank_code) for rank_code in code]
    lists = zip(result.starts, result.ends, result.sent, result.delivered, strict=True)
    adders = [(s.append, e.append, x.append, d.append) for s, e, x, d in lists]
    heap: list[tuple[float, int, int]] = []
    seq = 0
    for rank in range(ranks):
        if lengths[rank]:  # begin(rank, 0.0)
            column, dep = code[rank][0][:2]
            t = ready[dep]
            if t == INF:
                waiting[rank] = dep
                continue
            if t < 0.0:
                t = 0.0
            began[rank] = t
            heappush(heap, (t + durations[column], seq, rank))
            seq += 1
    while heap:
        end, _, rank = heappop(heap)
        i = pos[rank]
        rank_code = code[rank]
        _, _, out, boundary, consumer, extra, _, _, _ = rank_code[i]
        if times:
            add_start, add_end, add_sent, add_delivered = adders[rank]
            add_start(began[rank])
            add_end(end)
        if out != NO_SLOT:
            if boundary < 0:
                delivered = end
            else:
                rid = fast_resource[boundary]
                if rid >= 0:
                    sent = resource_free[rid]
                    if sent < end:
                        sent = end
                    delivered = sent + fast_ms[boundary]
                    resource_free[rid] = delivered
                elif rid == NO_TRANSFER:
                    sent = INF
                    delivered = end
                else:
                    flows = plain[boundary]
                    if flows is None:
                        sent, delivered = general(boundary, end)
                    else:
                        sent, delivered = plain_run(flows, end, resource_free)
                if times:
                    add_sent(sent)
                    add_delivered(delivered)
            ready[out] = delivered
            if waiting[consumer] == out:  # begin(consumer, free[consumer])
                t = delivered
                if t != INF:
                    waiting[consumer] = NO_SLOT
                    if t < free[consumer]:
                        t = free[consumer]
                    began[consumer] = t
                    heappush(heap, (t + durations[code[consumer][pos[consumer]][0]], seq, consumer))
                    seq += 1
        if extra:
            if extra > 0:
                ready[extra - 1] = end
            else:
                backward_end[-extra - 1] = end
        free[rank] = end
        i += 1
        pos[rank] = i
        if i < lengths[rank]:  # begin(rank, end)
            column, dep = rank_code[i][:2]
            t = ready[dep]
            if t == INF:
                waiting[rank] = dep
                continue
            if t < end:
                t = end
            began[rank] = t
            heappush(heap, (t + durations[column], seq, rank))
            seq += 1
    return result


def plain_run(flows: tuple[PlainFlow, ...], request: float, resource_free: list[float]) -> tuple[float, float]:
    """TransferTable.run of flows without a trace, nothing logged: (first flow start, last flow end)."""
    sent = INF
    delivered = request
    for rids, latency, work in flows:
        start = request
        for r in rids:
            if resource_free[r] > start:
                start = resource_free[r]
        finish = start + latency + work
        for r in rids:
            resource_free[r] = finish
        if start < sent:
            sent = start
        if finish > delivered:
            delivered = finish
    return sent, delivered


def ready_table(program: Program) -> list[float]:
    """When each slot's action may start: unknown (inf) except stage 0's F (0.0) and the ALWAYS_READY cell."""
    stages = program.num_stages
    ready = [INF] * (3 * stages * program.num_microbatches) + [0.0]
    ready[0 : 3 * stages * program.num_microbatches : 3 * stages] = [0.0] * program.num_microbatches
    return ready


_DIRECTION = {"F": 1, "B": -1, "I": -1}
_KIND = {"F": "act", "B": "grad", "I": "grad"}


def timeline(program: Program, outcome: Outcome) -> tuple[tuple[ComputeSpan, ...], tuple[TransferSpan, ...]]:
    """The compute and transfer spans of a run, rank by rank in each rank's order.

    Note: built with iterator plumbing (zip/map over instruction columns), so
    no Python-level call runs per span; this halves the cost of building spans
    inside the loop, and lets record=False skip it entirely.
    """
    new_compute = partial(tuple.__new__, ComputeSpan)
    new_transfer = partial(tuple.__new__, TransferSpan)
    stage_of, op_of, mb_of, boundary_of, consumer_of = itemgetter(6), itemgetter(7), itemgetter(8), itemgetter(3), itemgetter(4)
    compute: list[ComputeSpan] = []
    moved: list[TransferSpan] = []
    for rank, code in enumerate(program.code):
        starts = outcome.starts[rank]
        done = code[: len(starts)]
        columns = (map(stage_of, done), map(op_of, done), map(mb_of, done), starts, outcome.ends[rank])
        compute.extend(map(new_compute, zip(repeat(rank), *columns)))
        sent = outcome.sent[rank]
        producers = list(compress(done, map(le, repeat(0), map(boundary_of, done))))
        ops = list(map(op_of, producers))
        stages = list(map(stage_of, producers))
        columns = (
            map(consumer_of, producers),
            stages,
            map(add, stages, map(_DIRECTION.__getitem__, ops)),
            map(_KIND.__getitem__, ops),
            map(mb_of, producers),
            sent,
            outcome.delivered[rank],
        )
        spans = map(new_transfer, zip(repeat(rank), *columns))
        moved.extend(compress(spans, map(ne, sent, repeat(INF))) if INF in sent else spans)
    return tuple(compute), tuple(moved)
