"""Tests of planner.search.mapping: the device orders the search tries and the layouts that place stages on them."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeplan.core.hardware.cluster import Cluster, Device
from pipeplan.core.hardware.links import DenseLinks, NodeLinks
from pipeplan.planner.search.mapping import EXHAUSTIVE_ORDERS, Layout, chain_order, device_orders
from pipeplan.presets.resolve import load_cluster
from pipeplan.sim.cost.link_model import link_matrices


def test_chain_order_walks_a_node_before_it_crosses_the_network() -> None:
    """On two 8-GPU nodes over 25 Gb/s, the greedy chain from device 0 visits all of node 0 before node 1."""
    cluster = load_cluster("v100-8x2-25g")
    bandwidth, _ = link_matrices(cluster)
    order = chain_order(bandwidth, 0)
    assert sorted(order) == list(range(16))
    assert {cluster.devices[d].node for d in order[:8]} == {0}


def test_chain_order_takes_the_fastest_link_and_the_lowest_id_on_ties() -> None:
    """From 0, the chain goes to the device with the fastest link both ways; equal links go to the lower id."""
    bandwidth = np.array([[0, 1, 5, 5], [1, 0, 1, 1], [5, 1, 0, 9], [5, 1, 9, 0]], dtype=float)
    assert chain_order(bandwidth, 0) == [0, 2, 3, 1]
    assert chain_order(bandwidth, 0, allowed=[0, 1, 3]) == [0, 3, 1]


def test_device_orders_are_permutations_without_twin_repeats() -> None:
    """Every order holds each device once; no two orders are the same up to twin devices."""
    cluster = load_cluster("hetero-a100-v100")
    bandwidth, _ = link_matrices(cluster)
    twins = tuple(range(cluster.num_devices))
    orders = device_orders(cluster, bandwidth, twins)
    assert orders and all(sorted(o) == list(range(cluster.num_devices)) for o in orders)
    assert len({tuple(twins[d] for d in o) for o in orders}) == len(orders)


def test_small_clusters_get_every_order() -> None:
    """Up to EXHAUSTIVE_ORDERS devices with no twins, every permutation is tried (4 devices: 24 orders)."""
    assert EXHAUSTIVE_ORDERS >= 4
    devices = tuple(Device(i, "v100", 32e9, speed=1.0 + i) for i in range(4))
    bandwidth = np.full((4, 4), 10e9)
    cluster = Cluster("four", devices, bandwidth, np.zeros((4, 4)))
    orders = device_orders(cluster, bandwidth, tuple(range(4)))
    assert sorted(orders) == sorted(itertools.permutations(range(4)))


def test_layouts_place_replicas_by_pipeline_or_by_stage() -> None:
    """Replica-major: each pipeline replica owns a contiguous slice; stage-major: each stage owns one."""
    order = tuple(range(8))
    by_pipeline = Layout(order, replicas=2, per_pipeline=4, unit=1, replica_major=True)
    assert by_pipeline.units == 4
    assert by_pipeline.devices(1, 2) == (1, 2, 5, 6)
    by_stage = Layout(order, replicas=2, per_pipeline=4, unit=1, replica_major=False)
    assert by_stage.devices(1, 2) == (2, 3, 4, 5)
    wide = Layout(order, replicas=1, per_pipeline=8, unit=2, replica_major=True)
    assert wide.units == 4 and wide.devices(3, 1) == (6, 7)


@settings(max_examples=60, deadline=None)
@given(
    nodes=st.lists(st.integers(0, 5), min_size=1, max_size=30),
    rates=st.sampled_from([(2.0, 1.0), (1.0, 1.0), (5.0, 0.5)]),
    data=st.data(),
)
def test_node_chain_equals_the_dense_greedy_chain(nodes: list[int], rates: tuple[float, float], data: st.DataObject) -> None:
    """On a two-level cluster (any node labels, a subset allowed or not) the fast walk gives the dense walk's order."""
    links = NodeLinks(np.array(nodes), rates[0], rates[1], np.inf)
    n = len(nodes)
    allowed = data.draw(st.none() | st.lists(st.integers(0, n - 1), min_size=1, unique=True).map(sorted))
    start = data.draw(st.sampled_from(allowed if allowed else list(range(n))))
    assert chain_order(links, start, allowed) == chain_order(DenseLinks(links.dense()), start, allowed)
