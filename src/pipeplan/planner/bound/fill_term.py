"""The fill-and-drain term of the all-plan lower bound: ranks that start late lose the path before their first layer.

It holds for every plan planner.bound.shape_bounds covers, chunk-stages (interleaved, `list` with chunks) included. Take a plan
of shape (rp, b), m = G / (rp b) microbatches per pipeline. Its pipeline has ranks k = 0..p-1, rank k on r_k
devices per pipeline replica (sum r_k <= n = N // rp) whose slowest has speed s_k; it runs the chunk-stages
L_k (any layers) and its first layer is a_k (the ranks' first layers are distinct; the rank of layer 0 has
a = 0). With A(a) = sum_{i<a} min_r F_i(b/r) / s_max and D(a) = sum_{i<a} min_r I'_i(b/r) / s_max (the forward
and the backward-input path of the layers before position a of the plan's layer order, at their fastest width
and the fastest speed; as the order may be any topological order of a DAG, the term uses the a cheapest layers,
which cost no more), each rank gives

  (R1) T >= A(a_k) + [m sum_{i in L_k} (F_i + B'_i)(b/r_k) + sum_{i in L_k} O_i] / s_k,
  (R2) T >= A(a_k) + m sum_{i in L_k} (F_i + I'_i)(b/r_k) / s_k + D(a_k).

(R1): every action of a microbatch at a stage waits for that microbatch's forward through every earlier layer,
so the rank's first action starts after A(a_k); it runs its actions one at a time, and its optimizer step after
the last. (R2): every forward and backward (B or I) of the rank precedes, through the microbatch's backward chain,
the backward of its lowest stage for that microbatch; after the last of those, the microbatch's backward still
passes every layer before a_k. For any w in [0, 1], w (R1) + (1 - w) (R2) times r_k s_k, summed over the ranks:

  S_used T >= sum_k r_k s_k (A + (1 - w) D)(a_k) + sum_i r_(i) [m (F + w B' + (1 - w) I')_i(b/r_(i)) + w O_i],

with r_(i) the width of layer i's rank and S_used = sum_k r_k s_k. Let R be the widest rank: every layer's width
is a divisor of b at most R, S_used is at most the speed of the min(n, p R) fastest devices (and of all devices
over rp), and the p - 1 ranks other than layer 0's start at distinct layers >= 1, so their loss is at least
s_min sum_{j=1}^{p-1} (A + (1 - w) D)(j), s_min the slowest device's speed. The term is the least over (p, R),
p <= n - R + 1, of the largest over w of the resulting bound on T; one width per layer serves every w.
"""

from __future__ import annotations

from typing import Any

import numpy as np

FILL_MIXES = 11
"""Weights w in [0, 1] tried for (R1) and (R2) (each gives a valid bound for every (p, R); the largest counts)."""


def fill_term(bounds: Any, rp: int, b: int) -> float:
    """The fill-and-drain bound of shape (rp, b) (module docstring); `bounds` is a planner.bound.shape_bounds.ShapeBounds."""
    request = bounds.request
    n = request.cluster.num_devices // rp
    m = request.global_batch // (rp * b)
    widths = bounds.widths(rp, b)
    costs = [bounds.costs(b / r) for r in widths]
    # the layers before a rank's first layer depend on the plan's layer order (a DAG's plans may reorder): the j
    # layers before position j cost at least the j cheapest layers
    fwd_min = np.sort(np.min([c[0] for c in costs], axis=0))[: n - 1]
    inp_min = np.sort(np.min([c[2] for c in costs], axis=0))[: n - 1]
    before_fwd = np.concatenate([[0.0], np.cumsum(fwd_min)]) / bounds.s_max  # A(j), j = 0..
    before_inp = np.concatenate([[0.0], np.cumsum(inp_min)]) / bounds.s_max  # D(j)
    s_min = float(bounds.speed_prefix[-1] - bounds.speed_prefix[-2])
    total = float(bounds.speed_prefix[-1]) / rp
    best = np.inf
    weights = np.linspace(0.0, 1.0, FILL_MIXES)
    # per (w, width): every layer's device-time at that width, then the cheapest at widths <= R (widths increase)
    pairs = list(zip(widths, costs, strict=True))
    per_width = np.array(
        [[r * (m * (f + w * back + (1 - w) * inp) + w * bounds.optimizer) for r, (f, back, inp) in pairs] for w in weights]
    )
    cheapest = np.minimum.accumulate(per_width, axis=1).sum(axis=2)  # [w, R]
    for k, r_max in enumerate(widths):
        ranks = np.arange(1, min(n - r_max + 1, len(bounds.optimizer)) + 1)  # p: each rank holds a layer
        if len(ranks) == 0:
            continue
        speed = np.minimum(bounds.speed_prefix[np.minimum(n, ranks * r_max)], total)
        values = []
        for j, w in enumerate(weights):
            start = before_fwd[: len(ranks)] + (1 - w) * before_inp[: len(ranks)]  # rank j's least start cost, j < p
            loss = s_min * (np.cumsum(start) - start[0])  # sum_{j=1}^{p-1}
            values.append((loss + cheapest[j, k]) / speed)
        best = min(best, float(np.max(values, axis=0).min()))
    return best
