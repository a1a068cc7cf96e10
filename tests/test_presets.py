"""Tests of the built-in profiles and clusters, the GPU spec table and name resolution."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeplan.core.errors import ClusterError, ProfileError
from pipeplan.core.hardware.devices import DEVICE_KINDS, GPU_SPECS, canonical_kind, gpu_spec
from pipeplan.io.profile_json import write_profile_json
from pipeplan.presets.clusters import DGX1_NVLINKS
from pipeplan.presets.resolve import list_clusters, list_profiles, load_cluster, load_profile

GIB = 2**30


def test_builtin_profile_names() -> None:
    """26 unique names: folder/model without -pbs-N, other suffixes kept."""
    names = list_profiles()
    assert len(names) == len(set(names)) == 26
    for expected in ("dapple/bert-48", "dapple/amoeba-36", "pipedream/vgg16", "pipedream/resnet50", "dapple/gnmt-32-simplified",
                     "dapple/gnmt-32", "dapple/amoeba-6-complicated", "pipedream/gnmt_large"):  # fmt: skip
        assert expected in names
    assert sum(n.startswith("dapple/") for n in names) == 12


def test_builtin_batch_sizes_come_from_the_file_names() -> None:
    """bert-48 was measured with 2 samples, vgg16 with 128, gnmt-32-simplified with 64."""
    assert load_profile("dapple/bert-48").batch_size == 2
    assert load_profile("pipedream/vgg16").batch_size == 128
    assert load_profile("dapple/gnmt-32-simplified").batch_size == 64


def test_a_unique_short_name_resolves() -> None:
    """`vgg16` is pipedream/vgg16; the full name gives the same profile."""
    assert load_profile("vgg16") == load_profile("pipedream/vgg16")
    assert load_profile("vgg16").name == "pipedream/vgg16"


def test_unknown_profile_lists_close_matches() -> None:
    """A near miss suggests the built-ins it resembles."""
    with pytest.raises(ProfileError, match=r"unknown profile 'bert48' .* did you mean dapple/bert-48"):
        load_profile("bert48")
    with pytest.raises(ProfileError, match=r"profile file 'missing/model\.json' does not exist"):
        load_profile("missing/model.json")
    with pytest.raises(ProfileError, match=r"unknown profile 'dapple/bert48' .* did you mean dapple/bert-48"):
        load_profile("dapple/bert48")  # a folder of the built-ins: a name, not a path


@pytest.mark.parametrize("alias", ["dapple/bert-24-pbs-6", "dapple/bert-24-pbs-6.txt", "bert-24-pbs-6", "bert-24-pbs-6.txt"])
def test_a_builtin_may_be_named_by_its_file(alias: str) -> None:
    """The file's own name (as `show profiles` or the PipeDream/DAPPLE repositories spell it) is the built-in."""
    assert load_profile(alias).name == "dapple/bert-24"


def test_profile_batch_size_must_agree_with_a_builtin() -> None:
    """Giving a different measured batch size for a built-in is an error naming both."""
    assert load_profile("dapple/bert-48", profile_batch_size=2).batch_size == 2
    with pytest.raises(ProfileError, match=r"dapple/bert-48: .* batch size 2, but the profile batch size given is 8"):
        load_profile("dapple/bert-48", profile_batch_size=8)


def test_load_profile_reads_json_and_graph_txt_files(tmp_path: Path) -> None:
    """A .json path reads pipeplan's format; any other path reads graph.txt."""
    profile = load_profile("pipedream/alexnet")
    write_profile_json(profile, tmp_path / "alex.json")
    assert load_profile(str(tmp_path / "alex.json")) == profile
    text = tmp_path / "g.txt"
    text.write_text(
        "n1 -- a -- forward_compute_time=1, backward_compute_time=1, activation_size=4, parameter_size=0\n"
        "n2 -- b -- forward_compute_time=1, backward_compute_time=1, activation_size=4, parameter_size=8\n\tn1 -- n2\n"
    )
    assert load_profile(str(text), profile_batch_size=3).batch_size == 3


CLUSTER_SHAPES = {
    # name: (devices, nodes, NIC GB/s or None, kinds)
    "v100-8x1": (8, 1, None, {"V100"}),
    "v100-8x2-25g": (16, 2, 3.125, {"V100"}),
    "v100-1x16-25g": (16, 16, 3.125, {"V100"}),
    "a100-8x2": (16, 2, 200.0, {"A100"}),
    "h100-8x4": (32, 4, 400.0, {"H100"}),
    "h100-8x128": (1024, 128, 400.0, {"H100"}),
    "pcie-4x4-10g": (16, 4, 1.25, {"V100"}),
    "hetero-a100-v100": (16, 2, 12.5, {"A100", "V100"}),
}


def test_every_builtin_cluster_is_listed() -> None:
    """The list is exactly the eight presets of the issue."""
    assert set(list_clusters()) == set(CLUSTER_SHAPES)


@pytest.mark.parametrize("name", sorted(CLUSTER_SHAPES))
def test_builtin_cluster_shapes(name: str) -> None:
    """Each preset has its device count, node count, NIC rate and device kinds."""
    devices, nodes, nic, kinds = CLUSTER_SHAPES[name]
    cluster = load_cluster(name)
    assert cluster.name == name
    assert (cluster.num_devices, cluster.num_nodes) == (devices, nodes)
    assert (None if cluster.nic_bytes_per_s is None else cluster.nic_bytes_per_s / 1e9) == nic
    assert {d.kind for d in cluster.devices} == kinds
    assert len(cluster.bandwidth_bytes_per_s) == devices and all(len(row) == devices for row in cluster.bandwidth_bytes_per_s)
    # Every pair of distinct devices can talk.
    assert min(cluster.bandwidth_bytes_per_s[a][b] for a in range(min(devices, 40)) for b in range(devices) if a != b) > 0


