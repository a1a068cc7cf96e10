"""Tests of exact's symmetry rule and per-device-set tables: automorphisms keep every time, the search stays exact."""

from __future__ import annotations

import itertools
import random

import pytest

from pipeplan.core.hardware.cluster import Cluster, Device
from pipeplan.planner.exact import plan_exact
from pipeplan.planner.exact.search import BranchAndBound
from pipeplan.planner.exact.symmetry import automorphisms, least_in_orbit
from pipeplan.planner.plan_space import EXACT_SCHEDULES as SCHEDULES
from pipeplan.planner.request import PlanRequest
from pipeplan.planner.search.refine import twin_classes
from pipeplan.presets.resolve import load_cluster
from pipeplan.sim.cost.link_model import pair_ms, ring_allreduce_ms
from planner_instances import GIB, random_profile
from test_exact import brute_force


def ring_cluster(seed: int) -> Cluster:
    """4 devices on a ring of links: 0-1 and 2-3 fast, 1-2 and 3-0 slower, diagonals slow (a symmetry, no twins)."""
    rng = random.Random(seed)
    fast, mid, slow = (rng.uniform(lo, hi) * 1e9 for lo, hi in ((30, 50), (10, 25), (1, 5)))
    level = {frozenset({0, 1}): fast, frozenset({2, 3}): fast, frozenset({1, 2}): mid, frozenset({0, 3}): mid}
    bandwidth = tuple(tuple(0.0 if a == b else level.get(frozenset({a, b}), slow) for b in range(4)) for a in range(4))
    latency = tuple(tuple(0.0 if a == b else 5e-3 for b in range(4)) for a in range(4))
    devices = tuple(Device(i, "gpu", 16 * GIB, 1.0, 0) for i in range(4))
    return Cluster(f"ring-{seed}", devices, bandwidth, latency)


def test_automorphisms_are_exactly_the_permutations_keeping_every_link() -> None:
    """On the v100-8x1 preset and a 4-device ring: the group equals the brute-force set of link-keeping permutations."""
    for cluster in (load_cluster("v100-8x1"), ring_cluster(0)):
        n = cluster.num_devices
        keeps = [
            g
            for g in itertools.permutations(range(n))
            if any(g[d] != d for d in range(n))
            and all(pair_ms(cluster, a, b, 1e6) == pair_ms(cluster, g[a], g[b], 1e6) for a in range(n) for b in range(n))
        ]
        assert automorphisms(cluster) == tuple(keeps)
        assert keeps and len(set(twin_classes(cluster))) == n


def test_automorphisms_keep_ring_all_reduce_times() -> None:
    """Every ring of the preset v100-8x1 takes the same all-reduce time as its image under each automorphism."""
    cluster = load_cluster("v100-8x1")
    group = automorphisms(cluster)
    for ring in itertools.permutations(range(8), 4):
        for g in group:
            assert ring_allreduce_ms(cluster, ring, 1e8) == ring_allreduce_ms(cluster, tuple(g[d] for d in ring), 1e8)


def test_least_in_orbit_keeps_one_sequence_per_orbit() -> None:
    """Of all ordered device tuples of the preset v100-8x1, exactly one per orbit passes, and prefixes of it pass."""
    cluster = load_cluster("v100-8x1")
    group = automorphisms(cluster)
    for length in (1, 2, 3):
        tuples = list(itertools.permutations(range(8), length))
        orbits = {min(tuple(g[d] for d in t) for g in ((*range(8),), *group)) for t in tuples}
        kept = [t for t in tuples if least_in_orbit(t, group)]
        assert sorted(kept) == sorted(orbits)
        assert all(least_in_orbit(t[:-1], group) for t in kept)


@pytest.mark.parametrize("seed", [0, 1])
def test_exact_with_symmetry_equals_brute_force(seed: int) -> None:
    """4 layers on the symmetric 4-device ring, batch 4: exact (one sequence per orbit) finds brute force's optimum."""
    request = PlanRequest(random_profile(seed, 4), ring_cluster(seed), 4)
    assert automorphisms(request.cluster)
    assert plan_exact(request).iteration_time == pytest.approx(brute_force(request), rel=1e-12)


@pytest.mark.parametrize("seed", [2, 3])
def test_symmetry_rule_keeps_the_optimum_of_the_full_walk(seed: int) -> None:
    """6 layers on the ring, batch 8: the search with the group gives the same time as without it, on fewer nodes."""
    request = PlanRequest(random_profile(seed, 6), ring_cluster(seed), 8)
    classes = twin_classes(request.cluster)
    with_group = BranchAndBound(request, SCHEDULES, classes, automorphisms(request.cluster))
    without = BranchAndBound(request, SCHEDULES, classes, ())
    with_group.run()
    without.run()
    assert with_group.best_time == without.best_time
    assert with_group.nodes <= without.nodes
