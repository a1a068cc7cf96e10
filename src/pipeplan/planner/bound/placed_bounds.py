"""Lower bounds exact prunes with, from placed stages: on any completion of a partial plan, and on a complete plan
under a schedule. Each only drops what the simulator adds (queues, bubbles); tests/test_exact.py checks them
against the simulation on random plans."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from pipeplan.schedules import make_schedule
from pipeplan.schedules.registry import splits_backward, warmup_forwards, warmup_group


@dataclass(slots=True)
class Placed:
    """One placed stage at a fixed (rp, m): its layers, devices and times for a microbatch."""

    first: int
    last: int
    devices: tuple[int, ...]
    fwd: float
    bwd: float
    inp: float  # I of the zero-bubble split (at most B)
    wgt: float  # W of the zero-bubble split
    allreduce: float  # all-reduce, then the optimizer step
    static: float
    act: float
    memory: float
    arrive: float  # earliest start of its first forward: the forward path up to it
    fwd_in: float = 0.0  # transfer from the previous stage, unqueued
    bwd_out: float = 0.0  # gradient transfer back to the previous stage, unqueued
    chain: float = 0.0  # from the start of a backward here to the end of stage 0's backward and all-reduce
    chain_split: float = 0.0  # the same when stages above 0 run only I (zero-bubble)


MARGIN = 1e-9
"""Relative slack before a stage's own bound (compute_bound, placed_bound) retires it: sums in floating point need
not grow by every term they gain, and a device-free stage sums in another order than a placed one."""


def compute_bound(stage: Placed, m: int) -> float:
    """The stage's first input, its m forwards and backwards, its all-reduce: nondecreasing in its last layer."""
    return stage.arrive + m * (stage.fwd + min(stage.bwd, stage.inp + stage.wgt)) + stage.allreduce


def placed_bound(stage: Placed, prev: Placed | None, m: int) -> float:
    """A bound every completion and schedule obeys, from a stage and the ones before it.

    Its compute after its first input, then its all-reduce; and the m transfers on its slowest link in each
    direction, each followed by the last microbatch's way down to stage 0 and stage 0's all-reduce.
    """
    bound = compute_bound(stage, m)
    if prev is not None:
        down = stage.inp + prev.chain_split
        bound = max(
            bound,
            prev.arrive + prev.fwd + m * stage.fwd_in + stage.fwd + down,
            stage.arrive + stage.fwd + stage.inp + m * stage.bwd_out + prev.chain_split,
        )
    return bound


def schedule_bound(stages: list[Placed], m: int, split: bool) -> float:
    """Lower bound on the iteration of these stages under a schedule (split: backward as I and W).

    The largest of: per stage, first input + m (F + B) + the longer of its all-reduce and (unsplit only) the
    gradient's way down from it; one microbatch's path forward and back; per boundary and direction, the m
    transfers on its slowest pair plus the way before and after them.
    """
    last = stages[-1]
    chain = [st.chain_split if split else st.chain for st in stages]
    part = [st.inp if split else st.bwd for st in stages]
    part[0] = min(stages[0].bwd, stages[0].inp + stages[0].wgt)  # stage 0 runs I and W of the last microbatch itself
    forward_end = last.arrive + last.fwd
    bound = forward_end + chain[-1]
    first_backward = forward_end  # earliest start of the first backward on stage s (scanned downwards)
    for s in range(len(stages) - 1, -1, -1):
        st = stages[s]
        tail = st.allreduce if split or s == 0 else max(st.allreduce, st.bwd_out + chain[s - 1])
        back = st.inp + st.wgt if split else st.bwd
        bound = max(
            bound,
            st.arrive + m * (st.fwd + back) + tail,
            first_backward + m * back + tail,  # every backward after the first one's earliest start
            first_backward + (m - 1) * st.fwd + back + tail,  # the last forward's way up and back
        )
        if s:
            rest_forward = forward_end - st.arrive  # F on s and every stage after it, with transfers
            prev = stages[s - 1]
            bound = max(bound, prev.arrive + prev.fwd + m * st.fwd_in + rest_forward + chain[-1])
            bound = max(bound, first_backward + part[s] + m * st.bwd_out + chain[s - 1])
            first_backward += part[s] + st.bwd_out
    return bound


