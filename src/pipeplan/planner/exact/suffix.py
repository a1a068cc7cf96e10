"""A proven bound on what the layers a partial plan leaves must still cost: the best split into stages.

For one shape (rp pipelines, m microbatches of b samples) let n = N // rp. A stage of layers a..e on r devices
per pipeline (r | b) cannot end its part of the iteration before it has seen its first input, run its m
forwards and backwards and then its all-reduce and optimizer step, or run its m forwards and backward-input
parts and then passed the last gradient down through every layer below it (planner.bound, term 4: the same
per-stage terms, at the fastest device's speed and the best ring of r rp devices (exact.rings); inf when the stage's weights and
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
"""

from __future__ import annotations

import numpy as np

from pipeplan.planner.bound import ShapeBounds
from pipeplan.planner.exact.rings import Rings

SLACK = 1e-9
"""Relative: the table adds prefix sums (another order than the simulator's sums), so a node is pruned by it only
when its bound passes the incumbent by more than this."""


def prefix(values: np.ndarray) -> np.ndarray:
    """0, v0, v0 + v1, ... (length len(values) + 1)."""
    return np.concatenate([[0.0], np.cumsum(values, dtype=float)])


def spans(sums: np.ndarray) -> np.ndarray:
    """[a, e] = sums[e + 1] - sums[a] for a prefix-sum array: the total of layers a..e."""
    return sums[None, 1:] - sums[:-1, None]


class SuffixBound:
    """rest[k][a] of one shape (module docstring), with the per-stage grids it came from."""

    def __init__(self, bounds: ShapeBounds, rings: Rings, rp: int, m: int, size: int) -> None:
        request = bounds.request
        layers = request.profile.num_layers
        self.n = request.cluster.num_devices // rp
        self.widths = bounds.widths(rp, size)
        fastest = bounds.s_max
        costs = {r: bounds.costs(size / r) for r in self.widths}
        fwd_min = np.min([c[0] for c in costs.values()], axis=0)
        inp_min = np.min([c[2] for c in costs.values()], axis=0)
        self.fwd_span = spans(prefix(fwd_min) / fastest)
        below = prefix(inp_min)[:-1, None] / fastest  # the backward path under layer a
        params = spans(prefix(bounds.params))
        fixed = spans(prefix(bounds.optimizer)) / fastest
        static = spans(prefix(bounds.static))
        memory = float(bounds.memory_prefix[1]) * (1 + SLACK)
        upper = np.triu(np.ones((layers, layers), dtype=bool))
        self.grids: dict[int, np.ndarray] = {}
        after = prefix(fwd_min + inp_min)[-1] - prefix(fwd_min + inp_min)[1:]  # [e]: layers after e, F and I'
        self.after = after / fastest
        self.costs, self.fastest, self.trips, self.tops = costs, fastest, {}, {}
        self.top_cols: dict[int, tuple[np.ndarray, ...]] = {}  # r -> [a]: F + step, B', I' of a last stage a..
        self.fwd_prefix = prefix(fwd_min) / fastest
        for r, (fwd, back, inp) in costs.items():
            arrays = request.model.layers.arrays(size / r)
            shared = prefix(arrays.shared)
            held = spans(prefix(arrays.saved)) - (shared[None, 1:] - shared[1:, None])
            f, b, i = (spans(prefix(v)) / fastest for v in (fwd, back, inp))
            step = fixed + rings.allreduce_ms(params, r * rp)
            turn = f + self.after[None, :]  # the stage's forward, then the way up and back to it
            value = np.maximum.reduce([m * (f + b) + step, m * (f + i) + below, turn + m * b + step, turn + m * i + below])
            value = np.maximum(value, np.maximum((m - 1) * f + turn + b + step, (m - 1) * f + turn + i + below))
            self.grids[r] = np.where(upper & (static + held <= memory), value, np.inf)
            fits = (static + held <= memory)[:, layers - 1]
            self.top_cols[r] = (np.where(fits, (f + step)[:, layers - 1], np.inf), b[:, layers - 1], i[:, layers - 1])
        self.size, self.per_layer = size, request.model.layers.per_layer_ms
        self.least: dict[int, list[float]] = {}
        self.rest = np.full((self.n + 1, layers + 1), np.inf)
        self.rest[:, layers] = 0.0
        for k in range(1, self.n + 1):
            row = self.rest[k - 1].copy()
            for r in self.widths:
                if r <= k:
                    row[:layers] = np.minimum(row[:layers], self.stage_row(slice(None), k, r).min(axis=1))
            self.rest[k] = row

    def stage_row(self, a: int | slice, k: int, r: int) -> np.ndarray:
        """Over every last layer e: the bound (less T) of a first stage a..e on r of k devices, and of the rest."""
        return np.maximum(self.grids[r][a], self.fwd_span[a] + self.rest[k - r][1:])

    def trip(self, k: int) -> np.ndarray:
        """[e]: `after` for layers on stages of at most k devices per pipeline: every layer after e forward and back
        (F and I'), each at the least of its costs over the widths r <= k, on the fastest device."""
        got = self.trips.get(k)
        if got is None:
            chosen = [c for r, c in self.costs.items() if r <= k] or list(self.costs.values())
            per_layer = np.min([c[0] + c[2] for c in chosen], axis=0)
            sums = prefix(per_layer)
            got = self.trips[k] = (sums[-1] - sums[1:]) / self.fastest
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
