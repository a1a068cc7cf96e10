"""presets.calibrated: the DGX A100 / H100 families, their measured numbers where the cost model reads them."""

from __future__ import annotations

import math

import pytest

from pipeplan.core.errors import ClusterError
from pipeplan.io.cluster_json import cluster_from_json, cluster_to_json
from pipeplan.presets import calibrated
from pipeplan.presets.resolve import list_clusters, load_cluster
from pipeplan.sim.cost.link_model import ring_allreduce_ms


@pytest.mark.parametrize("nodes", [1, 2, 48, 384])
def test_a100_family_carries_the_measured_rates(nodes: int) -> None:
    """dgx-a100-8xN: N x 8 A100-80GB, NVSwitch ring 232.5 GB/s inside, 24 GB/s per NIC, 8 NICs, 73.7% matmuls."""
    cluster = load_cluster(f"dgx-a100-8x{nodes}")
    assert cluster.num_devices == 8 * nodes and cluster.num_nodes == nodes
    assert {d.kind for d in cluster.devices} == {"A100-80GB"}
    assert {d.matmul_fraction for d in cluster.devices} == {0.737}
    assert cluster.link_bandwidth(0, 1) == 232.5e9
    if nodes > 1:
        assert cluster.link_bandwidth(0, 8) == 24e9
        assert cluster.nic_bytes_per_s == 8 * 24e9
        assert cluster.allreduce_bytes_per_s == 8 * 24e9
    else:
        assert cluster.allreduce_bytes_per_s == 232.5e9


def test_h100_family_all_reduces_at_nvls_on_one_node_and_at_the_nics_across() -> None:
    """dgx-h100-8x1's all-reduce is NVLink SHARP's 476 GB/s; across nodes it is 8 NICs x 47 GB/s."""
    one, many = load_cluster("dgx-h100-8x1"), load_cluster("dgx-h100-8x4")
    assert one.allreduce_bytes_per_s == 476e9
    assert many.allreduce_bytes_per_s == 8 * 47e9
    assert many.link_bandwidth(0, 1) == 370e9 and many.link_bandwidth(0, 8) == 47e9
    assert {d.matmul_fraction for d in many.devices} == {0.801}


def test_fractions_are_the_published_ratios() -> None:
    """Each matmul fraction is its source's achieved TFLOP/s over the datasheet peak, to the 3 digits given: the A100's
    and V100's sustained 230 / 312 and 95 / 125, the A100's burst 267.9 / 312 (not priced), the H100's 792.1 / 989."""
    assert round(230 / 312, 3) == calibrated.A100_MATMUL_FRACTION
    assert round(95 / 125, 3) == calibrated.V100_MATMUL_FRACTION
    assert round(267.9 / 312, 3) == calibrated.A100_MATMUL_BURST_FRACTION
    assert round(792.1 / 989, 3) == calibrated.H100_MATMUL_FRACTION
    assert calibrated.A100_MATMUL_FRACTION < calibrated.A100_MATMUL_BURST_FRACTION
    assert calibrated.MATMUL_FRACTIONS["A100"] == calibrated.MATMUL_FRACTIONS["A100-80GB"] == 0.737


@pytest.mark.parametrize("nodes", [2, 4])
def test_a_cross_node_ring_all_reduces_at_the_measured_bus_bandwidth(nodes: int) -> None:
    """A ring over every GPU of dgx-a100-8xN takes 2 (n - 1) / n x S / busbw + 2 (n - 1) x latency, busbw the measured
    8 x 24 GB/s and the latency InfiniBand's nominal 10 us: the closed form to 1e-12."""
    cluster = load_cluster(f"dgx-a100-8x{nodes}")
    n, size = cluster.num_devices, 3.7e9
    expected = 2 * (n - 1) / n * size / (8 * 24e9) * 1e3 + 2 * (n - 1) * 10e-3
    assert math.isclose(ring_allreduce_ms(cluster, tuple(range(n)), size), expected, rel_tol=1e-12)


@pytest.mark.parametrize("name", ["dgx-a100-8x0", "dgx-a100-8x", "dgx-a100-4x2", "dgx-b200-8x2", "dgx-a100-8x01"])
def test_a_bad_calibrated_name_is_refused_naming_the_families(name: str) -> None:
    """A `dgx-` name outside the families is one ClusterError naming both of them."""
    with pytest.raises(ClusterError, match=r"dgx-a100-8x<N> and dgx-h100-8x<N>"):
        load_cluster(name)


def test_calibrated_presets_round_trip_and_stay_out_of_the_fixed_list() -> None:
    """A calibrated cluster writes and reads back equal; the fixed built-ins (benchmarks' matrix) do not change."""
    cluster = load_cluster("dgx-h100-8x2")
    again = cluster_from_json(cluster_to_json(cluster))
    assert again.devices == cluster.devices
    assert again.allreduce_bytes_per_s == cluster.allreduce_bytes_per_s
    assert not any(name.startswith("dgx-") for name in list_clusters())


def test_a_one_node_h100_ring_all_reduces_at_nvlink_sharps_bus_bandwidth() -> None:
    """A ring over dgx-h100-8x1's 8 GPUs: 2 x 7 / 8 x S / 476 GB/s + 14 x 5 us, the closed form to 1e-12."""
    cluster = load_cluster("dgx-h100-8x1")
    size = 2.5e9
    expected = 2 * 7 / 8 * size / 476e9 * 1e3 + 14 * 5e-3
    assert math.isclose(ring_allreduce_ms(cluster, tuple(range(8)), size), expected, rel_tol=1e-12)
