"""One level of PipeDream's partitioning DP over down-set states (optimizer_graph_hierarchical.py, reimplemented).

Row r of a table means "the states after state r-1" (r = 0: from nothing),
column j "up to state j": the node set D_j minus D_{r-1}, defined for r = 0
and for every r-1 whose down-set is a proper subset of D_j. For that set on
m+1 units (GPUs at level 1, groups of the level below above it):

    A[r, j, m] = min( T(r, j, m+1),                                         one stage, replicated m+1 times
                      A[r, j, m-1]                                          (--use_fewer_machines only)
                      min_{k ⊂ j, r-1 ⊂ k, 1 <= m' <= m} max( A[r, k, m-m'], L(k+1, j, m'), X_k / m', X_j / m' ) )
    T(r, j, u) = ( C[r, j] + 4 (u-1) P[r, j] / (B u) / w ) / u
    L(k+1, j, u) = ( C[k+1, j] + 4 (u-1) P[k+1, j] / (B u) ) / u
    X_k = 2 cut_k / (B rho)  when an activation compression ratio rho is given (none: no transfer terms),
          X_j only when j is not the whole graph

with C the stage's compute (level 1: forward + backward of its nodes; above:
the level below's best time for that row and column on all its units), P its
parameter bytes, B the level's bandwidth and w the unit count of the level
below (1 at level 1). With the memory rule, a candidate whose stage holds
(activations + parameters) x ceil((N - (m+1)) / m') bytes over the memory is
skipped (the first stage: x ceil((N - u) / u)). The final (top) level needs
row 0 only.

Speed: with many units (above BRUTE_UNITS) and no memory rule, the min over
m' >= 2 uses that L and the X terms never grow with m' >= 2, so for a fixed
k, min over m' of max(A[k, m-m'], L(m')) equals the same with A replaced by
its running minimum over fewer units, and that min sits where the rising
and the falling sequence cross: a binary search per m instead of a scan.
Values are the same floats either way (max and min only).

Ties: the single stage wins, then the idle unit (--use_fewer_machines), then
the split with the smallest k, then the smallest m' (the original breaks
ties by hash order, see unwind).

Note:
    The original indexes rows by its own state order and fills them for every
    column j >= r, so for a state k that is neither inside nor outside D_{r-1}
    it charges C_k - C_{r-1}, which is not the cost of any node set. Here a row
    holds only the columns whose down-set contains D_{r-1}. The two agree at
    the top level (row 0) and on every saved plan of the original (tests).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

TIE_RELATIVE = 1e-9
"""Two candidate times closer than this (relative) are a tie: the original breaks such ties by hash order."""
BRUTE_UNITS = 16
"""Up to this many units a level scans every m' (and always with the memory rule); above it, the binary search."""


@dataclass(frozen=True, slots=True)
class LevelOptions:
    """One level's inputs besides the tables: `units` N, `bandwidth_bytes_per_s` B, `within` w (units of the level
    below in one unit), `final` (top level: row 0 only), and the run's switches (`memory_bytes` None: rule off)."""

    units: int
    bandwidth_bytes_per_s: float
    within: int
    final: bool
    straight: bool = False
    fewer: bool = False
    compression: float | None = None
    memory_bytes: float | None = None
    allowed: frozenset[int] | None = None

    def banned(self) -> np.ndarray:
        """True for each unit count 1..N a stage may not take (straight: all but 1; `allowed`: those outside)."""
        u = np.arange(1, self.units + 1)
        out = u > 1 if self.straight else np.zeros(self.units, dtype=bool)
        if self.allowed is not None:
            out |= ~np.isin(u, sorted(self.allowed))
        return out


@dataclass(frozen=True, slots=True)
class LevelInputs:
    """A level's tables: compute ms per (row, column) (inf where undefined), activation and parameter bytes per
    (row, column), cut bytes per state, and each state's proper-subset states."""

    compute_ms: np.ndarray
    activation_bytes: np.ndarray
    param_bytes: np.ndarray
    cut_bytes: np.ndarray
    preds: list[np.ndarray]


def _ms(num_bytes: np.ndarray | float, bandwidth: float) -> np.ndarray | float:
    """Milliseconds to move `num_bytes` at `bandwidth` bytes/s."""
    return num_bytes * 1000.0 / bandwidth


