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

The plan takes at least its largest stage's bound; the DP finds the least of that over every split into stages
of widths summing to at most n. On a cluster of several nodes it also knows that the devices a plan uses lie in
one node (so at most the largest node's devices are used, over all pipelines) or some stage crosses nodes: its
devices span two nodes, so its ring all-reduce has a link between nodes (AR at the fastest such link), or the
boundary into it has a flow between nodes: then x(a) is at least latency + cut / r over the fastest link
between nodes, and that pair, serving one microbatch at a time (first come, first served), carries m
activations after A(a) before the last microbatch's forward and backward through the stage and its gradient
back: A(a) + m x(a) + (F + I')(a..e) / s_max + x(a) + D(a). The term is the least of the one-node DP and the DP
over splits with at least one crossing stage.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

STAGE_DP_CELLS = 60_000_000
"""Most (layer, layer, devices, width) cells the stage DP of one shape may visit; larger shapes skip it."""


def spans(values: np.ndarray) -> np.ndarray:
    """[a, e] = sum of values[a..e] (meaningful for a <= e)."""
    prefix = np.concatenate([[0.0], np.cumsum(values)])
    return prefix[None, 1:] - prefix[:-1, None]


def stage_term(bounds: Any, rp: int, b: int) -> float:
    """The stage term of shape (rp, b) (module docstring); nan when the shape is too large to search.

    `bounds` is a planner.bound.ShapeBounds.
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
    grids, crossing = {}, {}
    for r, (fwd, back, inp) in costs.items():
        fits = upper & (static + bounds.saved_spans(b / r) <= bounds.memory_prefix[1])
        work = Work(m * spans(fwd) / s, m * spans(back) / s + steps, m * spans(inp) / s)
        moved = 1000.0 * (bounds.transfer_latency + cuts / r / bounds.transfer_rate)
        moved[0] = 0.0
        near = bounds.allreduce_ms(params, r * rp)
        grid = stage_grid(before_fwd, before_inp, turn, moved, work, near)
        grids[r] = np.where(fits, grid, np.inf)
        if not nodes:
            continue
        # crossing by its all-reduce (a ring of r rp >= 2 devices over two nodes) or by the boundary into it
        spread = stage_grid(before_fwd, before_inp, turn, moved, work, bounds.allreduce_ms(params, r * rp, across=True))
        spread = spread if r * rp >= 2 else np.full_like(spread, np.inf)
        far = 1000.0 * (bounds.latency_across + cuts / r / bounds.rate_across)
        far[0] = np.inf  # nothing flows into the first stage
        link = (before_fwd + (m + 1) * far + before_inp)[:, None] + spans(fwd + inp) / s
        cut = np.maximum(stage_grid(before_fwd, before_inp, turn, far, work, near), link)
        crossing[r] = np.where(fits, np.maximum(grid, np.minimum(spread, cut)), np.inf)
    best = split_dp(grids, n, layers)
    if not nodes:
        return float(best[n, 0])
    one_node = bounds.node_size // rp
    inside = float(best[min(n, one_node), 0]) if one_node >= 1 else math.inf
    return min(inside, float(split_dp(grids, n, layers, crossing, best)[n, 0]))


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
