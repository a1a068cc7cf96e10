"""Plans exact simulates before its searches, for an early incumbent: straight and even pipelines on the devices in
a best ring's order, the suffix table's splits, and any new best plan polished (its cuts moved while faster).
They only find plans sooner; the searches still cover every plan."""

from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING

import numpy as np

from pipeplan.planner.exact.stages import Placed, holds_one
from pipeplan.planner.exact.symmetry import link_tables
from pipeplan.planner.request import PlanRequest

if TYPE_CHECKING:
    from pipeplan.planner.exact.search import Search

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


def seed_straight(search: Search, rp: int, m: int, size: int) -> None:
    """Simulate a straight pipeline over all devices: as many one-device stages as devices allow, even layer counts."""
    layers = search.request.profile.num_layers
    depth = min(layers, search.request.cluster.num_devices // rp)
    cuts = [round(i * layers / depth) for i in range(depth + 1)]
    seed(search, [(cuts[i], cuts[i + 1] - 1, 1) for i in range(depth)], rp, m, size)


def seed(search: Search, split: list[tuple[int, int, int]], rp: int, m: int, size: int, always_polish: bool = False) -> None:
    """Simulate a split ((first, last, devices per pipeline) per stage), each stage on the next devices of
    ring_order; Search.finish polishes it when it is the best plan so far, and with `always_polish` in any case."""
    groups, used = [], 0
    for first, last, r in split:
        groups.append((first, last, search.order[used : used + r * rp]))
        used += r * rp
    stages = place_all(search, groups, rp, size)
    if stages and all(holds_one(st) for st in stages):
        search.finish(stages, rp, m, size, cap=math.inf if always_polish else None)


def place_all(search: Search, groups: list[tuple[int, int, tuple[int, ...]]], rp: int, size: int) -> list[Placed]:
    """Stages (first layer, last layer, devices), each placed after the one before it."""
    stages: list[Placed] = []
    for first, last, devices in groups:
        stages.append(search.costs.place(first, last, devices, rp, size, stages[-1] if stages else None))
    return stages


def polish(search: Search, stages: list[Placed], rp: int, m: int, size: int, time: float) -> None:
    """Move the cuts of a plan, its stages on the same devices, while a move makes it faster (each cut by
    POLISH_STEPS layers either way, the first faster plan taken): a better incumbent before the searches."""
    while True:
        ends = [st.last for st in stages]
        for i, step in itertools.product(range(len(ends) - 1), POLISH_STEPS):
            end = ends[i] + step
            if not (ends[i - 1] + 1 if i else 0) <= end < ends[i + 1]:
                continue
            moved = [*ends[:i], end, *ends[i + 1 :]]
            groups = [(moved[s - 1] + 1 if s else 0, moved[s], st.devices) for s, st in enumerate(stages)]
            trial = place_all(search, groups, rp, size)
            if all(holds_one(st) for st in trial):
                got = search.finish(trial, rp, m, size, cap=time)
                if got < time:
                    stages, time = trial, got
                    break
        else:
            return


def seed_even(search: Search, rp: int, m: int, size: int) -> None:
    """Simulate, for every stage width r of the shape, n // r stages of r devices per pipeline (ring_order), the
    layers cut where the forward and backward times at width r add up to equal parts."""
    layers = search.request.profile.num_layers
    for r in search.bounds.widths(rp, size):
        depth = min(layers, search.request.cluster.num_devices // (rp * r))
        fwd, back, _ = search.bounds.costs(size / r)
        sums = np.cumsum(fwd + back)
        cuts = [0]
        for i in range(1, depth):  # the first layer whose running sum passes i / depth of the total, >= 1 each
            at = int(np.searchsorted(sums, sums[-1] * i / depth, side="right"))
            cuts.append(min(max(at, cuts[-1] + 1), layers - (depth - i)))
        cuts.append(layers)
        seed(search, [(cuts[i], cuts[i + 1] - 1, r) for i in range(depth)], rp, m, size, always_polish=True)
