"""Tests of planner/refine.py: twin classes of devices (the local search skips swaps of twins)."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeplan.core.hardware.cluster import Cluster, Device
from pipeplan.planner.search.refine import twin_classes
from pipeplan.presets.resolve import load_cluster


def reference_twins(cluster: Cluster) -> tuple[int, ...]:
    """The definition, pair by pair and link by link: b joins the first earlier representative a with the same node,
    speed and memory, the same links to and from every other device, and a->b equal to b->a (bandwidth and latency:
    swapping a and b turns one into the other)."""
    n = cluster.num_devices
    bw, lat = cluster.bandwidth_bytes_per_s, cluster.latency_ms
    classes = list(range(n))
    for b in range(n):
        for a in range(b):
            da, db = cluster.devices[a], cluster.devices[b]
            if classes[a] != a or (da.node, da.speed, da.memory_bytes) != (db.node, db.speed, db.memory_bytes):
                continue
            others = [z for z in range(n) if z not in (a, b)]
            if (
                all(
                    bw[a][z] == bw[b][z] and bw[z][a] == bw[z][b] and lat[a][z] == lat[b][z] and lat[z][a] == lat[z][b]
                    for z in others
                )
                and bw[a][b] == bw[b][a]
                and lat[a][b] == lat[b][a]
            ):
                classes[b] = a
                break
    return tuple(classes)


@given(st.integers(1, 9), st.integers(1, 3), st.randoms(use_true_random=False), st.integers(0, 4))
@settings(max_examples=150, deadline=None)
def test_twin_classes_follow_the_definition(n: int, nodes: int, rng: random.Random, overrides: int) -> None:
    """Random two-level clusters with a few random link overrides (some asymmetric): the fast classes are the
    reference's."""
    devices = tuple(Device(i, "gpu", 16 * 2**30 * rng.choice((1, 1, 2)), 1.0, i % nodes) for i in range(n))
    bw = [[0.0 if a == b else (50e9 if a % nodes == b % nodes else 10e9) for b in range(n)] for a in range(n)]
    lat = [[0.0 if a == b else 5e-3 for b in range(n)] for a in range(n)]
    for _ in range(overrides if n > 1 else 0):
        a, b = rng.sample(range(n), 2)
        bw[a][b] = rng.choice((10e9, 25e9))
        if rng.random() < 0.5:
            lat[b][a] = 9e-3
    cluster = Cluster("r", devices, tuple(map(tuple, bw)), tuple(map(tuple, lat)))
    assert twin_classes(cluster) == reference_twins(cluster)


def test_twins_of_a_preset_are_the_gpus_of_one_nvlink_group() -> None:
    """On a DGX-1 (v100-8x1) no two GPUs have the same links (the hybrid cube-mesh); on a two-level preset every GPU of a
    node is its node's first GPU's twin."""
    assert twin_classes(load_cluster("v100-8x1")) == reference_twins(load_cluster("v100-8x1"))
    classes = twin_classes(load_cluster("a100-8x2"))
    assert classes == reference_twins(load_cluster("a100-8x2"))
    assert len(set(classes)) == 2
