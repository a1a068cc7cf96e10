"""Tests of the pipeplan.cluster/1 JSON format: matrix and description forms, units, errors."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from pipeplan.core.errors import ClusterError
from pipeplan.io.cluster_json import cluster_from_json, cluster_to_json, read_cluster_json

GIB = 2**30


def matrix_form() -> dict[str, Any]:
    """Three devices on two nodes with an asymmetric link 0 -> 1."""
    return {
        "format": "pipeplan.cluster/1",
        "name": "m3",
        "devices": [
            {"kind": "V100", "memory_gb": 32, "speed": 1.0, "node": 0},
            {"kind": "v100", "node": 0},
            {"kind": "generic", "memory_gb": 8, "speed": 0.5, "node": 1},
        ],
        "bandwidth_gb_per_s": [[0, 50, 3], [25, 0, 3], [3, 3, 0]],
        "latency_us": [[0, 5, 40], [5, 0, 40], [40, 40, 0]],
        "nic_gb_per_s": 3.125,
    }


def description_form() -> dict[str, Any]:
    """Two nodes of four A100s with one override."""
    return {
        "name": "d8",
        "nodes": 2,
        "gpus_per_node": 4,
        "device": {"kind": "A100", "speed": 2.0},
        "intra_node_gb_per_s": 300,
        "inter_node_gb_per_s": 25,
        "nic_gb_per_s": 100,
        "latency_us": {"intra": 5, "inter": 10},
        "overrides": [{"pair": [0, 5], "gb_per_s": 12.5, "latency_us": 20}],
    }


def test_matrix_form_converts_units() -> None:
    """GB/s become bytes/s, microseconds seconds, memory_gb GiB; kinds are matched case-insensitively."""
    cluster = cluster_from_json(matrix_form(), "m3.json")
    assert cluster.num_devices == 3
    assert cluster.bandwidth_bytes_per_s[0][1] == 50e9
    assert cluster.bandwidth_bytes_per_s[1][0] == 25e9  # asymmetric is allowed
    assert cluster.latency_ms[0][2] == pytest.approx(0.04)
    assert cluster.nic_bytes_per_s == 3.125e9
    assert cluster.devices[0].memory_bytes == 32 * GIB
    assert cluster.devices[1].kind == "V100"
    assert cluster.devices[1].memory_bytes == 16 * GIB  # the V100 spec's 16 GiB
    assert cluster.devices[1].speed == 1.0
    assert (cluster.devices[2].kind, cluster.devices[2].node, cluster.devices[2].speed) == ("generic", 1, 0.5)


def test_matrix_form_accepts_one_latency_for_every_pair() -> None:
    """`latency_us: 7` sets 7 us between all distinct devices and 0 on the diagonal."""
    obj = matrix_form()
    obj["latency_us"] = 7
    cluster = cluster_from_json(obj)
    assert cluster.latency_ms[1][2] == pytest.approx(0.007)
    assert cluster.latency_ms[2][2] == 0.0


def test_description_form_builds_two_levels_and_an_ordered_override() -> None:
    """Intra-node pairs get the intra rate, others the inter rate; the override changes 0 -> 5 only."""
    cluster = cluster_from_json(description_form(), "d8.json")
    assert cluster.num_devices == 8
    assert [d.node for d in cluster.devices] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert cluster.devices[3].memory_bytes == 40 * GIB
    assert cluster.devices[7].speed == 2.0
    assert cluster.bandwidth_bytes_per_s[1][2] == 300e9
    assert cluster.bandwidth_bytes_per_s[1][6] == 25e9
    assert cluster.bandwidth_bytes_per_s[0][5] == 12.5e9
    assert cluster.bandwidth_bytes_per_s[5][0] == 25e9
    assert cluster.latency_ms[0][5] == pytest.approx(0.02)
    assert cluster.latency_ms[1][6] == pytest.approx(0.01)
    assert cluster.latency_ms[2][3] == pytest.approx(0.005)
    assert all(cluster.bandwidth_bytes_per_s[i][i] == 0 for i in range(8))
    assert cluster.nic_bytes_per_s == 100e9


def test_description_and_its_matrix_form_give_the_same_cluster() -> None:
    """Writing a description-form cluster in matrix form and reading it back gives an equal cluster."""
    cluster = cluster_from_json(description_form())
    again = cluster_from_json(json.loads(json.dumps(cluster_to_json(cluster))))
    assert again.devices == cluster.devices
    assert again.nic_bytes_per_s == cluster.nic_bytes_per_s
    assert again.bandwidth_bytes_per_s == cluster.bandwidth_bytes_per_s
    for row, other in zip(cluster.latency_ms, again.latency_ms, strict=True):
        assert other == pytest.approx(row, abs=1e-15)


def test_to_json_is_matrix_form_in_file_units() -> None:
    """cluster_to_json gives GB/s, us and GiB with whole numbers as integers."""
    out = cluster_to_json(cluster_from_json(matrix_form()))
    assert out["format"] == "pipeplan.cluster/1"
    assert out["bandwidth_gb_per_s"] == [[0, 50, 3], [25, 0, 3], [3, 3, 0]]
    assert out["latency_us"] == [[0, 5, 40], [5, 0, 40], [40, 40, 0]]
    assert out["devices"][0] == {"kind": "V100", "memory_gb": 32, "speed": 1.0, "node": 0}
    assert out["nic_gb_per_s"] == 3.125


def test_single_node_description_needs_no_inter_node_fields() -> None:
    """With one node, inter-node rate and latency may be left out."""
    obj = {"name": "one", "nodes": 1, "gpus_per_node": 2, "device": {"kind": "H100"}, "intra_node_gb_per_s": 450,
           "latency_us": {"intra": 5}}  # fmt: skip
    cluster = cluster_from_json(obj)
    assert cluster.bandwidth_bytes_per_s[0][1] == 450e9
    assert cluster.nic_bytes_per_s is None


def test_zero_bandwidth_loads_but_a_plan_cannot_use_it() -> None:
    """A 0 entry means no path: the file loads, and require_link names the pair when a plan needs it."""
    obj = matrix_form()
    obj["bandwidth_gb_per_s"][0][2] = 0
    cluster = cluster_from_json(obj, "z.json")
    assert cluster.require_link(0, 1) == 50e9
    with pytest.raises(ClusterError, match=r"bandwidth\[0\]\[2\] is 0 but devices 0 and 2 must talk"):
        cluster.require_link(0, 2)


def edit(obj: dict[str, Any], path: str, value: object) -> dict[str, Any]:
    """obj with the field at a dotted path replaced (deleted when value is DELETE)."""
    keys = path.split(".")
    target: Any = obj
    for key in keys[:-1]:
        target = target[int(key)] if key.isdigit() else target[key]
    last: Any = int(keys[-1]) if keys[-1].isdigit() else keys[-1]
    if value is DELETE:
        del target[last]
    else:
        target[last] = value
    return obj


DELETE = object()


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("name", DELETE, r"c\.json: missing field 'name'"),
        ("bandwidth_gb_per_s", DELETE, r"c\.json: missing field 'bandwidth_gb_per_s'"),
        ("devices.0.kind", DELETE, r"c\.json: devices\[0\]: missing field 'kind'"),
        ("devices.0.kind", "TPUv4", r"devices\[0\]: field 'kind' must be one of V100, A100, .*generic, got 'TPUv4'"),
        ("devices.0.memory_gb", -16, r"devices\[0\]: field 'memory_gb' must be a finite number > 0, got -16"),
        ("devices.2.memory_gb", DELETE, r"devices\[2\]: missing field 'memory_gb'"),
        ("devices.1.speed", 0, r"devices\[1\]: field 'speed' must be a finite number > 0, got 0"),
        ("devices.1.node", -1, r"devices\[1\]: field 'node' must be an integer >= 0, got -1"),
        ("bandwidth_gb_per_s", [[0, 1, 1], [1, 0, 1]], r"'bandwidth_gb_per_s' must be a 3x3 matrix .* got 2 rows of 3 entries"),
        ("bandwidth_gb_per_s.1", [1, 0], r"'bandwidth_gb_per_s' must be a 3x3 matrix .* got 3 rows of 2,3 entries"),
        ("bandwidth_gb_per_s.1.2", -3, r"c\.json: bandwidth_gb_per_s\[1\]\[2\] must be a finite number >= 0, got -3"),
        ("bandwidth_gb_per_s.1.2", None, r"c\.json: bandwidth_gb_per_s\[1\]\[2\] must be a finite number >= 0, got null"),
        ("latency_us.2.0", "fast", r"c\.json: latency_us\[2\]\[0\] must be a finite number >= 0, got \"fast\""),
        ("nic_gb_per_s", 0, r"field 'nic_gb_per_s' must be a finite number > 0, got 0"),
        ("format", "pipeplan.profile/1", r"field 'format' must be 'pipeplan.cluster/1'"),
        ("topology", "mesh", r"c\.json: unknown field 'topology'"),
        ("nodes", 2, r"either 'devices' \(matrix form\) or 'nodes' \(description form\), not both"),
        ("devices", DELETE, r"missing field 'devices' \(matrix form\) or 'nodes' \(description form\)"),
    ],
)
def test_bad_matrix_form_names_file_field_and_value(path: str, value: object, message: str) -> None:
    """Each bad or missing matrix-form field raises ClusterError naming the file, field and value."""
    with pytest.raises(ClusterError, match=message):
        cluster_from_json(edit(matrix_form(), path, value), "c.json")


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("nodes", 0, r"d\.json: field 'nodes' must be an integer >= 1, got 0"),
        ("gpus_per_node", DELETE, r"d\.json: missing field 'gpus_per_node'"),
        ("device", DELETE, r"d\.json: missing field 'device'"),
        ("device.kind", "B200", r"d\.json: device: field 'kind' must be one of .* got 'B200'"),
        ("device.node", 3, r"d\.json: device: unknown field 'node'"),
        ("intra_node_gb_per_s", -1, r"field 'intra_node_gb_per_s' must be a finite number >= 0, got -1"),
        ("inter_node_gb_per_s", DELETE, r"d\.json: missing field 'inter_node_gb_per_s'"),
        ("latency_us.inter", DELETE, r"d\.json: latency_us: missing field 'inter'"),
        ("latency_us", "fast", r"d\.json: latency_us must be a JSON object, got \"fast\""),
        ("overrides.0.pair", [0, 8], r"overrides\[0\]: field 'pair' must be two different device ids in 0\.\.7, got \[0, 8\]"),
        ("overrides.0.pair", [3, 3], r"overrides\[0\]: field 'pair' must be two different .* got \[3, 3\]"),
        ("overrides.0.gb_per_s", -2, r"overrides\[0\]: field 'gb_per_s' must be a finite number >= 0, got -2"),
        ("overrides", {"pair": [0, 1]}, r"field 'overrides' must be an array"),
    ],
)
def test_bad_description_form_names_file_field_and_value(path: str, value: object, message: str) -> None:
    """Each bad or missing description-form field raises ClusterError naming the file, field and value."""
    with pytest.raises(ClusterError, match=message):
        cluster_from_json(edit(description_form(), path, value), "d.json")


def test_read_cluster_json_names_the_file(tmp_path: Path) -> None:
    """A file reads in either form; a bad one names its path."""
    good = tmp_path / "good.json"
    good.write_text(json.dumps(description_form()))
    assert read_cluster_json(good).num_devices == 8
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(edit(matrix_form(), "bandwidth_gb_per_s.0.1", -1)))
    with pytest.raises(ClusterError, match=r"bad\.json: bandwidth_gb_per_s\[0\]\[1\] must be .* got -1"):
        read_cluster_json(bad)
    with pytest.raises(ClusterError, match=r"nope\.json: cannot read cluster: does not exist"):
        read_cluster_json(tmp_path / "nope.json")


def test_nan_and_infinity_are_rejected() -> None:
    """NaN and Infinity (accepted by Python's JSON parser) are not valid rates."""
    for value in (math.nan, math.inf):
        with pytest.raises(ClusterError, match=r"bandwidth_gb_per_s\[0\]\[1\] must be a finite number"):
            cluster_from_json(edit(matrix_form(), "bandwidth_gb_per_s.0.1", value), "c.json")


def test_a_cpu_device_needs_memory_gb_and_defaults_to_speed_one() -> None:
    """A `cpu` device has no memory default (the error names memory_gb) and runs at speed 1.0 unless told."""
    obj = edit(matrix_form(), "devices", [{"kind": "cpu", "memory_gb": 4}, {"kind": "CPU", "memory_gb": 8, "speed": 2.5},
                                          {"kind": "cpu", "memory_gb": 2, "node": 1}])  # fmt: skip
    cluster = cluster_from_json(obj)
    assert [(d.kind, d.memory_bytes, d.speed) for d in cluster.devices] == [
        ("cpu", 4 * GIB, 1.0), ("cpu", 8 * GIB, 2.5), ("cpu", 2 * GIB, 1.0),
    ]  # fmt: skip
    with pytest.raises(ClusterError, match=r"c\.json: devices\[1\]: missing field 'memory_gb'"):
        cluster_from_json(edit(obj, "devices.1.memory_gb", DELETE), "c.json")
    described = edit(description_form(), "device", {"kind": "cpu"})
    with pytest.raises(ClusterError, match=r"d\.json: device: missing field 'memory_gb'"):
        cluster_from_json(described, "d.json")


NOMINAL = [("A100", 2.0, 40), ("H100", 5.0, 80), ("L4", 0.6, 24), ("V100", 1.0, 16), ("H200", 5.5, 141), ("a100-80gb", 2.0, 80)]


@pytest.mark.parametrize(("kind", "speed", "memory_gib"), NOMINAL)
def test_a_device_speed_defaults_to_its_kind_nominal_speed(kind: str, speed: float, memory_gib: float) -> None:
    """Without `speed` a GPU runs at its kind's nominal speed on the V100 scale, with its kind's memory."""
    cluster = cluster_from_json(edit(description_form(), "device", {"kind": kind}))
    assert {d.speed for d in cluster.devices} == {speed}
    assert {d.memory_bytes for d in cluster.devices} == {memory_gib * GIB}
    assert cluster.speed_reference == "V100"


def test_a_generic_device_needs_a_speed() -> None:
    """`generic` has no nominal speed: leaving it out names the field."""
    with pytest.raises(ClusterError, match=r"c\.json: devices\[2\]: missing field 'speed'"):
        cluster_from_json(edit(matrix_form(), "devices.2.speed", DELETE), "c.json")
    with pytest.raises(ClusterError, match=r"d\.json: device: missing field 'speed'"):
        cluster_from_json(edit(description_form(), "device", {"kind": "generic", "memory_gb": 8}), "d.json")


def test_description_form_accepts_one_latency_for_every_pair() -> None:
    """A scalar `latency_us` sets the same latency inside and between nodes (0 on the diagonal)."""
    cluster = cluster_from_json(edit(description_form(), "latency_us", 7))
    assert cluster.latency_ms[0][1] == pytest.approx(0.007)
    assert cluster.latency_ms[1][6] == pytest.approx(0.007)
    assert cluster.latency_ms[0][5] == pytest.approx(0.02)  # the override still wins
    assert cluster.latency_ms[3][3] == 0.0
    one_node = {"name": "one", "nodes": 1, "gpus_per_node": 2, "device": {"kind": "H100"}, "intra_node_gb_per_s": 450,
                "latency_us": 3}  # fmt: skip
    assert cluster_from_json(one_node).latency_ms.dense().tolist() == [[0.0, pytest.approx(0.003)], [pytest.approx(0.003), 0.0]]
    with pytest.raises(ClusterError, match=r"d\.json: field 'latency_us' must be a finite number >= 0, got -1"):
        cluster_from_json(edit(description_form(), "latency_us", -1), "d.json")


@pytest.mark.parametrize("form", [matrix_form, description_form])
def test_a_measured_allreduce_round_trips_through_to_json(form: Any) -> None:
    """`allreduce: {gb_per_s, latency_us}` in either form sets the cluster's all-reduce and is written back unchanged."""
    obj = form()
    obj["allreduce"] = {"gb_per_s": 150, "latency_us": 12.5}
    cluster = cluster_from_json(obj)
    assert cluster.allreduce_bytes_per_s == 150e9
    assert cluster.allreduce_latency_ms == pytest.approx(0.0125)
    out = cluster_to_json(cluster)
    assert out["allreduce"] == {"gb_per_s": 150, "latency_us": 12.5}
    again = cluster_from_json(json.loads(json.dumps(out)))
    assert (again.allreduce_bytes_per_s, again.allreduce_latency_ms) == (cluster.allreduce_bytes_per_s, pytest.approx(0.0125))


def test_a_measured_allreduce_latency_defaults_to_zero_and_bandwidth_must_be_positive() -> None:
    """allreduce.latency_us defaults to 0; a zero rate or an unknown key names the field."""
    cluster = cluster_from_json(edit(matrix_form(), "allreduce", {"gb_per_s": 40}))
    assert (cluster.allreduce_bytes_per_s, cluster.allreduce_latency_ms) == (40e9, 0.0)
    assert "allreduce" not in cluster_to_json(cluster_from_json(matrix_form()))
    with pytest.raises(ClusterError, match=r"c\.json: allreduce: field 'gb_per_s' must be a finite number > 0, got 0"):
        cluster_from_json(edit(matrix_form(), "allreduce", {"gb_per_s": 0}), "c.json")
    with pytest.raises(ClusterError, match=r"c\.json: allreduce: missing field 'gb_per_s'"):
        cluster_from_json(edit(matrix_form(), "allreduce", {"latency_us": 3}), "c.json")
    with pytest.raises(ClusterError, match=r"c\.json: allreduce: unknown field 'busbw'"):
        cluster_from_json(edit(matrix_form(), "allreduce", {"gb_per_s": 4, "busbw": 3}), "c.json")


@pytest.mark.parametrize("form", [matrix_form, description_form])
def test_message_costs_round_trip_and_must_not_be_negative(form: Any) -> None:
    """`message_overhead_us` and `message_latency_us` (as `pipeplan probe` fits them) load in either form, are
    written back unchanged, default to 0 (and are then left out), and a negative one names the field."""
    obj = form()
    obj["message_overhead_us"], obj["message_latency_us"] = 800, 1750
    cluster = cluster_from_json(obj)
    assert (cluster.message_overhead_ms, cluster.message_latency_ms) == (pytest.approx(0.8), pytest.approx(1.75))
    out = cluster_to_json(cluster)
    assert (out["message_overhead_us"], out["message_latency_us"]) == (800, 1750)
    plain = cluster_to_json(cluster_from_json(form()))
    assert "message_overhead_us" not in plain and "message_latency_us" not in plain
    with pytest.raises(ClusterError, match=r"c\.json: field 'message_latency_us' must be a finite number >= 0, got -5"):
        cluster_from_json(edit(form(), "message_latency_us", -5), "c.json")


def test_cpu_and_gpu_kinds_cannot_share_a_cluster() -> None:
    """Mixing `cpu` with GPU kinds is a ClusterError: their speeds are on different scales."""
    with pytest.raises(ClusterError, match=r"c\.json: devices mix kind 'cpu' with GPU kinds"):
        cluster_from_json(edit(matrix_form(), "devices.2", {"kind": "cpu", "memory_gb": 4, "node": 1}), "c.json")


def test_speed_reference_follows_the_device_kinds() -> None:
    """GPU and generic clusters have speeds on the V100 scale; cpu clusters on the profiled CPU's."""
    assert cluster_from_json(matrix_form()).speed_reference == "V100"
    assert cluster_from_json(description_form()).speed_reference == "V100"
    generic = edit(description_form(), "device", {"kind": "generic", "memory_gb": 8, "speed": 3})
    assert cluster_from_json(generic).speed_reference == "V100"
    cpus = edit(description_form(), "device", {"kind": "cpu", "memory_gb": 8})
    assert cluster_from_json(cpus).speed_reference == "cpu"


def test_matmul_fraction_is_read_in_both_forms_and_bounded() -> None:
    """A device's matmul_fraction reads in matrix and description form, writes back, and must be in (0, 1]."""
    description = {
        "format": "pipeplan.cluster/1", "name": "d", "nodes": 1, "gpus_per_node": 2,
        "device": {"kind": "H100", "matmul_fraction": 0.5}, "intra_node_gb_per_s": 100, "latency_us": 5,
    }  # fmt: skip
    cluster = cluster_from_json(description)
    assert [d.matmul_fraction for d in cluster.devices] == [0.5, 0.5]
    matrix = cluster_to_json(cluster)
    assert matrix["devices"][0]["matmul_fraction"] == 0.5
    assert cluster_from_json(matrix).devices == cluster.devices
    assert "matmul_fraction" not in cluster_to_json(cluster_from_json({**description, "device": {"kind": "H100"}}))["devices"][0]
    for bad in (0, 1.5, "x"):
        with pytest.raises(ClusterError, match="matmul_fraction"):
            cluster_from_json({**description, "device": {"kind": "H100", "matmul_fraction": bad}})


@pytest.mark.parametrize("form", [matrix_form, description_form])
def test_a_measured_tp_allreduce_round_trips_and_is_absent_by_default(form: Any) -> None:
    """`tp_allreduce: {gb_per_s, latency_us}` (probe's fit at TP's small messages) sets the cluster's TP all-reduce in
    either form and is written back unchanged; without it the cluster has none and writes none; a bad one names the
    field."""
    obj = form()
    obj["tp_allreduce"] = {"gb_per_s": 0.25, "latency_us": 310.5}
    cluster = cluster_from_json(obj)
    assert cluster.tp_allreduce_bytes_per_s == 0.25e9
    assert cluster.tp_allreduce_latency_ms == pytest.approx(0.3105)
    assert cluster_to_json(cluster)["tp_allreduce"] == {"gb_per_s": 0.25, "latency_us": 310.5}
    plain = cluster_from_json(form())
    assert (plain.tp_allreduce_bytes_per_s, plain.tp_allreduce_latency_ms) == (None, 0.0)
    assert "tp_allreduce" not in cluster_to_json(plain)
    with pytest.raises(ClusterError, match=r"c\.json: tp_allreduce: field 'gb_per_s' must be a finite number > 0, got 0"):
        cluster_from_json(edit(form(), "tp_allreduce", {"gb_per_s": 0}), "c.json")
