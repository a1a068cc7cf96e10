"""Plans exact simulates before its searches, for an early incumbent: straight and even pipelines on the devices in
a best ring's order, the suffix table's splits, and any new best plan polished (its cuts moved while faster).
They only find plans sooner; the searches still cover every plan. These functions make the plans; BranchAndBound.seed
and BranchAndBound.polish simulate them."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np

from pipeplan.planner.bound.placed_bounds import Placed
from pipeplan.planner.bound.shape_bounds import ShapeBounds
from pipeplan.planner.exact.stages import StageCosts, holds_one
from pipeplan.planner.exact.symmetry import link_tables
from pipeplan.planner.request import PlanRequest

POLISH_STEPS = (-1, 1, -2, 2, -4, 4)
"""Layers polish moves a cut of a plan by (either way)."""


RING_ORDER_DEVICES = 8
"""Largest cluster whose seeds take the devices in a best ring's order (the (n - 1)! rings from device 0 are tried)."""


def ring_order(request: PlanRequest) -> tuple[int, ...]:
    """The devices in the order of a ring whose slowest link is fastest (then whose largest latency is least; the
    first such ring in lexicographic order), or 0..n-1: the seeds' device order, so a seeded stage's all-reduce and
    its neighbours' transfers use good links (uniform links keep 0..n-1)."""
    cluster = request.cluster
    n = cluster.num_devices
    if n < 3 or n > RING_ORDER_DEVICES or cluster.allreduce_bytes_per_s is not None:
        return tuple(range(n))
    rates, latencies, _ = link_tables(cluster)
    rate, latency = rates.tolist(), latencies.tolist()
    best: tuple[float, float] | None = None
    order = tuple(range(n))
    for tail in itertools.permutations(range(1, n)):
        ring = (0, *tail)
        pairs = list(zip(ring, (*tail, 0), strict=True))
        key = (-min(rate[a][b] for a, b in pairs), max(latency[a][b] for a, b in pairs))
        if best is None or key < best:
            best, order = key, ring
    return order


def straight_split(layers: int, devices: int, rp: int) -> list[tuple[int, int, int]]:
    """A straight pipeline over all devices: as many one-device stages as devices allow, even layer counts
    ((first, last, devices per pipeline) per stage)."""
    depth = min(layers, devices // rp)
    cuts = [round(i * layers / depth) for i in range(depth + 1)]
    return [(cuts[i], cuts[i + 1] - 1, 1) for i in range(depth)]


def even_splits(bounds: ShapeBounds, devices: int, rp: int, size: int) -> Iterator[list[tuple[int, int, int]]]:
    """For every stage width r of the shape, n // r stages of r devices per pipeline, the layers cut where the
    forward and backward times at width r add up to equal parts."""
    layers = bounds.request.profile.num_layers
    for r in bounds.widths(rp, size):
        depth = min(layers, devices // (rp * r))
        fwd, back, _ = bounds.costs(size / r)
        sums = np.cumsum(fwd + back)
        cuts = [0]
        for i in range(1, depth):  # the first layer whose running sum passes i / depth of the total, >= 1 each
            at = int(np.searchsorted(sums, sums[-1] * i / depth, side="right"))
            cuts.append(min(max(at, cuts[-1] + 1), layers - (depth - i)))
        cuts.append(layers)
        yield [(cuts[i], cuts[i + 1] - 1, r) for i in range(depth)]


def place_split(costs: StageCosts, order: tuple[int, ...], split: list[tuple[int, int, int]], rp: int, size: int) -> list[Placed]:
    """The stages of a split ((first, last, devices per pipeline) per stage), each on the next devices of `order`
    (ring_order)."""
    groups, used = [], 0
    for first, last, r in split:
        groups.append((first, last, order[used : used + r * rp]))
        used += r * rp
    return place_all(costs, groups, rp, size)


def place_all(costs: StageCosts, groups: list[tuple[int, int, tuple[int, ...]]], rp: int, size: int) -> list[Placed]:
    """Stages (first layer, last layer, devices), each placed after the one before it."""
    stages: list[Placed] = []
    for first, last, devices in groups:
        stages.append(costs.place(first, last, devices, rp, size, stages[-1] if stages else None))
    return stages


def moves(costs: StageCosts, stages: list[Placed], rp: int, size: int) -> Iterator[list[Placed]]:
    """The plans one move of a cut away (each cut by POLISH_STEPS layers either way, in that order), their stages
    on the same devices, that hold one microbatch on every stage: what BranchAndBound.polish tries."""
    ends = [st.last for st in stages]
    for i, step in itertools.product(range(len(ends) - 1), POLISH_STEPS):
        end = ends[i] + step
        if not (ends[i - 1] + 1 if i else 0) <= end < ends[i + 1]:
            continue
        moved = [*ends[:i], end, *ends[i + 1 :]]
        groups = [(moved[s - 1] + 1 if s else 0, moved[s], st.devices) for s, st in enumerate(stages)]
        trial = place_all(costs, groups, rp, size)
        if all(holds_one(st) for st in trial):
            yield trial
