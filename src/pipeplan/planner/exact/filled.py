"""exact's check of a partial plan: whether no completion of its first stages can beat the best plan, under any
schedule their memory allows and any count of stages to come (placed_bounds.fill_bound with the suffix table's
terms).

The look-ahead asks it ~300,000 times on a DGX-1 instance, and mostly again: the device-free stages after sibling
device tuples cost the same (93 % of fill_bound's calls on gnmt-32 repeated an earlier one). So it keeps what it
computed by what it reads (search_tables.Memos): its answers per best time, fill_bound's values, the fits, the table's terms.
"""

from __future__ import annotations

from collections.abc import Iterator

from pipeplan.planner.bound.placed_bounds import Placed, drain_counts, fill_bound, fill_parts, schedule_bound
from pipeplan.planner.bound.suffix_table import SLACK, SuffixBound
from pipeplan.planner.exact.search_tables import FILLS, Tables
from pipeplan.planner.exact.space import peak_inflight
from pipeplan.schedules.registry import TAKES_K, splits_backward

TIMES = 9
"""values: its first TIMES are what fill_parts reads, the rest what fits reads."""


def values(stage: Placed) -> tuple[float, ...]:
    """What fill_parts and fits read of a stage (its times, then its memory; not its layers or devices; its chain is
    read only of a stage below another)."""
    return (
        stage.arrive,
        stage.fwd,
        stage.bwd,
        stage.inp,
        stage.wgt,
        stage.allreduce,
        stage.fwd_in,
        stage.bwd_out,
        stage.chain,
        stage.static,
        stage.act,
        stage.memory,
    )


def fits(stages: list[Placed], name: str, p: int, m: int, k: int) -> bool:
    """Whether these first stages of a plan of p stages hold the microbatches the schedule keeps on each at once."""
    peaks = peak_inflight(name, p, m, k)
    return all(st.static + peaks[s] * st.act <= st.memory for s, st in enumerate(stages))


def filled(
    tables: Tables,
    best: float,
    stages: list[Placed],
    m: int,
    table: SuffixBound,
    left: tuple[int, ...],
    rp: int,
    size: int,
    hop: bool = True,
    upto: int | None = None,
) -> bool:
    """Whether no completion of these first stages on the devices `left` to p stages can beat `best` under any
    schedule their memory allows (placed_bounds.fill_bound). With q stages to come on n = len(left) // rp devices per
    pipeline, each takes at most n - q + 1 of them: the way up and back (the table's trip, Tables.hop) and the
    last stage's part (the table's top) take the widths up to that. With `upto`, for every last stage that ends
    at a layer from its own last to `upto` (its costs those of the shortest: lookahead.span_stage): the table's
    terms at the least over those ends (trip and top do not grow with the end). Without hop, the answer is kept."""
    last, n = stages[-1], len(left) // rp
    end = last.last if upto is None else upto
    top = values(last)
    read = (*(values(st) for st in stages[:-1]), (*top[: TIMES - 1], 0.0, *top[TIMES:]))  # not the top's chain
    if hop:
        return compute(tables, best, stages, read, m, table, left, rp, size, hop, end)
    memos = tables.memos
    if memos.best != best or len(memos.answers) > FILLS:
        memos.best, memos.answers = best, {}
    key = (read, m, table, n, last.last, end)
    got = memos.answers.get(key)
    if got is None:
        got = memos.answers[key] = compute(tables, best, stages, read, m, table, left, rp, size, hop, end)
    return got


