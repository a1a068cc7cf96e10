"""presets.calibrated_v100: the seeds' V100 clusters, their measured 25 Gb/s rate where the cost model reads it."""

from __future__ import annotations

import math

import pytest

from cli_runner import run
from pipeplan.core.errors import ClusterError
from pipeplan.io.cluster_json import cluster_from_json, cluster_to_json
from pipeplan.presets import calibrated_v100
from pipeplan.presets.clusters import DGX1_NVLINKS
from pipeplan.presets.resolve import list_clusters, load_cluster
from pipeplan.sim.cost.link_model import ring_allreduce_ms

MEASURED = 1.7e9  # bytes/s: NCCL over 25 Gb/s TCP, nccl-tests issue #83
ETH_MS = 50e-3  # the nominal 50 us per Ethernet message, in ms


@pytest.mark.parametrize("servers", [1, 2, 4])
def test_p3_family_is_dgx1_servers_joined_at_the_measured_25g_rate(servers: int) -> None:
    """p3-v100-8xN: N x 8 V100 (speed 1.0, matmul 0.76) on the hybrid cube-mesh (25 GB/s per NVLink, the 10 GB/s host
    path elsewhere), 1.7 GB/s between servers and as each server's NIC limit."""
    cluster = load_cluster(f"p3-v100-8x{servers}")
    assert cluster.num_devices == 8 * servers and cluster.num_nodes == servers
    assert {(d.kind, d.speed, d.matmul_fraction) for d in cluster.devices} == {("V100", 1.0, 0.76)}
    for node in range(servers):
        for (a, b), links in DGX1_NVLINKS.items():
            assert cluster.link_bandwidth(8 * node + a, 8 * node + b) == links * 25e9
        assert cluster.link_bandwidth(8 * node, 8 * node + 5) == 10e9  # GPUs 0 and 5: no NVLink
    if servers > 1:
        assert cluster.link_bandwidth(0, 8) == MEASURED and cluster.nic_bytes_per_s == MEASURED
    assert cluster.allreduce_bytes_per_s is None


@pytest.mark.parametrize(("name", "n"), [("p3-v100-8x2", 16), ("eth-v100-1x16", 16), ("eth-v100-1x3", 3)])
def test_a_ring_across_servers_all_reduces_at_the_measured_bus_bandwidth(name: str, n: int) -> None:
    """A ring over every GPU, crossing servers at the measured 1.7 GB/s (its slowest link), takes
    2 (n - 1) / n x S / 1.7 GB/s + 2 (n - 1) x 50 us: the closed form of nccl-tests' bus bandwidth, to 1e-12."""
    cluster = load_cluster(name)
    size = 553.4e6
    expected = 2 * (n - 1) / n * size / MEASURED * 1e3 + 2 * (n - 1) * ETH_MS
    assert math.isclose(ring_allreduce_ms(cluster, tuple(range(n)), size), expected, rel_tol=1e-12)


def test_nc_family_is_nominal_pcie_and_10g() -> None:
    """nc-v100-4xN: 4 V100 PCIe (speed 0.89, no matmul fraction) per server, PCIe 3.0 12 GB/s inside, 10 Gb/s = 1.25
    GB/s between servers; its ring all-reduce is the same closed form at 1.25 GB/s."""
    cluster = load_cluster("nc-v100-4x4")
    assert cluster.num_devices == 16 and cluster.num_nodes == 4
    assert {(d.kind, d.speed, d.matmul_fraction) for d in cluster.devices} == {("V100", 0.89, None)}
    assert cluster.link_bandwidth(0, 1) == 12e9 and cluster.link_bandwidth(0, 4) == 1.25e9
    assert cluster.nic_bytes_per_s == 1.25e9
    expected = 2 * 15 / 16 * 1e9 / 1.25e9 * 1e3 + 2 * 15 * ETH_MS
    assert math.isclose(ring_allreduce_ms(cluster, tuple(range(16)), 1e9), expected, rel_tol=1e-12)


def test_the_measured_rate_is_below_the_line_rate() -> None:
    """NCCL's 1.7 GB/s is what TCP gave it of 25 Gb/s's 3.125 GB/s; 10 Gb/s stays at its line rate (nominal)."""
    assert calibrated_v100.ETH_25G_NCCL_GB_PER_S < 25 / 8
    assert calibrated_v100.ETH_10G_GB_PER_S_NOMINAL == 10 / 8


@pytest.mark.parametrize("name", ["p3-v100-8x0", "p3-v100-4x2", "nc-v100-8x2", "eth-v100-2x8", "eth-v100-1x"])
def test_a_bad_v100_name_is_refused_naming_the_families(name: str) -> None:
    """A name with a V100 family's prefix that is no family is one ClusterError naming the three families."""
    with pytest.raises(ClusterError, match=r"p3-v100-8x<N>, nc-v100-4x<N>, eth-v100-1x<N>"):
        load_cluster(name)


def test_v100_presets_round_trip_and_stay_out_of_the_fixed_list() -> None:
    """Each family writes and reads back equal; none is in the fixed built-ins' list (the benchmarks' matrix)."""
    for name in ("p3-v100-8x2", "nc-v100-4x2", "eth-v100-1x4"):
        cluster = load_cluster(name)
        again = cluster_from_json(cluster_to_json(cluster))
        assert again.devices == cluster.devices and again.nic_bytes_per_s == cluster.nic_bytes_per_s
    assert not any(calibrated_v100.is_v100_name(name) for name in list_clusters())


def test_the_cli_refuses_a_bad_v100_name_in_one_line_with_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`pipeplan show cluster p3-v100-4x2`: exit 2, one line on stderr naming the name and the three families."""
    code, out, err = run(monkeypatch, capsys, "show", "cluster", "p3-v100-4x2")
    assert code == 2 and out == ""
    assert err == (
        "error: ClusterError: unknown calibrated cluster 'p3-v100-4x2': the V100 calibrated presets are p3-v100-8x<N>, "
        "nc-v100-4x<N>, eth-v100-1x<N> (N servers, N >= 1, e.g. p3-v100-8x2)\n"
    )
