"""The stage term of the lower bound for plans with one contiguous stage per rank: a DP over splits into stages.

It holds for every plan of shape (rp, b) whose ranks each run one contiguous stage (in the profile's layer
order): gpipe, 1f1b, kfkb, zb-h1, `list` without chunks. A stage of layers a..e on r devices per pipeline (r | b)
takes, with A(a) and D(a) the forward and backward-input path of the layers before a (their fastest width, the
fastest speed), x(a) the boundary into it (latency + cut bytes / r at the fastest link and least latency: r
pairs at most, each with its share of the bytes) and m microbatches:

- full: A(a) + x(a) + m (F + B')(a..e) / s_max + O(a..e) / s_max + AR(P(a..e), r rp): its first forward waits
  for the path and the activation; its ranks run every action and, after the last backward, its all-reduce and
  optimizer step;
- down: A(a) + x(a) + m (F + I')(a..e) / s_max + x(a) + D(a): every forward and backward of the stage precedes
  its last backward, after which the gradient crosses back and passes every layer before a;
- after the turn: its first backward waits for one microbatch's forward through every layer and backward
  through the layers above e, A(L) + Dtop(e), and every backward (B', I') and the optimizer step of the stage
  follow it, so full and down hold with that in place of A(a) + x(a) and the backwards alone in place of the
  stage's work;
- memory: the stage's weights, gradients and optimizer state plus one microbatch's saved bytes (at b / r) fit
  the largest device (a stage holds its microbatch from its forward to its backward), else the split is out.

- speed: on a cluster of several speeds, a stage runs at its slowest device's speed: at the fastest only when all
  its r rp devices are of the fastest kind, of which the cluster has so many (speed_dp), else at most the next.

The plan takes at least its largest stage's bound; the DP finds the least of that over every split into stages
of widths summing to at most n. On a cluster of several nodes it also knows where the stages' devices lie. A
boundary transfer runs replica t of the smaller side with replica t of the larger, so the first device of every
stage (per pipeline replica: its spine) meets the next stage's first device in a flow: between two boundaries
with a flow between nodes (a segment), the spines of a pipeline stay in one node. A stage whose devices (all
pipeline replicas') lie in one node takes r rp of that node's devices; a stage whose devices span nodes pays its
ring all-reduce at the fastest link between nodes and takes only its spine (with one pipeline; nothing with
several, whose spines may lie apart). A stage with a flow between nodes into it pays x(a) at least latency +
cut / r over the fastest link between nodes, and that pair, serving one microbatch at a time (first come, first
served), carries m activations after A(a) before the last microbatch's forward and backward through the stage
and its gradient back: A(a) + m x(a) + (F + I')(a..e) / s_max + x(a) + D(a). The DP (segment_dp) runs over
splits, each stage inside a node or spanning, each segment's stages within one node's devices (a relaxation: a
node visited twice counts twice). Shapes too large for it take the least of the DP on one node's devices and
the DP with at least one stage that crosses.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from pipeplan.core.units import wire_ms

STAGE_DP_CELLS = 60_000_000
"""Most (layer, layer, devices, width) cells the stage DP of one shape may visit; larger shapes skip it."""
SEGMENT_DP_CELLS = 100_000_000
"""Most cells the DP over node segments may visit; larger shapes take the one-crossing DP instead."""


def spans(values: np.ndarray) -> np.ndarray:
    """[a, e] = sum of values[a..e] (meaningful for a <= e)."""
    prefix = np.concatenate([[0.0], np.cumsum(values)])
    return prefix[None, 1:] - prefix[:-1, None]


def stage_term(bounds: Any, rp: int, b: int) -> float:
    """The stage term of shape (rp, b) (module docstring); nan when the shape is too large to search.

    `bounds` is a planner.bound.shape_bounds.ShapeBounds.
    """
    request = bounds.request
    devices = request.cluster.num_devices
    n = devices // rp
    m = request.global_batch // (rp * b)
    widths = bounds.widths(rp, b)
    layers = request.profile.num_layers
    nodes = bounds.node_size < devices
    if layers * layers * n * len(widths) * (2 if nodes else 1) > STAGE_DP_CELLS:
        return math.nan
    s = bounds.s_max
    costs = {r: bounds.costs(b / r) for r in widths}
    fwd_min = np.min([c[0] for c in costs.values()], axis=0)
    inp_min = np.min([c[2] for c in costs.values()], axis=0)
    before_fwd = np.concatenate([[0.0], np.cumsum(fwd_min)])[:-1] / s  # A(a)
    before_inp = np.concatenate([[0.0], np.cumsum(inp_min)])[:-1] / s  # D(a)
    turn = (fwd_min.sum() + inp_min.sum() - np.cumsum(inp_min)) / s  # [e]: A(L) + the backward path above e
    upper = np.triu(np.ones((layers, layers), dtype=bool))
    static = spans(bounds.static)
    steps = spans(bounds.optimizer) / s
    params = spans(bounds.params)
    cuts = np.array([0.0] + [bounds.layers.cut_bytes(i, b) for i in range(layers - 1)])  # into the stage of layer a
    grids, crossing, slow = {}, {}, {}
    speeds = sorted({d.speed for d in request.cluster.devices}, reverse=True)
    slower = speeds[1] if len(speeds) > 1 and n * devices * len(widths) * layers * layers <= SEGMENT_DP_CELLS else None
    kinds: dict[tuple[bool, bool], dict[int, np.ndarray]] = {(i, c): {} for i in (True, False) for c in (False, True)}
    for r, (fwd, back, inp) in costs.items():
        fits = upper & (static + bounds.saved_spans(b / r) <= bounds.memory_prefix[1])
        work = Work(m * spans(fwd) / s, m * spans(back) / s + steps, m * spans(inp) / s)
        moved = bounds.transfer_latency + wire_ms(cuts / r, bounds.transfer_rate)
        moved[0] = 0.0
        near = bounds.allreduce_ms(params, r * rp)
        grid = stage_grid(before_fwd, before_inp, turn, moved, work, near)
        grids[r] = np.where(fits, grid, np.inf)
        if slower is not None:
            at = Work(m * spans(fwd) / slower, m * spans(back) / slower + steps * s / slower, m * spans(inp) / slower)
            slow[r] = np.where(fits, stage_grid(before_fwd, before_inp, turn, moved, at, near), np.inf)
        if not nodes:
            continue
        # crossing by its all-reduce (a ring of r rp >= 2 devices over two nodes) or by the boundary into it
        across = bounds.allreduce_ms(params, r * rp, across=True)
        spread = stage_grid(before_fwd, before_inp, turn, moved, work, across)
        spread = spread if r * rp >= 2 else np.full_like(spread, np.inf)
        far = bounds.latency_across + wire_ms(cuts / r, bounds.rate_across)
        far[0] = np.inf  # nothing flows into the first stage
        link = (before_fwd + (m + 1) * far + before_inp)[:, None] + spans(fwd + inp) / s
        cut = np.maximum(stage_grid(before_fwd, before_inp, turn, far, work, near), link)
        crossing[r] = np.where(fits, np.maximum(grid, np.minimum(spread, cut)), np.inf)
        kinds[True, False][r] = grids[r]
        kinds[True, True][r] = np.where(fits, cut, np.inf)
        kinds[False, False][r] = np.where(fits, spread, np.inf)
        spread_cut = np.maximum(stage_grid(before_fwd, before_inp, turn, far, work, across), link)
        kinds[False, True][r] = np.where(fits & (r * rp >= 2), spread_cut, np.inf)
    fastest = sum(d.speed == speeds[0] for d in request.cluster.devices)
    by_speed = speed_dp(grids, slow, n, layers, fastest, rp) if slower is not None else 0.0
    if not nodes:
        return max(float(split_dp(grids, n, layers)[n, 0]), by_speed)
    budget = bounds.node_size
    if n * (budget + 1) * 4 * len(widths) * layers * layers <= SEGMENT_DP_CELLS:
        return max(segment_dp(kinds, n, layers, budget, rp), by_speed)
    best = split_dp(grids, n, layers)
    one_node = bounds.node_size // rp
    inside = float(best[min(n, one_node), 0]) if one_node >= 1 else math.inf
    return max(min(inside, float(split_dp(grids, n, layers, crossing, best)[n, 0])), by_speed)


def speed_dp(fast: dict[int, np.ndarray], slow: dict[int, np.ndarray], n: int, layers: int, fastest: int, rp: int) -> float:
    """The least largest stage bound over splits where a stage runs at the fastest speed only when all its r rp
    devices are of the fastest kind (`fastest` of them in the cluster), else at the next speed (`slow` grids): the
    simulator runs a stage at its slowest device's speed."""
    g = np.full((n + 1, fastest + 1, layers + 1), np.inf)
    g[:, :, layers] = 0.0
    for k in range(1, n + 1):
        g[k] = g[k - 1]
        for f in range(fastest + 1):
            row = g[k, f]
            for r, grid in slow.items():
                if r <= k:
                    row[:layers] = np.minimum(row[:layers], np.maximum(grid, g[k - r, f][None, 1:]).min(axis=1))
                if r <= k and r * rp <= f:
                    after = g[k - r, f - r * rp]
                    row[:layers] = np.minimum(row[:layers], np.maximum(fast[r], after[None, 1:]).min(axis=1))
    return float(g[n, fastest, 0])