def test_dgx1_matrix_is_the_hybrid_cube_mesh() -> None:
    """v100-8x1 is symmetric and non-uniform: 50, 25 and 10 GB/s pairs; each GPU has 6 NVLinks (150 GB/s)."""
    cluster = load_cluster("v100-8x1")
    gb = [[v / 1e9 for v in row] for row in cluster.bandwidth_bytes_per_s]
    assert all(gb[a][b] == gb[b][a] for a in range(8) for b in range(8))
    off_diagonal = sorted(gb[a][b] for a in range(8) for b in range(8) if a != b)
    assert set(off_diagonal) == {10.0, 25.0, 50.0}
    assert off_diagonal.count(50.0) == 16 and off_diagonal.count(25.0) == 16 and off_diagonal.count(10.0) == 24
    for a in range(8):
        assert sum(gb[a][b] for b in range(8) if b != a and gb[a][b] > 10) == 150.0
        assert gb[a][(a + 4) % 8] == 50.0 if a in (0, 4) else True
    # Known pairs from `nvidia-smi topo -m` on a DGX-1V: 0-3 NV2, 0-1 NV1, 0-5 no NVLink.
    assert (gb[0][3], gb[0][1], gb[0][5]) == (50.0, 25.0, 10.0)
    assert sum(DGX1_NVLINKS.values()) == 24  # 8 GPUs x 6 links / 2


def test_two_dgx1_servers_share_one_25g_nic_each() -> None:
    """v100-8x2-25g repeats the DGX-1 matrix in each node and runs 3.125 GB/s between them."""
    cluster = load_cluster("v100-8x2-25g")
    one = load_cluster("v100-8x1")
    for a in range(8):
        assert cluster.bandwidth_bytes_per_s[a][:8].tolist() == one.bandwidth_bytes_per_s[a].tolist()
        assert cluster.bandwidth_bytes_per_s[8 + a][8:].tolist() == one.bandwidth_bytes_per_s[a].tolist()
        assert set(cluster.bandwidth_bytes_per_s[a][8:].tolist()) == {3.125e9}
    assert cluster.link_bandwidth(0, 9) == 3.125e9


def test_hetero_cluster_speeds_and_memory() -> None:
    """Node 0 holds 40 GiB A100s at speed 2, node 1 16 GiB V100s at speed 1 on the DGX-1 mesh."""
    cluster = load_cluster("hetero-a100-v100")
    a100, v100 = cluster.devices[0], cluster.devices[8]
    assert (a100.kind, a100.speed, a100.memory_bytes, a100.node) == ("A100", 2.0, 40 * GIB, 0)
    assert (v100.kind, v100.speed, v100.memory_bytes, v100.node) == ("V100", 1.0, 16 * GIB, 1)
    assert cluster.bandwidth_bytes_per_s[0][1] == 300e9
    assert cluster.bandwidth_bytes_per_s[8][11] == 50e9
    assert cluster.bandwidth_bytes_per_s[0][8] == 12.5e9


def test_a100_pairs_across_nodes_use_one_hca() -> None:
    """In a100-8x2 a cross-node pair runs at one HDR HCA (25 GB/s); the node's 8 HCAs are the 200 GB/s NIC."""
    cluster = load_cluster("a100-8x2")
    assert cluster.link_bandwidth(0, 8) == 25e9
    assert cluster.link_bandwidth(0, 7) == 300e9
    assert cluster.nic_bytes_per_s == 200e9


def test_the_1024_gpu_preset_is_two_level() -> None:
    """h100-8x128: 450 GB/s inside a node, 50 GB/s between nodes, 80 GiB per GPU."""
    cluster = load_cluster("h100-8x128")
    assert cluster.bandwidth_bytes_per_s[1000][1001] == 450e9
    assert cluster.bandwidth_bytes_per_s[0][1023] == 50e9
    assert cluster.devices[1023].node == 127
    assert cluster.devices[5].memory_bytes == 80 * GIB


def test_unknown_cluster_lists_close_matches(tmp_path: Path) -> None:
    """A near miss suggests presets; a .json path reads the file."""
    with pytest.raises(ClusterError, match=r"unknown cluster 'v100-8x2' .* did you mean v100-8x2-25g"):
        load_cluster("v100-8x2")
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"name": "c", "nodes": 1, "gpus_per_node": 2, "device": {"kind": "L4"},
                                "intra_node_gb_per_s": 16, "latency_us": {"intra": 10}}))  # fmt: skip
    assert load_cluster(str(path)).devices[1].memory_bytes == 24 * GIB


def test_gpu_specs_have_every_field() -> None:
    """Each GPU has positive fp32/bf16 TFLOP/s, HBM GB/s and GiB; half precision is faster than fp32."""
    assert {"V100", "A100", "H100", "H200", "L4"} <= set(GPU_SPECS)
    for name, spec in GPU_SPECS.items():
        assert spec.name == name
        assert 0 < spec.fp32_tflops < spec.bf16_tflops
        assert spec.hbm_gb_per_s > 0 and spec.memory_gib > 0
    assert gpu_spec("h100").bf16_tflops == 989.0
    assert gpu_spec("A100").hbm_gb_per_s == 1555.0


def test_device_kinds_are_one_list() -> None:
    """Known kinds are the GPUs plus generic; lookups ignore case; others are ClusterErrors."""
    assert DEVICE_KINDS[-1] == "generic"
    assert canonical_kind("a100-80gb") == "A100-80GB"
    with pytest.raises(ClusterError, match=r"kind must be one of V100, .* got 'K80'"):
        canonical_kind("K80")
    with pytest.raises(ClusterError, match=r"device kind 'generic' has no GPU spec"):
        gpu_spec("generic")
