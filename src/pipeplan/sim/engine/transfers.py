"""Stage-boundary transfers as the event loops see them: resources served first-come first-served."""

from __future__ import annotations

import copy
import math
from collections import OrderedDict

from pipeplan.core.hardware.bandwidth_trace import BandwidthTrace, finish_time
from pipeplan.sim.cost.types import Costs

NO_TRANSFER = -1
"""`fast_resource` of a boundary whose stages share a rank (nothing moves)."""

GENERAL = -2
"""`fast_resource` of a boundary that needs `TransferTable.run` (several flows or resources, or a trace)."""

CompiledFlow = tuple[tuple[int, ...], tuple[tuple[float, ...], tuple[float, ...]] | None, float, float]
"""(resource ids, trace segments of its link or None, latency ms, work ms)."""

PlainFlow = tuple[tuple[int, ...], float, float]
"""(resource ids, latency ms, work ms) of a flow no trace step touches."""


class TransferTable:
    """Per boundary transfer (activations 0..S-2, then gradients S-1..2S-3): a fast form or the list of flows.

    The one first-come first-served queue of transfers on shared resources: the
    simulator's loops and the planner's list scheduling both deliver through it.

    The fast form is one flow on one resource whose link no trace step touches:
    `fast_resource` is that resource's id and `fast_ms` its duration. `free`
    holds each resource's free time; `single_producer` is True when every
    resource is only ever requested by one rank, so that rank's own order is
    the resource's request order. `flow_log`, when set to a list, receives
    (transfer, flow index, start, end) of every flow `run` times (the fast form
    is not logged: its one flow's times are the transfer's). `offset_ms` is where time 0 of the iteration
    lies on the trace's clock (an iteration that starts later in a run sees the trace from there).
    `plain[b]` is a GENERAL transfer's flows as PlainFlows when no trace touches any of them (else None): what the
    event loops time inline, as `run` would, while nothing is logged (`plain_flows`).
    """

    def __init__(
        self, stage_to_rank: tuple[int, ...], costs: Costs, trace: BandwidthTrace | None, offset_ms: float = 0.0
    ) -> None:
        s2r = stage_to_rank
        boundaries = costs.forward + costs.backward
        last = len(costs.forward)
        resource_ids: dict[str, int] = {}
        producers: dict[int, set[int]] = {}
        self.fast_resource: list[int] = []
        self.fast_ms: list[float] = []
        self.flows: list[list[CompiledFlow]] = []
        self.plain: list[tuple[PlainFlow, ...] | None] = []
        for b, flows in enumerate(boundaries):
            producer = s2r[b] if b < last else s2r[b - last + 1]
            compiled: list[CompiledFlow] = []
            for flow in flows:
                rids = tuple(resource_ids.setdefault(name, len(resource_ids)) for name in flow.resources)
                for rid in rids:
                    producers.setdefault(rid, set()).add(producer)
                segments = trace.segments(flow.link) if trace is not None and trace.affects(flow.link) else None
                compiled.append((rids, segments, flow.latency_ms, flow.work_ms))
            self.flows.append(compiled)
            if not compiled:
                self.fast_resource.append(NO_TRANSFER)
                self.fast_ms.append(0.0)
            elif len(compiled) == 1 and len(compiled[0][0]) == 1 and compiled[0][1] is None:
                self.fast_resource.append(compiled[0][0][0])
                self.fast_ms.append(compiled[0][2] + compiled[0][3])
            else:
                self.fast_resource.append(GENERAL)
                self.fast_ms.append(0.0)
            untraced = all(segments is None for _, segments, _, _ in compiled)
            plain = tuple((rids, latency, work) for rids, _, latency, work in compiled)
            self.plain.append(plain if untraced and self.fast_resource[-1] == GENERAL else None)
        self.free = [0.0] * len(resource_ids)
        self.offset_ms = offset_ms
        self.flow_log: list[tuple[int, int, float, float]] | None = None  # set to a list to log (transfer, flow, start, end)
        self.single_producer = all(len(ranks) == 1 for ranks in producers.values())

    def plain_flows(self) -> list[tuple[PlainFlow, ...] | None]:
        """`plain`, or all None while `flow_log` is set (`run` logs every flow it times)."""
        return self.plain if self.flow_log is None else [None] * len(self.plain)

    def gradient(self, boundary: int) -> int:
        """The transfer index of the gradient crossing `boundary` (from stage boundary+1 back to stage boundary)."""
        return len(self.flows) // 2 + boundary

    def run(self, boundary: int, request: float) -> tuple[float, float]:
        """Queue every flow of `boundary` at time `request`; return (first flow start, last flow end).

        A flow starts when all its resources are free, holds them all until it
        ends, and takes latency + work, the work stretched by its link's trace.
        """
        free = self.free
        offset = self.offset_ms
        log = self.flow_log
        first = math.inf
        last = request
        for index, (rids, segments, latency, work) in enumerate(self.flows[boundary]):
            start = request
            for rid in rids:
                if free[rid] > start:
                    start = free[rid]
            if segments is None:
                end = start + latency + work
            elif offset:
                end = finish_time(*segments, offset + start + latency, work) - offset
            else:
                end = finish_time(*segments, start + latency, work)
            for rid in rids:
                free[rid] = end
            if log is not None:
                log.append((boundary, index, start, end))
            first = min(first, start)
            last = max(last, end)
        return first, last


_TABLES: OrderedDict[tuple[int, tuple[int, ...]], tuple[Costs, TransferTable]] = OrderedDict()
TABLE_CACHE_SIZE = 8
"""Compiled transfer tables remembered by fresh_table: a planner simulates one stage costs under dozens of schedules
(kfkb's k, gpipe, 1f1b, zb-h1) in a row."""


def fresh_table(
    stage_to_rank: tuple[int, ...], costs: Costs, trace: BandwidthTrace | None, offset_ms: float = 0.0
) -> TransferTable:
    """TransferTable(stage_to_rank, costs, trace, offset_ms) with every resource free and no log; without a trace, a
    copy of the one compiled for the same `costs` object and stage placement when it is among the last
    TABLE_CACHE_SIZE (its flow lists are shared, never changed; `free` is its own)."""
    if trace is not None:
        return TransferTable(stage_to_rank, costs, trace, offset_ms)
    key = (id(costs), stage_to_rank)
    hit = _TABLES.get(key)
    if hit is None or hit[0] is not costs:
        hit = (costs, TransferTable(stage_to_rank, costs, None))  # held: the id stays this costs' while cached
        _TABLES[key] = hit
        if len(_TABLES) > TABLE_CACHE_SIZE:
            _TABLES.popitem(last=False)
    else:
        _TABLES.move_to_end(key)
    table = copy.copy(hit[1])
    table.free = [0.0] * len(table.free)
    table.offset_ms = offset_ms
    return table
