"""The phase terms of the all-plan lower bound: no rank's backward starts before the first microbatch's forward
has passed every layer, and no rank's forward ends later than the whole backward path before the iteration's end.

They hold for every plan planner.bound.shape_bounds covers, chunk-stages and any DAG layer order included. Take a plan of shape
(rp, b) with m microbatches per pipeline; rank k runs on r_k devices per pipeline replica, the slowest of speed
s_k, and holds the layers L_k; each layer i has its rank's width r_i. With the per-layer costs of planner.bound.shape_bounds,
A = sum_i F_i(b/r_i) / s_max (one microbatch's forward through every layer) and D = sum_i I'_i(b/r_i) / s_max
(its backward through every layer):

- backward phase: T >= A + [m sum_{i in L_k} B'_i(b/r_k) + sum_{i in L_k} O_i] / s_k. A rank's first backward
  (B or I) for a microbatch needs that microbatch's forward through every layer (and its backward above the
  stage); every backward and weight-gradient action of the rank, and after them its optimizer step, follow it,
  one at a time.
- forward phase: T >= m sum_{i in L_k} F_i(b/r_k) / s_k + D. The rank's forwards run one at a time; after its last
  one, that microbatch still runs the backward of every layer, from the last down to the first.

Times r_k s_k and summed over the ranks (sum_k r_k s_k <= S, planner.bound.shape_bounds's summed speed):
T >= A + sum_i r_i (m B'_i + O_i)(b/r_i) / S and T >= D + sum_i r_i m F_i(b/r_i) / S. With planner.bound.shape_bounds's
compute term (T >= sum_i r_i (m (F + B')_i + O_i) / S) and path term (T >= A + D), each a sum over layers of a
cost at the layer's one width r_i, any convex combination of the four holds, and is at least the sum over layers
of the least, over r, of the combined per-layer cost. The term is the largest of that over the weights of
WEIGHTS.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

STEPS = 8
"""The weights of the four sums are multiples of 1 / STEPS that add up to 1."""
WEIGHTS = np.array([c for c in itertools.product(range(STEPS + 1), repeat=4) if sum(c) == STEPS], dtype=float) / STEPS
"""Every convex combination tried (each gives a valid bound; the largest counts)."""


def phase_term(bounds: Any, rp: int, b: int) -> float:
    """The largest convex combination of the compute, path and two phase sums at shape (rp, b) (module docstring);
    `bounds` is a planner.bound.shape_bounds.ShapeBounds."""
    request = bounds.request
    n = request.cluster.num_devices // rp
    m = request.global_batch // (rp * b)
    speed = min(float(bounds.speed_prefix[n]), float(bounds.speed_prefix[-1]) / rp)
    rows = []
    for r in bounds.widths(rp, b):
        fwd, back, inp = bounds.costs(b / r)
        forward, backward = r * m * fwd / speed, r * (m * back + bounds.optimizer) / speed
        down, up = fwd / bounds.s_max, inp / bounds.s_max
        rows.append([forward + backward, down + up, down + backward, up + forward])
    sums = np.transpose(np.array(rows), (1, 0, 2))  # [sum, width, layer]
    mixed = np.tensordot(WEIGHTS, sums, axes=(1, 0))  # [weights, width, layer]
    return float(mixed.min(axis=1).sum(axis=1).max())