def last_stage_ms(t: LevelInputs, opt: LevelOptions, ks: np.ndarray, j: int) -> np.ndarray:
    """L(k+1, j, m') with its transfer terms for every k in `ks` and m' = 1..N: shape (|ks|, N)."""
    b = opt.bandwidth_bytes_per_s
    mp = np.arange(1, opt.units + 1, dtype=float)
    par = t.param_bytes[ks + 1, j][:, None]
    stage = (t.compute_ms[ks + 1, j][:, None] + _ms(4.0 * (mp - 1.0) * par / mp, b)) / mp
    if opt.compression is not None:
        stage = np.maximum(stage, _ms(2.0 * t.cut_bytes[ks][:, None], b) / (mp * opt.compression))
        if j < len(t.cut_bytes) - 1:
            stage = np.maximum(stage, _ms(2.0 * t.cut_bytes[j], b) / (mp * opt.compression))
    stage[:, opt.banned()] = np.inf
    return stage


def _memory_mask(t: LevelInputs, opt: LevelOptions, ks: np.ndarray, j: int, m: int, top: int) -> np.ndarray:
    """True where a last stage k+1..j on m' = 1..top units breaks the memory rule at m (shape (|ks|, top))."""
    if opt.memory_bytes is None:
        return np.zeros((len(ks), top), dtype=bool)
    u = np.arange(1, top + 1)
    depth = -(-(opt.units - (m + 1)) // u)
    held = (t.activation_bytes[ks + 1, j] + t.param_bytes[ks + 1, j])[:, None]
    return held * depth[None, :] > opt.memory_bytes


def single_stage_ms(t: LevelInputs, opt: LevelOptions, rows: slice, cols: slice) -> np.ndarray:
    """T(r, j, u) for u = 1..N (straight: u = 1, else inf), memory rule applied: shape (rows, cols, N)."""
    n = opt.units
    u = np.arange(1, n + 1, dtype=float)
    comp, par, act = (x[rows, cols][:, :, None] for x in (t.compute_ms, t.param_bytes, t.activation_bytes))
    value = (comp + _ms(4.0 * (u - 1.0) * par / u, opt.bandwidth_bytes_per_s) / opt.within) / u
    if opt.memory_bytes is not None:
        depth = -(-(n - np.arange(1, n + 1)) // np.arange(1, n + 1))
        value = np.where((act + par) * depth > opt.memory_bytes, np.inf, value)
    value[:, :, opt.banned()] = np.inf
    return value


def level_dp(t: LevelInputs, opt: LevelOptions) -> np.ndarray:
    """A[r, j, m] of the module docstring in ms (inf: no plan), shape (rows, states, N).

    Below the top level a column's candidates are (row r, split k) pairs, and only those where r names a node set
    of k (r = 0 or D_{r-1} inside D_k) can be finite: every other A[r, k] is inf. They are taken alone (a few in ten
    on a branching graph), each pair's best over m', then the least per row: the same minimum of the same floats.
    The table is kept unit count first (m, row, state) while it fills, so that a column's first stages on x+1
    units are one contiguous gather per x; it is turned to (row, state, m) once at the end.
    """
    rows = 1 if opt.final else t.compute_ms.shape[0]
    n = opt.units
    states = t.compute_ms.shape[1]
    by_units = np.ascontiguousarray(np.moveaxis(single_stage_ms(t, opt, slice(0, rows), slice(None)), 2, 0))
    flat = by_units.reshape(n, -1)  # [x, r * states + k]
    split_of = _split_rule(opt)
    named = None if opt.final else _named(t.preds, rows)
    for j in range(states):
        ks = t.preds[j]
        if len(ks) and n > 1:
            stage = last_stage_ms(t, opt, ks, j)
            if named is None:
                live = np.zeros(1, dtype=np.int64)
                at_k = np.arange(len(ks))
                first = flat[:, ks]  # [x, k]: the first stages on x+1 units
                split = split_of(t, opt, first, stage, at_k, ks, j).min(axis=1)[:, None]
            else:
                live = np.concatenate(([0], ks + 1))
                at_row, at_k = np.nonzero(named[np.ix_(live, ks)])  # by row, then k
                first = np.take(flat, live[at_row] * states + ks[at_k], axis=1)  # [x, pair]
                split = _least_per_row(split_of(t, opt, first, stage, at_k, ks, j), at_row, len(live))
            by_units[1:, live, j] = np.minimum(by_units[1:, live, j], split)
        if opt.fewer:
            by_units[:, :, j] = np.minimum.accumulate(by_units[:, :, j], axis=0)
    return np.ascontiguousarray(np.moveaxis(by_units, 0, 2))


def _named(preds: list[np.ndarray], rows: int) -> np.ndarray:
    """[r, k]: row r names a node set of state k (r = 0, or state r-1 a proper subset of state k)."""
    named = np.zeros((rows, len(preds)), dtype=bool)
    named[0] = True
    for k, below in enumerate(preds):
        named[below + 1, k] = True
    return named


def _least_per_row(values: np.ndarray, at_row: np.ndarray, rows: int) -> np.ndarray:
    """The least of `values` (N-1, pairs) per row index of `at_row` (sorted), inf for a row with no pair: (N-1, rows)."""
    counts = np.bincount(at_row, minlength=rows)
    out = np.full((values.shape[0], rows), np.inf)
    has = counts > 0
    if has.any():
        starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
        out[:, has] = np.minimum.reduceat(values, starts[has], axis=1)
    return out


SplitRule = Callable[[LevelInputs, LevelOptions, np.ndarray, np.ndarray, np.ndarray, np.ndarray, int], np.ndarray]
"""min over m' of max(A[r, k, m-m'], L(k+1, j, m')) for m = 1..N-1 per (row, candidate k) pair: (first (N, pairs):
the pair's first stages on x+1 units, stage (ks, N), at_k (pairs): the pair's index into ks, ks, j) -> (N-1, pairs)."""


def _split_rule(opt: LevelOptions) -> SplitRule:
    """The level's way to the split minimum: the binary search (many units, no memory rule, any counts), the listed
    counts (many units, limited counts) or the scan (module docstring)."""
    if opt.units > BRUTE_UNITS and opt.memory_bytes is None:
        if opt.allowed is None:
            return lambda t, o, first, stage, at_k, ks, j: _splits_fast(first.T[None], stage[at_k], o.straight)[0].T
        counts = np.flatnonzero(~opt.banned()) + 1
        return lambda t, o, first, stage, at_k, ks, j: _splits_listed(first.T[None], stage[at_k], counts)[0].T
    return _splits_brute


def _splits_brute(
    t: LevelInputs, opt: LevelOptions, first: np.ndarray, stage: np.ndarray, at_k: np.ndarray, ks: np.ndarray, j: int
) -> np.ndarray:
    """min over m' of max(A[r, k, m-m'], L(k+1, j, m')) for m = 1..N-1 by scanning m': shape (N-1, pairs).

    Each unit count's row of costs is gathered per pair once per level of the memory rule: once for the whole
    scan without it (the rule depends on m), else once per m."""
    n = opt.units
    out = np.full((n - 1, first.shape[1]), np.inf)
    pair = np.empty(first.shape[1])
    every = None if opt.memory_bytes is not None else np.take(stage.T, at_k, axis=1)  # [m' - 1, pair]
    # a banned m' (last_stage_ms: inf in every pair) is a candidate of inf, which never lowers the minimum
    counts = np.flatnonzero(~opt.banned()[: n - 1]) + 1
    for m in range(1, n):
        top = 1 if opt.straight else m
        if every is not None:
            cost = every
        else:
            cost = np.take(np.where(_memory_mask(t, opt, ks, j, m, top), np.inf, stage[:, :top]).T, at_k, axis=1)
        best = out[m - 1]
        for mp in counts[counts <= top].tolist():  # the first stages on m - m' + 1 units, index m - m'
            np.minimum(best, np.maximum(first[m - mp], cost[mp - 1], out=pair), out=best)
    return out


def _splits_listed(prefix: np.ndarray, stage: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The same minimum without the memory rule, scanning only the unit counts m' in `counts`: shape (live, ks, N-1)."""
    live, nk, n = prefix.shape
    out = np.full((live, nk, n - 1), np.inf)
    for mp in counts:
        if mp >= n:
            break
        # cells m = mp..N-1 take the first stages on m - mp + 1 units (index m - mp)
        cand = np.maximum(prefix[:, :, : n - mp], stage[None, :, mp - 1 : mp])
        out[:, :, mp - 1 :] = np.minimum(out[:, :, mp - 1 :], cand)
    return out


def _splits_fast(prefix: np.ndarray, stage: np.ndarray, straight: bool) -> np.ndarray:
    """The same minimum as _splits_brute without the memory rule, by a binary search over m' >= 2 (module
    docstring): shape (live, ks, N-1)."""
    live, nk, n = prefix.shape
    m = np.arange(1, n)  # the cell's m; the last stage takes m' in 1..m, the rest x = m - m'
    out = np.maximum(prefix[:, :, m - 1], stage[None, :, 0:1])  # m' = 1
    if not straight and n > 2:
        run = np.minimum.accumulate(prefix, axis=2)  # F[x]: best first stages on at most x+1 units
        g = np.broadcast_to(stage[None, :, :], (live, nk, n))  # g[m'-1]
        mm = np.broadcast_to(m[None, None, :], (live, nk, n - 1))
        lo = np.full(mm.shape, 2)
        hi = mm + 1  # search the smallest m' in [2, m] with F[m - m'] >= g[m']; m + 1 when there is none
        while True:
            active = lo < hi
            if not active.any():
                break
            mid = (lo + hi) // 2
            a = np.take_along_axis(run, np.clip(mm - mid, 0, n - 1), axis=2)
            b = np.take_along_axis(g, np.clip(mid - 1, 0, n - 1), axis=2)
            up = active & (a >= b)
            hi = np.where(up, mid, hi)
            lo = np.where(active & ~up, mid + 1, lo)
        cross = lo
        has = cross <= mm
        at = np.take_along_axis(run, np.clip(mm - cross, 0, n - 1), axis=2)  # F[m - t] when t exists
        before = np.take_along_axis(g, np.clip(cross - 2, 0, n - 1), axis=2)  # g[t - 1] when t - 1 >= 2
        two_plus = np.where(has, at, np.inf)
        two_plus = np.where((cross - 1 >= 2) & (cross - 1 <= mm), np.minimum(two_plus, before), two_plus)
        out = np.minimum(out, np.where(mm >= 2, two_plus, np.inf))
    return out


@dataclass(frozen=True, slots=True)
class Choice:
    """How cell (r, j, m) is made: `split_k` (-1: one stage), the prefix's m, the last stage's units, and `ties`,
    how many candidates reach the cell's value (within TIE_RELATIVE)."""

    split_k: int
    prefix_m: int
    units: int
    ties: int


def choice(time: np.ndarray, t: LevelInputs, opt: LevelOptions, row: int, j: int, m: int) -> Choice:
    """Recover cell (row, j, m)'s choice by scanning its candidates in the tie order of the module docstring."""
    value = float(time[row, j, m])
    near = value + TIE_RELATIVE * abs(value) if np.isfinite(value) else value
    single = float(single_stage_ms(t, opt, slice(row, row + 1), slice(j, j + 1))[0, 0, m])
    ks = t.preds[j]
    ties = int(single <= near)
    best = Choice(-1, -1, m + 1, 0) if single == value else None
    if opt.fewer and m > 0:
        idle = float(time[row, j, m - 1])
        ties += int(idle <= near)
        if best is None and idle == value:
            inner = choice(time, t, opt, row, j, m - 1)
            best = Choice(inner.split_k, inner.prefix_m, inner.units, 0)
    if len(ks) and m > 0:
        top = 1 if opt.straight else m
        cost = np.where(_memory_mask(t, opt, ks, j, m, top), np.inf, last_stage_ms(t, opt, ks, j)[:, :top])
        prefix = time[row, ks][:, m - 1 :: -1][:, :top]
        cand = np.maximum(prefix, cost)
        ties += int((cand <= near).sum())
        if best is None:
            k_at, mp_at = np.unravel_index(int(np.argmin(cand)), cand.shape)
            if cand[k_at, mp_at] == value:
                best = Choice(int(ks[k_at]), m - (int(mp_at) + 1), int(mp_at) + 1, 0)
    if best is None:
        raise AssertionError(f"cell ({row}, {j}, {m}) has no candidate of its value {value}")
    return Choice(best.split_k, best.prefix_m, best.units, max(ties, 1))


def unwind(time: np.ndarray, t: LevelInputs, opt: LevelOptions, row: int, end: int) -> tuple[list[tuple[int, int, int]], bool]:
    """The stages of A[row, end, N-1] as (first row, last state, units), in pipeline order, and whether every cell
    on the way had a unique minimum (no tie the original would break by hash order)."""
    stages: list[tuple[int, int, int]] = []
    unique = True
    j, m = end, opt.units - 1
    while True:
        c = choice(time, t, opt, row, j, m)
        unique &= c.ties == 1
        if c.split_k < 0:
            stages.append((row, j, c.units))
            break
        stages.append((c.split_k + 1, j, c.units))
        j, m = c.split_k, c.prefix_m
    return list(reversed(stages)), unique
