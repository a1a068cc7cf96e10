"""exact's look-ahead: before any device tuple of a stage end is costed, the stage on no devices in particular
(StageCosts.anywhere: every cost from below) and LOOK stages after it must still be able to beat the best plan;
spans of stage ends are ruled out at once (the shortest stage's costs, the table's terms at the least over the
span), halved where they cannot be."""

from __future__ import annotations

from pipeplan.planner.bound.placed_bounds import MARGIN, Placed, compute_bound, placed_bound
from pipeplan.planner.bound.suffix_table import SLACK
from pipeplan.planner.exact.filled import filled, open_schedules
from pipeplan.planner.exact.search_tables import Tables

LOOK = 4
"""Stages beyond a stage end that hopeless looks at with device-free stages before any device tuple is costed."""

FEW = 4
"""Spans of fewer stage ends open_ends checks end by end (on gnmt-32, 95 % of spans of 2-4 ends were not ruled out
as a whole)."""


def span_stage(
    tables: Tables,
    best: float,
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
    plan that beats `best` with k devices per pipeline for it and the stages after it: its own bounds, the
    table of `free` (its rings at least as fast as any subset's) and filled, their terms at the least over
    those ends."""
    rp, m, size = shape
    low, high = ends
    prev = stages[-1] if stages else None
    stage = tables.costs.anywhere(start, low, free, r, rp, size, prev, tables.rings_of(free))
    cap = best * (1 + MARGIN)  # its sums are another order than a placed stage's
    if compute_bound(stage, m) > cap or placed_bound(stage, prev, m) > cap:
        return None
    table = tables.table(shape, free)
    left = k - r
    if stage.arrive + stage.fwd + float(table.rest[left][low + 1 : high + 2].min()) >= best * (1 + SLACK):
        return None  # BranchAndBound.beaten
    if filled(tables, best, [*stages, stage], m, table, free[: left * rp], rp, size, hop=False, upto=high):
        return None
    return stage


def open_ends(
    tables: Tables,
    best: float,
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
        stage = span_stage(tables, best, stages, start, (ends[i], ends[j]), r, free, k, shape)
        if stage is None:
            continue
        if i == j:
            out.append((ends[i], stage))
            continue
        mid = (i + j) // 2
        todo += [(mid + 1, j), (i, mid)]
    return sorted(out, key=lambda pair: pair[0])


def hopeless(
    tables: Tables,
    best: float,
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
        stage = span_stage(tables, best, stages, start, (last, last), r, free, k, shape)
        if stage is None:
            return True
    if look <= 0:
        return False
    rp, m, size = shape
    table, left, ready, placed = tables.table(shape, free), k - r, stage.arrive + stage.fwd, [*stages, stage]
    layers = tables.layers
    for width in table.widths:
        if width > left:
            continue
        row = ready + table.stage_row(last + 1, left, width)
        ends = (row < best * (1 + SLACK)).nonzero()[0].tolist()
        if ends and ends[-1] == layers - 1:
            ends.pop()
            nxt = tables.costs.anywhere(last + 1, layers - 1, free, width, rp, size, stage, tables.rings_of(free))
            if next(open_schedules(tables.schedules, [*placed, nxt], m, best), None) is not None:  # not beaten
                return False
        if left <= width or not ends:
            continue
        for end, nxt in open_ends(tables, best, placed, last + 1, ends, width, free, left, shape):
            if not hopeless(tables, best, placed, last + 1, end, width, free, left, shape, look - 1, nxt):
                return False
    return True