def compute(
    tables: Tables,
    best: float,
    stages: list[Placed],
    read: tuple[tuple[float, ...], ...],
    m: int,
    table: SuffixBound,
    left: tuple[int, ...],
    rp: int,
    size: int,
    hop: bool,
    end: int,
) -> bool:
    """filled, computed (the last stage's layers to `end`; `read`: values of the stages), trying first the
    schedule that passed last (Memos.lead: the answer does not depend on the order, only its time)."""
    memos = tables.memos
    memos.forget()
    parts: dict[bool, tuple[tuple[float, ...], ...]] = {}
    known: dict[bool, dict[tuple[object, ...], float]] = {}  # memos.bounds of these stages
    last, n = stages[-1], len(left) // rp
    cap, ready = best * (1 + SLACK), last.arrive + last.fwd  # BranchAndBound.beaten: a bound >= cap
    room = memos.rooms.setdefault((tuple(v[TIMES:] for v in read), m), {})  # fits' answers (memory)
    times = tuple(v[:TIMES] for v in read)  # what fill_parts reads
    for q in range(1, min(n, tables.layers - 1 - last.last) + 1):
        if ready + least_rest(tables, table, q, n, last.last + 1, end) >= cap:
            continue  # the table's bound for exactly q stages to come
        p, widest = len(stages) + q, n - q + 1
        way = tables.hop(last.devices[0], last.last, min(len(last.devices) // rp, widest), left, size) if hop else 0.0
        terms = tail_terms(tables, table, widest, end, p, m)
        for name, k in memos.lead:
            got = terms.get((name, k))
            if got is None:  # kfkb with k >= m
                continue
            fit = room.get((name, k, p))
            if fit is None:
                fit = room[name, k, p] = fits(stages, name, p, m, k)
            if not fit:
                continue
            split, trip, finish = got
            if split not in known:
                known[split] = memos.bounds.setdefault((times, m, split), {})
            rest = trip + way
            key = (name, k, p, rest, finish)
            bound = known[split].get(key)
            if bound is None:
                if split not in parts:
                    parts[split] = fill_parts(stages, split)
                bound = known[split][key] = fill_bound(stages, m, name, k, p, rest, parts[split], finish)
            if bound < cap:
                if memos.lead[0] != (name, k):  # the schedule that passed first next time
                    memos.lead = ((name, k), *(s for s in memos.lead if s != (name, k)))
                return False
    return True


def least_rest(tables: Tables, table: SuffixBound, q: int, n: int, first: int, end: int) -> float:
    """The table's least rest for exactly q stages to come on n devices per pipeline, from a layer first..end + 1."""
    key = (table, q, n, first, end)
    got = tables.memos.rests.get(key)
    if got is None:
        got = tables.memos.rests[key] = float(table.stages_rest(q, n)[first : end + 2].min())
    return got


def tail_terms(
    tables: Tables, table: SuffixBound, widest: int, end: int, p: int, m: int
) -> dict[tuple[str, int], tuple[bool, float, float]]:
    """Per schedule (name, k) of a plan of p stages: its kind of backward, the table's way up and back after layer
    `end` and its part of the last stage (top) after it, for later stages of at most `widest` devices."""
    key = (table, widest, end, p, m)
    got = tables.memos.tails.get(key)
    if got is None:
        got = tables.memos.tails[key] = {}
        for name, k in tables.schedules:
            if name in TAKES_K and k >= m:
                continue
            split = splits_backward(name)
            _, b2, w2, _, b3, w3 = drain_counts(name, p, m, k)[-1][3:]  # the last stage: its actions after its last F
            finish = float(table.top(widest, split, b2 + b3, w2 + w3)[end + 1])
            got[name, k] = (split, float(table.trip(widest, split)[end]), finish)
    return got


def open_schedules(schedules: tuple[tuple[str, int], ...], stages: list[Placed], m: int, cap: float) -> Iterator[tuple[str, int]]:
    """The schedules (name, k) under which a whole plan of these stages fits in memory and its bounds
    (schedule_bound, fill_bound) are below `cap`."""
    bounds: dict[bool, float] = {}
    for name, k in schedules:
        if name in TAKES_K and k >= m:
            continue
        split = splits_backward(name)
        if split not in bounds:
            bounds[split] = schedule_bound(stages, m, split)
        if bounds[split] >= cap or not fits(stages, name, len(stages), m, k):
            continue
        if fill_bound(stages, m, name, k, len(stages)) < cap * (1 + SLACK):
            yield name, k
