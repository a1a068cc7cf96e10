"""exact's check of a partial plan: whether no completion of its first stages can beat the best plan, under any
schedule their memory allows and any count of stages to come (bounds.fill_bound with the suffix table's terms).

The look-ahead asks it ~300,000 times on a DGX-1 instance, and mostly again: the device-free stages after sibling
device tuples cost the same (93 % of fill_bound's calls on gnmt-32 repeated an earlier one). So it keeps what it
computed by what it reads (Memos): its answers per best time, fill_bound's values, the fits, the table's terms.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pipeplan.planner.exact.bounds import drain_counts, fill_bound, fill_parts
from pipeplan.planner.exact.space import peak_inflight
from pipeplan.planner.exact.stages import Placed
from pipeplan.planner.exact.suffix import SLACK, SuffixBound
from pipeplan.schedules.registry import TAKES_K, splits_backward

if TYPE_CHECKING:
    from pipeplan.planner.exact.search import Search

FILLS = 200_000
"""Most entries a memo keeps before it starts again (memory)."""

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


@dataclass(slots=True)
class Memos:
    """What filled keeps of one search."""

    best: float = math.inf  # the best time the answers hold under
    answers: dict[tuple[object, ...], bool] = field(default_factory=dict)  # without Search.hop: (values of the
    # stages, m, the table, n, the last stage's last layer, the end) -> filled
    bounds: dict[tuple[object, ...], dict[tuple[object, ...], float]] = field(default_factory=dict)  # (the
    # stages' times, m, split) -> (schedule, k, p, rest, finish) -> fill_bound
    rooms: dict[tuple[object, ...], dict[tuple[str, int, int], bool]] = field(default_factory=dict)  # (the
    # stages' static, act and memory, m) -> (schedule, k, p) -> fits
    rests: dict[tuple[object, ...], float] = field(default_factory=dict)  # least_rest
    tails: dict[tuple[object, ...], dict[tuple[str, int], tuple[bool, float, float]]] = field(default_factory=dict)

    def forget(self) -> None:
        """Start the memos of values again when one has grown past FILLS entries."""
        if max(len(self.bounds), len(self.rests), len(self.tails)) > FILLS:
            for memo in (self.bounds, self.rooms, self.rests, self.tails):
                memo.clear()


def filled(
    search: Search,
    stages: list[Placed],
    m: int,
    table: SuffixBound,
    left: tuple[int, ...],
    rp: int,
    size: int,
    hop: bool = True,
    upto: int | None = None,
) -> bool:
    """Whether no completion of these first stages on the devices `left` to p stages can beat the best under any
    schedule their memory allows (bounds.fill_bound). With q stages to come on n = len(left) // rp devices per
    pipeline, each takes at most n - q + 1 of them: the way up and back (the table's trip, Search.hop) and the
    last stage's part (the table's top) take the widths up to that. With `upto`, for every last stage that ends
    at a layer from its own last to `upto` (its costs those of the shortest: lookahead.span_stage): the table's
    terms at the least over those ends (trip and top do not grow with the end). Without hop, the answer is kept."""
    last, n = stages[-1], len(left) // rp
    end = last.last if upto is None else upto
    top = values(last)
    read = (*(values(st) for st in stages[:-1]), (*top[: TIMES - 1], 0.0, *top[TIMES:]))  # not the top's chain
    if hop:
        return compute(search, stages, read, m, table, left, rp, size, hop, end)
    memos = search.memos
    if memos.best != search.best_time or len(memos.answers) > FILLS:
        memos.best, memos.answers = search.best_time, {}
    key = (read, m, table, n, last.last, end)
    got = memos.answers.get(key)
    if got is None:
        got = memos.answers[key] = compute(search, stages, read, m, table, left, rp, size, hop, end)
    return got


def compute(
    search: Search,
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
    schedule that passed last (Search.lead: the answer does not depend on the order, only its time)."""
    memos = search.memos
    memos.forget()
    parts: dict[bool, tuple[tuple[float, ...], ...]] = {}
    known: dict[bool, dict[tuple[object, ...], float]] = {}  # memos.bounds of these stages
    last, n = stages[-1], len(left) // rp
    cap, ready = search.best_time * (1 + SLACK), last.arrive + last.fwd  # Search.beaten: a bound >= cap
    room = memos.rooms.setdefault((tuple(v[TIMES:] for v in read), m), {})  # fits' answers (memory)
    times = tuple(v[:TIMES] for v in read)  # what fill_parts reads
    for q in range(1, min(n, search.request.profile.num_layers - 1 - last.last) + 1):
        if ready + least_rest(search, table, q, n, last.last + 1, end) >= cap:
            continue  # the table's bound for exactly q stages to come
        p, widest = len(stages) + q, n - q + 1
        way = search.hop(last.devices[0], last.last, min(len(last.devices) // rp, widest), left, size) if hop else 0.0
        terms = tail_terms(search, table, widest, end, p, m)
        for name, k in search.lead:
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
                if search.lead[0] != (name, k):  # the schedule that passed first next time
                    search.lead = ((name, k), *(s for s in search.lead if s != (name, k)))
                return False
    return True


def least_rest(search: Search, table: SuffixBound, q: int, n: int, first: int, end: int) -> float:
    """The table's least rest for exactly q stages to come on n devices per pipeline, from a layer first..end + 1."""
    key = (table, q, n, first, end)
    got = search.memos.rests.get(key)
    if got is None:
        got = search.memos.rests[key] = float(table.stages_rest(q, n)[first : end + 2].min())
    return got


def tail_terms(
    search: Search, table: SuffixBound, widest: int, end: int, p: int, m: int
) -> dict[tuple[str, int], tuple[bool, float, float]]:
    """Per schedule (name, k) of a plan of p stages: its kind of backward, the table's way up and back after layer
    `end` and its part of the last stage (top) after it, for later stages of at most `widest` devices."""
    key = (table, widest, end, p, m)
    got = search.memos.tails.get(key)
    if got is None:
        got = search.memos.tails[key] = {}
        for name, k in search.schedules:
            if name in TAKES_K and k >= m:
                continue
            split = splits_backward(name)
            _, b2, w2, _, b3, w3 = drain_counts(name, p, m, k)[-1][3:]  # the last stage: its actions after its last F
            finish = float(table.top(widest, split, b2 + b3, w2 + w3)[end + 1])
            got[name, k] = (split, float(table.trip(widest, split)[end]), finish)
    return got
