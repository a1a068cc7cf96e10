"""Tests of sim.speeds and device-name matching: a cluster's speeds brought onto the profile's scale."""

from __future__ import annotations

import pytest

from pipeplan.core.errors import ClusterError
from pipeplan.core.hardware.cluster import Cluster, Device
from pipeplan.core.hardware.devices import kind_of_device_name
from pipeplan.core.profile import LayerProfile, ModelProfile
from pipeplan.io.cluster_json import cluster_from_json
from pipeplan.presets.resolve import load_cluster, load_profile
from pipeplan.sim.cost.speeds import on_profile_scale, profile_kind

GIB = 2**30


def profile_on(reference_device: str) -> ModelProfile:
    """A one-layer profile measured on (or projected to) `reference_device`."""
    return ModelProfile("p", 4, (LayerProfile("l", 1.0, 2.0, 1e6, 1e6),), reference_device)


def cpu_cluster() -> Cluster:
    """Two CPU processes of speed 1 and 1.5 on one node, read from a file description."""
    return cluster_from_json(
        {
            "name": "cpus",
            "devices": [{"kind": "cpu", "memory_gb": 4}, {"kind": "cpu", "memory_gb": 4, "speed": 1.5}],
            "bandwidth_gb_per_s": [[0, 5], [5, 0]],
            "latency_us": 20,
        }
    )


def test_a_v100_profile_on_h100s_keeps_the_cluster_speeds() -> None:
    """A V100 profile (the built-ins) on h100-8x4 keeps every H100 at speed 5.0 on the V100 scale."""
    cluster, profile = load_cluster("h100-8x4"), load_profile("dapple/bert-48")
    assert profile.reference_device == "V100" and cluster.speed_reference == "V100"
    scaled = on_profile_scale(cluster, profile)
    assert scaled is cluster
    assert {d.speed for d in scaled.devices} == {5.0}


@pytest.mark.parametrize("reference", ["H100", "NVIDIA H100 80GB HBM3", "h100"])
def test_an_h100_profile_on_h100s_runs_at_speed_one(reference: str) -> None:
    """An H100-projected profile on h100-8x4 sees every device at speed 1.0 with speed_reference H100."""
    cluster = load_cluster("h100-8x4")
    scaled = on_profile_scale(cluster, profile_on(reference))
    assert scaled.speed_reference == "H100"
    assert [d.speed for d in scaled.devices] == [1.0] * cluster.num_devices
    assert scaled.bandwidth_bytes_per_s == cluster.bandwidth_bytes_per_s and scaled.nic_bytes_per_s == cluster.nic_bytes_per_s
    assert [d.memory_bytes for d in scaled.devices] == [d.memory_bytes for d in cluster.devices]


def test_speeds_scale_by_the_ratio_of_nominal_speeds() -> None:
    """An A100 profile on a V100-scale cluster divides every speed by 2.0, the A100's nominal speed."""
    cluster = load_cluster("hetero-a100-v100")
    scaled = on_profile_scale(cluster, profile_on("NVIDIA A100-SXM4-40GB"))
    assert scaled.speed_reference == "A100"
    assert [d.speed for d in scaled.devices] == pytest.approx([d.speed / 2.0 for d in cluster.devices])


def test_on_profile_scale_is_idempotent() -> None:
    """Bringing an already-scaled cluster onto the same profile's scale returns it unchanged."""
    profile = profile_on("H100")
    once = on_profile_scale(load_cluster("h100-8x4"), profile)
    assert on_profile_scale(once, profile) is once


def test_a_cpu_profile_on_a_gpu_cluster_is_refused() -> None:
    """A profile measured on a CPU cannot be run on GPUs: ClusterError pointing to probe and --project-to."""
    with pytest.raises(ClusterError, match=r"profile 'p' was measured on 'cpu' but cluster 'h100-8x4' has GPUs \(H100\)") as info:
        on_profile_scale(load_cluster("h100-8x4"), profile_on("cpu"))
    assert "pipeplan probe" in str(info.value)
    assert "--project-to" in str(info.value)


def test_a_gpu_profile_on_a_cpu_cluster_is_refused() -> None:
    """A V100 profile on a cluster of CPU processes raises ClusterError naming both sides."""
    with pytest.raises(ClusterError, match=r"measured on 'V100' but cluster 'cpus' has CPU processes.*pipeplan probe"):
        on_profile_scale(cpu_cluster(), profile_on("V100"))


def test_a_cpu_profile_on_a_cpu_cluster_keeps_the_speeds() -> None:
    """CPU speeds are relative to the CPU a profile was measured on: a cpu profile takes them as they are."""
    cluster = cpu_cluster()
    assert cluster.speed_reference == "cpu"
    assert on_profile_scale(cluster, profile_on("cpu")) is cluster


@pytest.mark.parametrize("reference", ["unknown", "local", "NVIDIA GeForce RTX 4090"])
def test_a_profile_of_an_unknown_device_leaves_the_cluster_unchanged(reference: str) -> None:
    """Speeds are taken as they are when the profile's device is no known kind."""
    cluster = load_cluster("h100-8x4")
    assert profile_kind(profile_on(reference)) is None
    assert on_profile_scale(cluster, profile_on(reference)) is cluster


def test_an_in_memory_cluster_without_a_speed_reference_is_unchanged() -> None:
    """A Cluster built in code (speed_reference None) is used as it is, whatever the profile."""
    cluster = Cluster("mem", (Device(0, "gpu", 16 * GIB, 3.0),), ((0.0,),), ((0.0,),))
    for reference in ("V100", "H100", "cpu"):
        assert on_profile_scale(cluster, profile_on(reference)) is cluster


def test_an_unknown_speed_reference_is_taken_as_it_is_or_refused() -> None:
    """A cluster whose speed_reference is no known kind is used unchanged or refused with ClusterError, never an assert."""
    cluster = Cluster("tpu", (Device(0, "TPU", 16 * GIB),), ((0.0,),), ((0.0,),), speed_reference="TPU")
    try:
        scaled = on_profile_scale(cluster, profile_on("V100"))
    except ClusterError:
        return
    assert scaled is cluster


def test_profile_kind_reads_the_reference_device() -> None:
    """profile_kind maps the reference device name to a kind, None when unknown."""
    assert profile_kind(load_profile("dapple/bert-48")) == "V100"
    assert profile_kind(profile_on("NVIDIA H100 80GB HBM3")) == "H100"
    assert profile_kind(profile_on("unknown")) is None


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA H100 PCIe", "H100"),
        ("h100", "H100"),
        (" V100 ", "V100"),
        ("Tesla V100-SXM2-16GB", "V100"),
        ("Tesla V100-SXM2-32GB", "V100"),
        ("NVIDIA A100-SXM4-40GB", "A100"),
        ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
        ("NVIDIA A100 80GB PCIe", "A100-80GB"),
        ("a100-80gb", "A100-80GB"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA L4", "L4"),
        ("cpu", "cpu"),
        ("CPU", "cpu"),
    ],
)
def test_kind_of_device_name_reads_product_names(name: str, kind: str) -> None:
    """Kinds and the product names CUDA reports map to the kind pipeplan has figures for."""
    assert kind_of_device_name(name) == kind


@pytest.mark.parametrize(
    "name", ["unknown", "local", "", "generic", "NVIDIA L40S", "NVIDIA GeForce RTX 4090", "NVIDIA GH200", None, 100]
)
def test_kind_of_device_name_is_none_for_devices_without_figures(name: object) -> None:
    """Unknown names, look-alikes (L40S is no L4) and non-strings give None."""
    assert kind_of_device_name(name) is None