def segment_dp(kinds: dict[tuple[bool, bool], dict[int, np.ndarray]], n: int, layers: int, budget: int, rp: int) -> float:
    """The least largest stage bound over splits into stages, each inside one node or spanning nodes, each with or
    without a flow between nodes into it, where the stages between two such flows fit one node (module docstring).

    g[k, j, c][a]: layers a.. on at most k devices per pipeline, j devices left in the current segment's node, c:
    the boundary into the stage of layer a has a flow between nodes. A stage inside a node takes r rp of them; a
    spanning stage (r rp >= 2, all-reduce between nodes) its spine (1 with one pipeline, 0 with several: their
    spines may lie in other nodes); a flow between nodes into the next stage starts a new segment.
    """
    g = np.full((n + 1, budget + 1, 2, layers + 1), np.inf)
    g[:, :, :, layers] = 0.0
    for k in range(1, n + 1):
        g[k] = g[k - 1]
        for j in range(budget + 1):
            for c in (0, 1):
                row = g[k, j, c]
                for inside in (True, False):
                    for r, grid in kinds[inside, bool(c)].items():
                        cost = r * rp if inside else (1 if rp == 1 else 0)
                        if r > k or cost > j:
                            continue
                        after = np.minimum(g[k - r, j - cost, 0], g[k - r, budget, 1])
                        row[:layers] = np.minimum(row[:layers], np.maximum(grid, after[None, 1:]).min(axis=1))
    return float(g[n, budget, 0, 0])