def fill_bound(
    stages: list[Placed],
    m: int,
    name: str,
    k: int,
    p: int,
    rest: float = 0.0,
    parts: tuple[tuple[float, ...], ...] | None = None,
    finish: float = 0.0,
) -> float:
    """Lower bound on the iteration of a plan of p stages whose first len(stages) are `stages`, under a schedule.

    `rest` is at most the time from the end of any forward on the last given stage to the arrival back at it of
    that microbatch's gradient: the forward and backward (zb-h1: its I) of every later layer and the transfers
    (0 when the stages are the whole plan). Every stage runs its actions one at a time in the schedule's order,
    an action waits for its input, and queues, transfers and ordering only delay, so with g = 1 under 1f1b and
    zb-h1, k under kfkb and m under gpipe, w_s = min(g (p - s), m) warm-up forwards on stage s:

    - fill: forward j ends on stage t no earlier than E_t(j) = arrive_t + F_t + j max(F_0..F_t) (the longest
      path of that grid: a step to the next forward costs some F_u <= the max, a step up the transfer and F of
      the next stage). The top stage's first backward waits for its forward g - 1 (w_top = g), so for forward
      g - 1 of the last given stage and then `rest`; stage s's first backward (zb-h1: I) waits for its own w_s
      forwards and for the first backward on s + 1 (B, or I) and its transfer down: first_s. After it the stage
      still runs every backward (zb-h1: every I and W) and m - w_s forwards, then its tail (all-reduce and step;
      unsplit above stage 0 also the last gradient's way down, as in schedule_bound).
    - drain: stage s's last forward ends no earlier than first_s plus the actions of its order from its first
      backward to that forward (drain_counts), nor than the last forward of the stage below plus the transfer
      and F_s; its last backward starts no earlier than that plus the actions between, nor than the last
      backward on s + 1 (its B or I) and its transfer down (on the last given stage: its last forward + `rest`);
      then it runs that backward and the actions after it (zb-h1: deferred W), then its tail.

    - finish: at most the time from the end of the last forward on the last given stage to the end of the
      iteration (the later stages' part of the last microbatch; 0 for a whole plan), after that forward's end.

    `parts`: fill_parts(stages, splits_backward(name)), when the caller has it.
    """
    parts = fill_parts(stages, splits_backward(name)) if parts is None else parts
    g, warms, counts = fill_plan(name, p, m, k)
    top = len(parts) - 1
    # the same sums as written in the docstring's order; comparisons inline (builtin max costs a call, and exact
    # asks ~150,000 of these bounds on a DGX-1 instance)
    firsts = [0.0] * len(parts)  # earliest start of each stage's first backward (zb-h1: I)
    arrive, fwd, _, _, _, _, once, _, slowest = parts[top]
    first = arrive + fwd + (warms[top] - 1) * slowest  # the earliest end of its last warm-up forward
    back_up = arrive + fwd + (g - 1) * slowest + rest
    first = back_up if back_up > first else first
    firsts[top] = first
    for s in range(top - 1, -1, -1):
        arrive, fwd, _, _, _, _, below_once, _, slowest = parts[s]
        start = arrive + fwd + (warms[s] - 1) * slowest
        wait = first + once
        first = wait if wait > start else start
        firsts[s], once = first, below_once
    lasts = [0.0] * len(parts)  # earliest end of each stage's last forward
    last = 0.0
    for s, (arrive, fwd, part, wgt, _, _, once, way, slowest) in enumerate(parts):
        f1, b1, w1 = counts[s][:3]
        own = firsts[s] + f1 * fwd + b1 * part + w1 * wgt if f1 else arrive + fwd + (m - 1) * slowest
        if s:
            up = last + way - once  # hop less once: F_in + F
            own = up if up > own else own
        lasts[s] = last = own
    bound, drain = lasts[top] + finish, 0.0  # drain: earliest start of the last backward on the stage above
    for s in range(top, -1, -1):
        _, fwd, part, wgt, back, tail, _, _, _ = parts[s]
        f2, b2, w2, f3, b3, w3 = counts[s][3:]
        term = firsts[s] + m * back + (m - warms[s]) * fwd + tail
        bound = term if term > bound else bound
        wait = lasts[s] + rest if s == top else drain + parts[s + 1][6]
        drain = lasts[s] + f2 * fwd + b2 * part + w2 * wgt
        drain = wait if wait > drain else drain
        term = drain + f3 * fwd + b3 * part + w3 * wgt + tail
        bound = term if term > bound else bound
    return bound


@cache
def fill_plan(name: str, p: int, m: int, k: int) -> tuple[int, tuple[int, ...], tuple[tuple[int, ...], ...]]:
    """What fill_bound reads of a schedule of p stages: g, each stage's warm-up forwards w_s = min(g (p - s), m),
    and drain_counts."""
    return warmup_group(name, m, k), warmup_forwards(name, p, m, k), drain_counts(name, p, m, k)


def fill_parts(stages: list[Placed], split: bool) -> tuple[tuple[float, ...], ...]:
    """Per stage, what fill_bound reads (zb-h1: split): arrive, F, the backward part the next stage down waits for
    (B or I), W, its whole backward, its tail, that part with the transfer down, the way up through it and back,
    and the slowest forward up to it."""
    out = []
    slowest = 0.0
    for s, st in enumerate(stages):
        slowest = max(slowest, st.fwd)
        part = st.inp if split else st.bwd
        tail = st.allreduce if split or s == 0 else max(st.allreduce, st.bwd_out + stages[s - 1].chain)
        back = st.inp + st.wgt if split else st.bwd
        once = part + st.bwd_out
        out.append((st.arrive, st.fwd, part, st.wgt, back, tail, once, st.fwd_in + st.fwd + once, slowest))
    return tuple(out)


@cache
def drain_counts(name: str, p: int, m: int, k: int) -> tuple[tuple[int, ...], ...]:
    """Per stage of the schedule's order, counts (F, B, W) (zb-h1's I counts as B) of: the actions from its first
    backward to its last forward, that one included (zeros when the last forward comes before every backward); the
    actions after its last forward and before its last backward; and its last backward and the actions after it."""
    out = []
    for order in make_schedule(name, p, m, k=k).ranks:
        kinds = ["B" if a.op == "I" else a.op for a in order]
        last_f = max(i for i, kind in enumerate(kinds) if kind == "F")
        last_b = max(i for i, kind in enumerate(kinds) if kind == "B")
        first_b = kinds.index("B")
        mid = kinds[first_b : last_f + 1] if first_b < last_f else []
        parts = (mid, kinds[last_f + 1 : last_b], kinds[last_b:])
        out.append(tuple(part.count(kind) for part in parts for kind in "FBW"))
    return tuple(out)
