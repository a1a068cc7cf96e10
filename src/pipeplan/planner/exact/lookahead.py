"""exact's look-ahead: before any device tuple of a stage end is costed, the stage on no devices in particular
(StageCosts.anywhere: every cost from below) and LOOK stages after it must still be able to beat the best plan;
spans of stage ends are ruled out at once (the shortest stage's costs, the table's terms at the least over the
span), halved where they cannot be."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeplan.planner.exact.bounds import MARGIN, compute_bound, placed_bound
from pipeplan.planner.exact.filled import filled
from pipeplan.planner.exact.stages import Placed
from pipeplan.planner.exact.suffix import SLACK

if TYPE_CHECKING:
    from pipeplan.planner.exact.search import Search

LOOK = 4
"""Stages beyond a stage end that hopeless looks at with device-free stages before any device tuple is costed."""

FEW = 4
"""Spans of fewer stage ends open_ends checks end by end (on gnmt-32, 95 % of spans of 2-4 ends were not ruled out
as a whole)."""


def span_stage(
    search: Search,
    stages: list[Placed],
    start: int,
    ends: tuple[int, int],
    r: int,
    free: tuple[int, ...],
    k: int,
    shape: tuple[int, int, int],
) -> Placed | None:
    """The stage start..ends[0] on r * rp of `free`, no devices in particular (StageCosts.anywhere: every cost from
    below, and they grow with its layers), or None when no stage start..e, e in ends[0]..ends[1], can begin a
    plan that beats the best with k devices per pipeline for it and the stages after it: its own bounds, the
    table of `free` (its rings at least as fast as any subset's) and filled, their terms at the least over
    those ends."""
    rp, m, size = shape
    low, high = ends
    prev = stages[-1] if stages else None
    stage = search.costs.anywhere(start, low, free, r, rp, size, prev, search.rings_of(free))
    cap = search.best_time * (1 + MARGIN)  # its sums are another order than a placed stage's
    if compute_bound(stage, m) > cap or placed_bound(stage, prev, m) > cap:
        return None
    table = search.table(shape, free)
    left = k - r
    if search.beaten(stage.arrive + stage.fwd + float(table.rest[left][low + 1 : high + 2].min())):
        return None
    if filled(search, [*stages, stage], m, table, free[: left * rp], rp, size, hop=False, upto=high):
        return None
    return stage


def open_ends(
    search: Search,
    stages: list[Placed],
    start: int,
    ends: list[int],
    r: int,
    free: tuple[int, ...],
    k: int,
    shape: tuple[int, int, int],
) -> list[tuple[int, Placed]]:
    """The stage ends of `ends` (ascending, none the last layer) that span_stage does not rule out, each with its
    stage, halving each span it cannot rule out down to single ends (spans of fewer than FEW ends: end by end)."""
    out, todo = [], [(0, len(ends) - 1)]
    while todo:
        i, j = todo.pop()
        if 1 <= j - i < FEW:  # a short span is seldom ruled out as a whole: its ends one by one
            todo += [(e, e) for e in range(j, i - 1, -1)]
            continue
        stage = span_stage(search, stages, start, (ends[i], ends[j]), r, free, k, shape)
        if stage is None:
            continue
        if i == j:
            out.append((ends[i], stage))
            continue
        mid = (i + j) // 2
        todo += [(mid + 1, j), (i, mid)]
    return sorted(out, key=lambda pair: pair[0])


def hopeless(
    search: Search,
    stages: list[Placed],
    start: int,
    last: int,
    r: int,
    free: tuple[int, ...],
    k: int,
    shape: tuple[int, int, int],
    look: int = LOOK,
    stage: Placed | None = None,
) -> bool:
    """Whether no stage start..last on r * rp of the devices `free`, whichever they are, can begin a plan that
    beats the best, with k devices per pipeline for it and the stages after it: span_stage of that one
    end (its bounds are below each device tuple's; `stage`: its stage, when span_stage has already passed it);
    with `look`, also when every next stage the table leaves is hopeless after it (look - 1 stages further), or
    is the last and the plan's bounds pass the best."""
    if stage is None:
        stage = span_stage(search, stages, start, (last, last), r, free, k, shape)
        if stage is None:
            return True
    if look <= 0:
        return False
    rp, m, size = shape
    table, left, ready, placed = search.table(shape, free), k - r, stage.arrive + stage.fwd, [*stages, stage]
    layers = search.request.profile.num_layers
    for width in table.widths:
        if width > left:
            continue
        row = ready + table.stage_row(last + 1, left, width)
        ends = (row < search.best_time * (1 + SLACK)).nonzero()[0].tolist()
        if ends and ends[-1] == layers - 1:
            ends.pop()
            nxt = search.costs.anywhere(last + 1, layers - 1, free, width, rp, size, stage, search.rings_of(free))
            if not whole_beaten(search, [*placed, nxt], m):
                return False
        if left <= width or not ends:
            continue
        for end, nxt in open_ends(search, placed, last + 1, ends, width, free, left, shape):
            if not hopeless(search, placed, last + 1, end, width, free, left, shape, look - 1, nxt):
                return False
    return True


def whole_beaten(search: Search, stages: list[Placed], m: int) -> bool:
    """Whether a whole plan of these stages cannot beat the best under any schedule its memory allows."""
    return next(search.open_schedules(stages, m, search.best_time), None) is None