class Work(NamedTuple):
    """A stage's work over m microbatches at its width ([a, e] grids, ms): forwards; backwards (B') with the
    optimizer step; backward-input parts (I')."""

    forward: np.ndarray
    backward: np.ndarray
    inputs: np.ndarray


def stage_grid(
    before_fwd: np.ndarray, before_inp: np.ndarray, turn: np.ndarray, moved: np.ndarray, work: Work, reduce: np.ndarray
) -> np.ndarray:
    """[a, e]: the largest of full, down and their after-the-turn forms (module docstring), with all-reduce `reduce`
    and the boundary transfer `moved` into the stage."""
    tail = (before_inp + moved)[:, None]
    backward = work.backward + reduce
    first = (before_fwd + moved)[:, None] + np.maximum(work.forward + backward, work.forward + work.inputs + tail)
    return np.maximum(first, turn[None, :] + np.maximum(backward, work.inputs + tail))


def split_dp(
    grids: dict[int, np.ndarray],
    n: int,
    layers: int,
    crossing: dict[int, np.ndarray] | None = None,
    plain: np.ndarray | None = None,
) -> np.ndarray:
    """best[k][a]: the least largest stage bound of layers a.. on at most k devices (a = layers: nothing left).

    With `crossing` (per width, a stage's bound when it crosses nodes) and `plain` (this function's table without
    it), the same over splits in which at least one stage crosses.
    """
    best = np.full((n + 1, layers + 1), np.inf)
    best[:, layers] = math.inf if crossing is not None else 0.0
    for k in range(1, n + 1):
        row = best[k - 1].copy()
        for r, grid in grids.items():
            if r > k:
                continue
            row[:layers] = np.minimum(row[:layers], np.maximum(grid, best[k - r][None, 1:]).min(axis=1))
            if crossing is not None and plain is not None:
                row[:layers] = np.minimum(row[:layers], np.maximum(crossing[r], plain[k - r][None, 1:]).min(axis=1))
        best[k] = row
    return best
