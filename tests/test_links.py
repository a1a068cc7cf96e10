"""Tests of sim.links: pair times, stage-boundary transfers and the ring all-reduce in closed form."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeplan.core.errors import ClusterError
from pipeplan.core.hardware.cluster import Cluster, Device
from pipeplan.presets.resolve import load_cluster
from pipeplan.sim.cost.flow_sets import boundary_flows, transfer_ms
from pipeplan.sim.cost.link_model import (
    measured_ring_share,
    pair_ms,
    ring_allreduce_ms,
    ring_allreduce_terms,
    ring_group_links,
)  # fmt: skip
from pipeplan.sim.cost.tensor_parallel import TensorTraffic, group_collectives_ms

GB = 1e9


def cluster(nic: float | None = None) -> Cluster:
    """Four devices, two per node: 100 GB/s and 1 us inside a node, 10 GB/s and 10 us between; 2 -> 3 is 50 GB/s, 3 us."""
    n = 4
    bw = [[0.0 if a == b else (100 * GB if a // 2 == b // 2 else 10 * GB) for b in range(n)] for a in range(n)]
    lat = [[0.0 if a == b else (1e-3 if a // 2 == b // 2 else 1e-2) for b in range(n)] for a in range(n)]  # ms
    bw[2][3], lat[2][3] = 50 * GB, 3e-3
    devices = tuple(Device(i, "gpu", 16 * 2**30, 1.0, i // 2) for i in range(n))
    return Cluster("links", devices, tuple(map(tuple, bw)), tuple(map(tuple, lat)), nic)


def without_link(c: Cluster, src: int, dst: int) -> Cluster:
    """c with bandwidth[src][dst] set to 0."""
    bw = [list(row) for row in c.bandwidth_bytes_per_s]
    bw[src][dst] = 0.0
    return dataclasses.replace(c, bandwidth_bytes_per_s=tuple(map(tuple, bw)))


def test_pair_ms_is_latency_plus_bytes_over_rate() -> None:
    """pair_ms = latency + bytes / bandwidth, in ms, for the ordered pair; 0 on one device."""
    c = cluster()
    assert pair_ms(c, 0, 1, 1e9) == pytest.approx(1e-3 + 10.0)
    assert pair_ms(c, 1, 2, 1e9) == pytest.approx(1e-2 + 100.0)
    assert pair_ms(c, 2, 3, 1e9) == pytest.approx(3e-3 + 20.0)
    assert pair_ms(c, 3, 2, 1e9) == pytest.approx(1e-3 + 10.0)  # the reverse direction keeps 100 GB/s
    assert pair_ms(c, 2, 2, 1e9) == 0.0


def test_pair_ms_is_capped_by_the_nic_between_nodes() -> None:
    """Across nodes the rate is min(pair bandwidth, NIC); inside a node the NIC does not apply."""
    c = cluster(nic=5 * GB)
    assert pair_ms(c, 1, 2, 1e9) == pytest.approx(1e-2 + 200.0)
    assert pair_ms(c, 0, 1, 1e9) == pytest.approx(1e-3 + 10.0)


def test_pair_ms_over_a_missing_link_names_the_pair() -> None:
    """A pair with zero bandwidth raises ClusterError naming it."""
    with pytest.raises(ClusterError, match=r"cluster 'links' bandwidth\[1\]\[2\] is 0 but devices 1 and 2 must talk"):
        pair_ms(without_link(cluster(), 1, 2), 1, 2, 1.0)


def test_pairing_takes_min_replicas_in_device_order() -> None:
    """q = min(r1, r2) pairs: replica t of one side with replica t of the other."""
    c = cluster()
    assert [f.link for f in boundary_flows(c, (0, 1), (2,), 1.0)] == [(0, 2)]
    assert [f.link for f in boundary_flows(c, (0,), (2, 3), 1.0)] == [(0, 2)]
    assert [f.link for f in boundary_flows(c, (0, 1), (3, 2), 1.0)] == [(0, 3), (1, 2)]


def test_transfer_ms_is_the_slowest_of_q_pairs_each_carrying_n_over_q() -> None:
    """Two senders to two receivers split n bytes in halves; the transfer takes its slowest pair."""
    c = cluster()
    # pairs 0->2 (10 GB/s, 10 us) and 1->3 (10 GB/s, 10 us), each 0.5 GB
    assert transfer_ms(c, (0, 1), (2, 3), 1e9) == pytest.approx(1e-2 + 50.0)
    # pairs 2->3 (50 GB/s) and 0->1 (100 GB/s) stay inside their nodes: the slower is 2->3
    assert transfer_ms(c, (2, 0), (3, 1), 1e9) == pytest.approx(3e-3 + 10.0)  # 2->3: 3 us + 10 ms; 0->1: 1 us + 5 ms
    assert transfer_ms(c, (0, 1, 2), (3,), 1e9) == pytest.approx(1e-2 + 100.0)  # q = 1: 0->3 carries it all


def test_transfer_on_one_device_costs_nothing() -> None:
    """Pairs on the same device need no flow: such a transfer takes 0 ms and has no flows."""
    c = cluster()
    assert boundary_flows(c, (1,), (1,), 1e9) == ()
    assert transfer_ms(c, (1,), (1,), 1e9) == 0.0
    # one of two pairs on one device: the other carries its half
    assert transfer_ms(c, (0, 1), (0, 3), 1e9) == pytest.approx(1e-2 + 50.0)


def test_boundary_flows_hold_the_pair_and_crossed_nics() -> None:
    """Each flow holds its ordered pair, plus nic_out/nic_in of the nodes when crossing with a NIC."""
    flows = boundary_flows(cluster(nic=5 * GB), (0, 1), (1, 2), 2e9)
    assert [f.resources for f in flows] == [("pair:0->1",), ("pair:1->2", "nic_out:0", "nic_in:1")]
    assert [f.work_ms for f in flows] == pytest.approx([10.0, 200.0])
    assert [f.latency_ms for f in flows] == pytest.approx([1e-3, 1e-2])


def test_ring_allreduce_uses_the_slowest_link_and_largest_latency() -> None:
    """2(n-1)/n * bytes / min ring bandwidth + 2(n-1) * max ring latency, over the ring in the given order."""
    c = cluster()
    # ring 0->1->2->3->0: links 100, 10, 50, 10 GB/s; latencies 1, 10, 3, 10 us
    assert ring_allreduce_ms(c, (0, 1, 2, 3), 4e9) == pytest.approx(2 * 3 / 4 * 4e9 / (10 * GB) * 1000 + 6 * 1e-2)
    # ring 2->3->2: 50 GB/s one way, 100 the other, latencies 3 and 1 us
    assert ring_allreduce_ms(c, (2, 3), 4e9) == pytest.approx(4e9 / (50 * GB) * 1000 + 2 * 3e-3)
    assert ring_allreduce_ms(c, (0, 1), 4e9) == pytest.approx(4e9 / (100 * GB) * 1000 + 2 * 1e-3)


def test_ring_allreduce_over_one_device_is_free() -> None:
    """One device has nothing to reduce: 0 ms, and (0, 0) terms."""
    assert ring_allreduce_ms(cluster(), (2,), 4e9) == 0.0
    assert ring_allreduce_terms(cluster(), (2,)) == (0.0, 0.0)


def test_ring_allreduce_is_capped_by_the_nic() -> None:
    """A ring crossing nodes runs at no more than the NIC rate."""
    c = cluster(nic=5 * GB)
    assert ring_allreduce_ms(c, (0, 2), 4e9) == pytest.approx(4e9 / (5 * GB) * 1000 + 2 * 1e-2)


def test_measured_allreduce_replaces_the_ring_links() -> None:
    """With allreduce_bytes_per_s/latency on the cluster, every ring uses them instead of its links."""
    c = dataclasses.replace(cluster(), allreduce_bytes_per_s=20 * GB, allreduce_latency_ms=7e-3)
    expected = 2 * 3 / 4 * 4e9 / (20 * GB) * 1000 + 6 * 7e-3
    assert ring_allreduce_ms(c, (0, 1, 2, 3), 4e9) == pytest.approx(expected)
    assert ring_allreduce_ms(c, (0, 1), 4e9) == pytest.approx(4e9 / (20 * GB) * 1000 + 2 * 7e-3)
    assert ring_allreduce_ms(c, (3,), 4e9) == 0.0
    per_byte, fixed = ring_allreduce_terms(c, (0, 1, 2, 3))
    assert per_byte == pytest.approx(1000 * 1.5 / (20 * GB))
    assert fixed == pytest.approx(6 * 7e-3)


def test_measured_allreduce_latency_defaults_to_zero() -> None:
    """A cluster with only allreduce_bytes_per_s has no fixed all-reduce time."""
    c = dataclasses.replace(cluster(), allreduce_bytes_per_s=20 * GB)
    assert ring_allreduce_terms(c, (0, 1))[1] == 0.0


@given(st.permutations(range(4)), st.integers(2, 4), st.floats(0.0, 1e10), st.booleans(), st.booleans())
def test_ring_allreduce_terms_agree_with_ring_allreduce_ms(
    order: list[int], n: int, nbytes: float, nic: bool, measured: bool
) -> None:
    """per_byte * bytes + fixed equals ring_allreduce_ms on any ring, with or without NIC and measured collective."""
    c = cluster(nic=5 * GB if nic else None)
    if measured:
        c = dataclasses.replace(c, allreduce_bytes_per_s=20 * GB, allreduce_latency_ms=7e-3)
    ring = tuple(order[:n])
    per_byte, fixed = ring_allreduce_terms(c, ring)
    assert per_byte * nbytes + fixed == pytest.approx(ring_allreduce_ms(c, ring, nbytes), rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("measured", [False, True])
def test_zero_bandwidth_between_ring_neighbours_names_the_pair(measured: bool) -> None:
    """A ring whose neighbours cannot talk raises ClusterError naming the pair, even with a measured all-reduce."""
    c = without_link(cluster(), 2, 3)
    if measured:
        c = dataclasses.replace(c, allreduce_bytes_per_s=20 * GB)
    for call in (lambda: ring_allreduce_ms(c, (1, 2, 3), 1e9), lambda: ring_allreduce_terms(c, (1, 2, 3))):
        with pytest.raises(ClusterError, match=r"bandwidth\[2\]\[3\] is 0 but devices 2 and 3 must talk"):
            call()
    # the reverse ring 3->2->1->3 does not use 2->3
    assert ring_allreduce_ms(c, (3, 2, 1), 1e9) > 0.0


def test_message_latency_adds_to_every_pair_but_not_to_a_device_itself() -> None:
    """A cluster's message latency is part of every off-device message: pair_ms, flows and the planners' arrays."""
    from pipeplan.sim.cost.link_model import link_arrays

    c = dataclasses.replace(cluster(), message_latency_ms=2.0)
    assert c.link_latency(0, 1) == pytest.approx(1e-3 + 2.0)
    assert c.link_latency(1, 1) == 0.0
    assert pair_ms(c, 0, 1, 1e9) == pytest.approx(1e-3 + 2.0 + 10.0)
    assert pair_ms(c, 2, 2, 1e9) == 0.0
    (flow,) = boundary_flows(c, (1,), (2,), 1e9)
    assert flow.latency_ms == pytest.approx(1e-2 + 2.0)
    _, latency = link_arrays(c)
    assert latency[2, 3] == pytest.approx(3e-3 + 2.0)
    assert latency[3, 3] == 0.0
    # the ring's latency is a message's too (the cluster measured no all-reduce of its own)
    base = ring_allreduce_ms(cluster(), (0, 1), 1e9)
    assert ring_allreduce_ms(c, (0, 1), 1e9) == pytest.approx(base + 2 * 2.0)


def test_ring_group_links_gives_each_rings_slowest_link_and_largest_latency() -> None:
    """Row by row: ring (0, 1, 2, 3) meets 10 GB/s and 10 us across nodes; (2, 3) its 50 GB/s, 3 us link and
    3 -> 2's 100 GB/s, 1 us (the slowest and the largest); (0, 1) 100 GB/s, 1 us."""
    c = cluster()
    rates, latencies = ring_group_links(c, np.array([[0, 1, 2, 3]]))
    assert (rates.tolist(), latencies.tolist()) == ([10 * GB], [1e-2])
    rates, latencies = ring_group_links(c, np.array([[2, 3], [0, 1]]))
    assert (rates.tolist(), latencies.tolist()) == ([50 * GB, 100 * GB], [3e-3, 1e-3])
    with pytest.raises(ClusterError, match=r"bandwidth\[2\]\[3\] is 0 but devices 2 and 3 must talk"):
        ring_group_links(without_link(c, 2, 3), np.array([[0, 1], [2, 3]]))


