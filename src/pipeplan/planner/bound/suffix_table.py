"""A proven bound on what the layers a partial plan leaves must still cost: the best split into stages.

For one shape (rp pipelines, m microbatches of b samples) let n = N // rp. A stage of layers a..e on r devices
per pipeline (r | b) cannot end its part of the iteration before it has seen its first input, run its m
forwards and backwards and then its all-reduce and optimizer step, or run its m forwards and backward-input
parts and then passed the last gradient down through every layer below it (planner.bound.shape_bounds, term 4: the same
per-stage terms, at the fastest device's speed and the best ring of r rp devices (best_rings); inf when the stage's weights and
one microbatch's saved bytes fit no device). Nor can it start its first backward before one microbatch has gone
through its forward, the forwards of every later layer and their backward(-input) parts (the way up and back),
nor its last before the m-th forward has taken that way: so also that start + m backwards (or the last
backward) + the all-reduce and step, or + the way down below it. Its first input comes at least the forwards of the layers before
it after the first input of any earlier stage. So with T the earliest first input of layer a,

    rest[k][a] = min over the first stage a..e on r <= k devices of max(V_r(a, e), F(a..e) + rest[k - r][e + 1])

(rest[k][layers] = 0, rest[0][a] = inf, and never more than rest[k - 1][a]: devices may stay unused) gives
T + rest[k][a] <= the iteration time of every plan that places layers a.. on at most k free devices per
pipeline, whichever devices they are. The table is a min-max DP over contiguous partitions, O(layers^2) per
(k, r) in numpy; exact consults it before costing any device tuple of a stage end.

The first stage's forward is its own at width r, and the way up and back takes the widths the k - r devices left
allow. Where it is cheap (STAGE_COUNTS), the DP also counts the stages: exact[c][k][a] places layers a.. in
exactly c stages, so a stage knows the c' stages after it and its warm-up: it waits for min(g (c' + 1), m)
forwards of its own and for forward g - 1 to go up and back before its first backward, then runs every backward
and its other forwards (g = 1, k or m by schedule, the least over the request's schedules); rest[k] is the least
over c.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from pipeplan.planner.bound.best_rings import Rings
from pipeplan.planner.bound.shape_bounds import ShapeBounds
from pipeplan.schedules.registry import TAKES_K, splits_backward, warmup_group

STAGE_COUNTS = 10**7
"""Most cells (devices x widths x layers^2 x stage counts) for which the table keeps a grid per count of later
stages (a stage's warm-up forwards follow from it); above, one grid for any count."""

SLACK = 1e-9
"""Relative: the table adds prefix sums (another order than the simulator's sums), so a node is pruned by it only
when its bound passes the incumbent by more than this."""


def prefix(values: np.ndarray) -> np.ndarray:
    """0, v0, v0 + v1, ... (length len(values) + 1)."""
    return np.concatenate([[0.0], np.cumsum(values, dtype=float)])


def spans(sums: np.ndarray) -> np.ndarray:
    """[a, e] = sums[e + 1] - sums[a] for a prefix-sum array: the total of layers a..e."""
    return sums[None, 1:] - sums[:-1, None]


BLOCK = 256
"""Rows of a grid computed at once: a block of rows a0.. takes the columns a0.. only (a stage ends at or after its
first layer), so a grid of L layers costs about L^2 / 2 + BLOCK L / 2 cells instead of L^2."""


def blocks(layers: int) -> Iterator[tuple[slice, slice]]:
    """(rows, columns) of a grid over `layers` layers, BLOCK rows at a time, each with the columns at or after its
    first row (the cells a stage can have)."""
    for a in range(0, layers, BLOCK):
        yield slice(a, a + BLOCK), slice(a, None)


def headroom(trip: np.ndarray, part: np.ndarray, times: float) -> np.ndarray:
    """max(0, trip - times part), a new array: how much the way up and back passes `times` of `part`."""
    out = np.multiply(part, times)
    np.subtract(trip, out, out=out)
    np.maximum(out, 0.0, out=out)
    return out


def own_terms(
    f: np.ndarray,
    b: np.ndarray,
    i: np.ndarray,
    step: np.ndarray,
    fits: np.ndarray,
    below: np.ndarray,
    trip: np.ndarray,
    m: int,
) -> np.ndarray:
    """[a, e]: the terms of V_r(a, e) that take no stage count, from its F, B', I', step ([a, e]), the way down
    below a ([a, 1]) and the way up and back after e ([1, e]); inf where it does not fit (and for e < a). With the
    backward part x = B' (then the step) or I' (then the way down): m (F + x) after the first input; or the
    forward, the way up and back, then m x, or m - 1 more forwards and x; that is
    m (F + x) + max(0, trip - (m - 1) min(F, x)). In place, BLOCK rows at a time: a table of 1,251 layers
    computes ~100 of these grids."""
    out = np.full(f.shape, np.inf)
    for rows, cols in blocks(f.shape[0]):
        fb, bb, ib, tb = f[rows, cols], b[rows, cols], i[rows, cols], trip[:, cols]
        high = np.add(fb, bb)
        high *= m
        high += step[rows, cols]
        high += headroom(tb, np.minimum(fb, bb), m - 1)  # the step's side
        low = headroom(tb, np.minimum(fb, ib), m - 1)
        low += below[rows]
        other = np.add(fb, ib)
        other *= m
        low += other  # the way down's side
        np.maximum(high, low, out=high)
        np.copyto(out[rows, cols], high, where=fits[rows, cols])
    return out


def least_over_ends(grid: np.ndarray, own: np.ndarray, rest: np.ndarray) -> np.ndarray:
    """[a]: the least over e >= a of max(grid[a, e], own[a, e] + rest[e]) (grid inf for e < a), BLOCK rows at a time."""
    out = np.empty(grid.shape[0])
    for rows, cols in blocks(grid.shape[0]):
        cell = np.add(own[rows, cols], rest[cols])
        np.maximum(cell, grid[rows, cols], out=cell)
        out[rows] = cell.min(axis=1)
    return out


class SuffixBound:
    """rest[k][a] of one shape (module docstring), with the per-stage grids it came from."""

    def __init__(
        self,
        bounds: ShapeBounds,
        rings: Rings,
        rp: int,
        m: int,
        size: int,
        schedules: tuple[tuple[str, int], ...],
        shared: dict[object, tuple[np.ndarray, ...]] | None = None,
    ) -> None:
        """`shared`: grids that depend on the request and the samples per replica only, kept between the tables of
        one request (its ShapeBounds)."""
        shared = {} if shared is None else shared
        request = bounds.request
        layers = self.layers = request.profile.num_layers
        self.n, self.m = request.cluster.num_devices // rp, m
        self.widths = bounds.widths(rp, size)
        fastest = bounds.s_max
        costs = {r: bounds.costs(size / r) for r in self.widths}
        self.costs, self.fastest, self.trips, self.tops = costs, fastest, {}, {}
        fwd_min = np.min([c[0] for c in costs.values()], axis=0)
        inp_min = np.min([c[2] for c in costs.values()], axis=0)
        self.below = prefix(inp_min)[:-1, None] / fastest  # the backward path under layer a
        if "common" not in shared:
            memory = float(bounds.memory_prefix[1]) * (1 + SLACK)
            shared["common"] = (spans(prefix(bounds.params)), spans(prefix(bounds.optimizer)) / fastest, np.array(memory))
        params, fixed, memory = shared["common"]
        after = prefix(fwd_min + inp_min)[-1] - prefix(fwd_min + inp_min)[1:]  # [e]: layers after e, F and I'
        self.after = after / fastest
        self.top_cols: dict[int, tuple[np.ndarray, ...]] = {}  # r -> [a]: F + step, B', I' of a last stage a..
        self.fwd_prefix = prefix(fwd_min) / fastest
        self.own: dict[int, np.ndarray] = {}  # r -> F of layers a.. at width r, prefix sums
        self.parts: dict[int, tuple[np.ndarray, ...]] = {}  # r -> [a, e]: F, B', I', step; where it fits
        for r, (fwd, back, inp) in costs.items():
            if size / r not in shared:
                arrays = request.model.layers.arrays(size / r)
                both = prefix(arrays.shared)
                held = spans(prefix(arrays.saved)) - (both[None, 1:] - both[1:, None])
                fits = np.triu(spans(prefix(bounds.static)) + held <= memory)
                shared[size / r] = (*(spans(prefix(v)) / fastest for v in (fwd, back, inp)), fits)
            f, b, i, fits = shared[size / r]
            step = fixed + rings.allreduce_ms(params, r * rp)
            self.own[r] = prefix(fwd) / fastest
            self.parts[r] = (f, b, i, step, fits)
            top = fits[:, layers - 1]
            self.top_cols[r] = (np.where(top, (f + step)[:, layers - 1], np.inf), b[:, layers - 1], i[:, layers - 1])
        # the schedules' warm-up group g (schedules.registry.warmup_group) and split backward
        self.kinds = sorted(
            {(warmup_group(name, m, k), splits_backward(name)) for name, k in schedules if name not in TAKES_K or k < m}
        )
        self.counts = min(self.n, layers) if self.n * len(self.widths) * layers**2 * min(self.n, layers) <= STAGE_COUNTS else 0
        self.size, self.per_layer = size, request.model.layers.per_layer_ms
        self.least: dict[int, list[float]] = {}
        self.rows: dict[tuple[int, int], np.ndarray] = {}  # (k, r) -> [a, e]: stage_row, kept (with stage counts)
        self.values: dict[tuple[int, int], np.ndarray] = {}  # (r, cap) -> grid's terms that take no stage count
        self.rest = np.full((self.n + 1, layers + 1), np.inf)
        self.rest[:, layers] = 0.0
        if self.counts:
            self.count_stages()
            self.values.clear()
            self.parts.clear()  # grid's inputs, no longer asked (a table of 1,251 layers: 12.5 MB a step matrix)
            return
        self.grids = {r: self.grid(r, self.n, None) for r in self.widths}  # one grid for any count of stages after
        self.parts.clear()
        own = {r: spans(self.own[r]) for r in self.widths}
        for k in range(1, self.n + 1):
            row = self.rest[k - 1].copy()
            for r in self.widths:
                if r == k:  # no devices left after it: the stage takes every layer to the last (rest[0] is inf before)
                    row[:layers] = np.minimum(row[:layers], np.maximum(self.grids[r][:, -1], own[r][:, -1]))
                elif r < k:
                    row[:layers] = np.minimum(row[:layers], least_over_ends(self.grids[r], own[r], self.rest[k - r][1:]))
            self.rest[k] = row

    def cap(self, k: int) -> int:
        """The widest stage k devices per pipeline allow (0: none)."""
        return max((r for r in self.widths if r <= k), default=0)

    def grid(self, r: int, cap: int, c: int | None) -> np.ndarray:
        """[a, e]: V_r(a, e) (module docstring) when every later stage has at most `cap` devices per pipeline and,
        with `c`, exactly c stages come after it: the stage's first backward waits for its min(g (c + 1), m) warm-up
        forwards and for forward g - 1 to go up and back (g = 1, k or m: the least over the schedules), then it runs
        every backward and its other forwards, then its step or the way down (inf where it does not fit)."""
        f, b, i, step, fits = self.parts[r]
        m, below = self.m, self.below
        after = {split: self.trip(cap, split)[None, :] for split in (False, True)}
        key = (r, cap)
        value = self.values.get(key)
        if value is None:
            value = self.values[key] = own_terms(f, b, i, step, fits, below, after[True], m)
        if c is None:
            return value
        # max(w F, g F + trip) + (m - w) F = m F + max(0, trip - (w - g) F) with w = min(g (c + 1), m) >= g: per
        # kind of backward the schedule with the most forwards w - g between forward g - 1 and its first backward
        spare: dict[bool, int] = {}
        for g, split in self.kinds:
            spare[split] = max(spare.get(split, 0), min(g * (c + 1), m) - g)
        out = np.full(f.shape, np.inf)
        for rows, cols in blocks(f.shape[0]):
            fb = f[rows, cols]
            waits = [headroom(after[split][:, cols], fb, ahead) for split, ahead in spare.items()]
            least = waits[0] if len(waits) == 1 else np.minimum(*waits)
            least += m * fb
            drain = np.multiply(b[rows, cols], m)
            drain += step[rows, cols]
            other = np.multiply(i[rows, cols], m)
            other += below[rows]
            np.maximum(drain, other, out=drain)
            least += drain
            np.maximum(least, value[rows, cols], out=out[rows, cols])
        return out

    def count_stages(self) -> None:
        """exact[c][k][a]: layers a.. in exactly c stages on at most k devices per pipeline (a stage with c' stages
        after it takes grid(r, cap, c')); rest[k] is the least over c, and rows[k, r] keep stage_row's values."""
        layers, n = self.layers, self.n
        self.exact = np.full((self.counts + 1, n + 1, layers + 1), np.inf)
        self.exact[0, :, layers] = 0.0
        for k in range(1, n + 1):
            for r in self.widths:
                if r <= k:
                    self.rows[k, r] = np.full((layers, layers), np.inf)
        own = {r: spans(self.own[r]) for r in self.widths}
        for c in range(1, self.counts + 1):
            grids: dict[tuple[int, int], np.ndarray] = {}
            for k in range(1, n + 1):
                row = self.exact[c, k - 1].copy()
                for r in self.widths:
                    if r > k or k - r < c - 1:  # c - 1 stages need as many devices
                        continue
                    cap = self.cap(k - r)
                    if (r, cap) not in grids:
                        grids[r, cap] = self.grid(r, cap, c - 1)
                    cell = np.maximum(grids[r, cap], own[r] + self.exact[c - 1, k - r, 1:])
                    np.minimum(self.rows[k, r], cell, out=self.rows[k, r])
                    row[:layers] = np.minimum(row[:layers], cell.min(axis=1))
                self.exact[c, k] = row
        self.rest = self.exact.min(axis=0)

    def stage_row(self, a: int | slice, k: int, r: int) -> np.ndarray:
        """Over every last layer e: the bound (less T) of a first stage a..e on r of k devices, and of the rest."""
        if self.counts:
            return self.rows[k, r][a]
        own = self.own[r]
        forward = own[None, 1:] - own[:-1, None] if isinstance(a, slice) else own[1:] - own[a]
        return np.maximum(self.grids[r][a], forward + self.rest[k - r][1:])

    def stages_rest(self, c: int, k: int) -> np.ndarray:
        """[a]: as rest[k], for layers a.. in exactly c stages (rest[k] where the table keeps no stage counts)."""
        return self.exact[c, k] if self.counts and c <= self.counts else self.rest[k]

    def trip(self, k: int, split: bool = True) -> np.ndarray:
        """[e]: `after` for layers on stages of at most k devices per pipeline: every layer after e forward and back
        (F, then I' under a split backward, B' = min(B, I + W) otherwise: a stage above sends the gradient down only
        after its whole backward), each at the least of its costs over the widths r <= k, on the fastest device."""
        got = self.trips.get((k, split))
        if got is None:
            chosen = [c for r, c in self.costs.items() if r <= k] or list(self.costs.values())
            per_layer = np.min([c[0] + (c[2] if split else c[1]) for c in chosen], axis=0)
            sums = prefix(per_layer)
            got = self.trips[k, split] = (sums[-1] - sums[1:]) / self.fastest
        return got

    def top(self, k: int, split: bool, backs: int, weights: int) -> np.ndarray:
        """[a]: at least the time from the end of the last forward on a stage before layer a to the end of the
        iteration, when layers a.. take stages of at most k devices per pipeline and the last stage runs `backs`
        backwards (zb-h1, split: I) and `weights` W after its last forward: the last microbatch's forward through the
        layers before the last stage, then on that stage (some a'.. on r <= k devices) its forward, those actions
        and its all-reduce and optimizer step (the grid's step). Per layer B' <= B and I' <= I, and B' - I' <= W."""
        key = (k, split, backs, weights)
        got = self.tops.get(key)
        if got is None:
            chosen = [cols for r, cols in self.top_cols.items() if r <= k] or list(self.top_cols.values())
            ends = [base + backs * (inp if split else back) + weights * (back - inp) for base, back, inp in chosen]
            reach = self.fwd_prefix[:-1] + np.min(ends, axis=0)  # [a']: F of the layers before a', then the stage a'..
            got = self.tops[key] = np.minimum.accumulate(reach[::-1])[::-1] - self.fwd_prefix[:-1]
        return got

    def least_work(self, k: int, a: int) -> float:
        """The least compute per sample of layers a.. on at most k replicas of a stage (a speed-1 device's ms): the
        device-time of one microbatch of them is at least `size` times it."""
        got = self.least.get(k)
        if got is None:
            splits = [x for x in range(1, self.size + 1) if self.size % x == 0 and self.size // x <= k]
            per_sample = np.min([self.per_layer(x) / x for x in splits], axis=0)
            got = self.least[k] = [*np.cumsum(per_sample[::-1])[::-1].tolist(), 0.0]
        return got[a]

    def split(self) -> list[tuple[int, int, int]]:
        """A split reaching rest[n][0]: (first layer, last layer, devices per pipeline) per stage."""
        out: list[tuple[int, int, int]] = []
        k, a, layers = self.n, 0, self.rest.shape[1] - 1
        while a < layers and np.isfinite(self.rest[k][a]):
            while k > 1 and self.rest[k - 1][a] == self.rest[k][a]:
                k -= 1
            for r in self.widths:
                row = self.stage_row(a, k, r) if r <= k else None
                if row is not None and row.min() == self.rest[k][a]:
                    e = int(row.argmin())
                    out.append((a, e, r))
                    k, a = k - r, e + 1
                    break
            else:
                return []
        return out if a == layers else []
