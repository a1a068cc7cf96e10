"""Tests of planner/search/dp_placement: the placement arrays of partition_dp against a plain loop over each stage's
devices (Layout.devices) and the cost model's ring formula (ring_allreduce_terms)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from pipeplan.planner.search.dp_placement import placement_arrays
from pipeplan.planner.search.mapping import Layout, device_orders
from pipeplan.presets.resolve import load_cluster
from pipeplan.sim.cost.link_model import link_matrices, ring_allreduce_terms

CLUSTERS = ["v100-8x2-25g", "pcie-4x4-10g", "hetero-a100-v100", "a100-8x2"]


def layouts(num_devices: int, order: tuple[int, ...]) -> list[tuple[Layout, int]]:
    """Every (layout, width) with 1, 2 and 4 pipeline replicas, units of 1 and 2 devices, both majors."""
    out = []
    for rp, unit, major in itertools.product((1, 2, 4), (1, 2), (True, False)):
        n = num_devices // rp
        if n % unit or (rp == 1 and not major):
            continue
        layout = Layout(order, rp, n, unit, major)
        out += [(layout, rho) for rho in range(1, layout.units + 1)]
    return out


@pytest.mark.parametrize("name", CLUSTERS)
def test_speed_memory_and_ring_of_every_stage_match_a_plain_loop(name: str) -> None:
    """Per first unit: the slowest device's speed, the smallest memory, and the ring all-reduce terms of the
    stage's devices over all pipeline replicas (0 for a single device), as a loop over Layout.devices gives them."""
    cluster = load_cluster(name)
    bandwidth, latency = link_matrices(cluster)
    order = device_orders(cluster, bandwidth)[0]
    for layout, rho in layouts(cluster.num_devices, order):
        got = placement_arrays(cluster, bandwidth, latency, layout, rho)
        for a in range(layout.units - rho + 1):
            devices = layout.devices(a, rho)
            assert got["speed"][a] == min(cluster.devices[d].speed for d in devices)
            assert got["memory"][a] == min(cluster.devices[d].memory_bytes for d in devices)
            if cluster.allreduce_bytes_per_s is None:
                factor, fixed = ring_allreduce_terms(cluster, devices)
                assert got["ring_factor"][a] == pytest.approx(factor, rel=1e-12, abs=0.0)
                assert got["ring_fixed"][a] == pytest.approx(fixed, rel=1e-12, abs=1e-15)


def position_device(layout: Layout, position: int, replica: int) -> int:
    """The device at per-pipeline position `position` of pipeline replica `replica` (from Layout.devices)."""
    return layout.devices(position // layout.unit, 1)[replica * layout.unit + position % layout.unit]


@pytest.mark.parametrize("name", CLUSTERS)
def test_outgoing_links_pair_each_device_with_the_one_below(name: str) -> None:
    """A stage at unit 0 (the pipeline's last) sends nothing (rate inf, latency 0). A stage at positions [top,
    top + r) of each replica sends to positions [top - r, top) of the same replica (clipped at 0: the top one repeats
    where fewer lie below), device i to device i; its rate is r times the slowest pair's (each pair at its slower
    direction; 0 if one cannot talk), its latency the largest of the pairs'."""
    cluster = load_cluster(name)
    bandwidth, latency = link_matrices(cluster)
    order = device_orders(cluster, bandwidth)[0]
    for layout, rho in layouts(cluster.num_devices, order):
        got = placement_arrays(cluster, bandwidth, latency, layout, rho)
        assert got["out_rate"][0] == np.inf and got["out_latency"][0] == 0.0
        r = rho * layout.unit
        for a in range(1, layout.units - rho + 1):
            top = a * layout.unit
            pairs = [
                (position_device(layout, top + i, t), position_device(layout, min(max(0, top - r) + i, top - 1), t))
                for t in range(layout.replicas)
                for i in range(r)
            ]
            rate = min(min(bandwidth[s, d], bandwidth[d, s]) for s, d in pairs)
            assert got["out_rate"][a] == (rate * r if rate > 0 else 0.0)
            assert got["out_latency"][a] == max(max(latency[s, d], latency[d, s]) for s, d in pairs)