def test_tensor_parallel_groups_are_priced_on_the_shared_ring_links() -> None:
    """group_collectives_ms over groups (0, 1) and (2, 3): 2(t-1)/t x bytes / slowest + count x 2(t-1) x latency of
    the slower group, whose links come from ring_group_links (the same as the data-parallel ring's)."""
    traffic = TensorTraffic(fwd_bytes=3e9, fwd_count=2, bwd_bytes=5e9, bwd_count=3)
    fwd, bwd = group_collectives_ms(cluster(), (0, 1, 2, 3), 2, traffic)
    assert fwd == 3e9 / (50 * GB) * 1000 + 2 * 2 * 3e-3
    assert bwd == 5e9 / (50 * GB) * 1000 + 3 * 2 * 3e-3


def test_a_measured_allreduce_is_shared_by_the_rings_holding_part_of_each_node() -> None:
    """Across nodes a ring gets (its devices on a node / the node's devices) of the measured bus bandwidth, the
    smallest over its nodes; on one node all of it. On 4 DGX A100 (192 GB/s measured across nodes): a ring of one
    GPU per node (a tensor-parallel rank's data-parallel ring at t = 8) runs at one NIC's 24 GB/s."""
    c = dataclasses.replace(cluster(), allreduce_bytes_per_s=20 * GB, allreduce_latency_ms=7e-3)
    assert measured_ring_share(c, (0, 1, 2, 3)) == 1.0
    assert measured_ring_share(c, (0, 1)) == 1.0
    assert measured_ring_share(c, (0, 2)) == 0.5
    assert measured_ring_share(c, (0, 1, 2)) == 0.5
    assert ring_allreduce_ms(c, (0, 2), 4e9) == 4e9 / (0.5 * 20 * GB) * 1000 + 2 * 7e-3
    dgx = load_cluster("dgx-a100-8x4")
    assert dgx.allreduce_bytes_per_s == 192e9
    assert measured_ring_share(dgx, (0, 8, 16, 24)) == 1 / 8
    assert ring_allreduce_terms(dgx, (0, 8, 16, 24))[0] == 1000 * 2 * 3 / 4 / (192e9 / 8)
    assert measured_ring_share(dgx, tuple(range(0, 32, 2))) == 0.5
    assert measured_ring_share(dgx, tuple(range(32))) == 1.0
    assert measured_ring_share(dgx, tuple(range(8))) == 1.0


@given(st.lists(st.permutations(range(4)), min_size=1, max_size=12), st.lists(st.integers(2, 4), min_size=12, max_size=12))
def test_a_ring_priced_again_is_priced_as_the_first_time_from_the_dense_links(orders: list[list[int]], sizes: list[int]) -> None:
    """Rings priced in any sequence, repeats included (link_model keeps each ring's links per cluster), each equal the
    closed form over the dense link matrices: 2(n-1)/n bytes / (its slowest link) + 2(n-1) x its largest latency."""
    c = cluster(nic=5 * GB)
    rate = np.array(c.bandwidth_bytes_per_s, dtype=float)
    nodes = np.array([d.node for d in c.devices])
    rate = np.where(nodes[:, None] != nodes[None, :], np.minimum(rate, 5 * GB), rate)
    latency = np.array(c.latency_ms, dtype=float)
    for order, n in zip(orders * 2, sizes * 2, strict=False):
        ring = tuple(order[:n])
        links = list(zip(ring, ring[1:] + ring[:1], strict=True))
        slowest, largest = min(rate[a, b] for a, b in links), max(latency[a, b] for a, b in links)
        want = 2 * (n - 1) / n * 4e9 / slowest * 1000 + 2 * (n - 1) * largest
        assert ring_allreduce_ms(c, ring, 4e9) == pytest.approx(want, rel=1e-12)


def test_a_ring_over_a_dead_link_is_refused_every_time_it_is_priced() -> None:
    """A refused ring is not kept: pricing it again raises again, naming the pair."""
    c = without_link(cluster(), 2, 3)
    for _ in range(2):
        with pytest.raises(ClusterError, match=r"2.*3"):
            ring_allreduce_ms(c, (0, 1, 2, 3), 4e9)
