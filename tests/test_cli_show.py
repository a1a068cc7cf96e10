"""Tests of `pipeplan show`: tables, JSON per the CLI contract, the heat map, and exit code 2 on bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_runner import run
from pipeplan.io.cluster_json import cluster_to_json
from pipeplan.io.profile_json import profile_to_json
from pipeplan.presets.resolve import list_clusters, list_profiles, load_cluster, load_profile


def test_show_profile_json_is_the_profile(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`show profile P --json` prints the ModelProfile with its layers, exactly profile_to_json."""
    code, out, _ = run(monkeypatch, capsys, "show", "profile", "dapple/bert-48", "--json")
    assert code == 0
    data = json.loads(out)
    assert data == json.loads(json.dumps(profile_to_json(load_profile("dapple/bert-48"))))
    assert len(data["layers"]) == 53
    assert set(data["layers"][0]) >= {"name", "fwd_ms", "bwd_ms", "activation_bytes", "param_bytes", "saved_bytes"}


def test_show_cluster_json_has_full_matrices(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`show cluster C --json` prints devices and full n x n bandwidth_gb_per_s and latency_us."""
    code, out, _ = run(monkeypatch, capsys, "show", "cluster", "v100-8x2-25g", "--json")
    assert code == 0
    data = json.loads(out)
    assert data == json.loads(json.dumps(cluster_to_json(load_cluster("v100-8x2-25g"))))
    assert len(data["devices"]) == 16
    assert len(data["bandwidth_gb_per_s"]) == 16 and all(len(r) == 16 for r in data["bandwidth_gb_per_s"])
    assert len(data["latency_us"]) == 16 and all(len(r) == 16 for r in data["latency_us"])
    assert data["bandwidth_gb_per_s"][0][3] == 50
    # Compact: one matrix row per line, not one number per line.
    assert out.count("\n") < 100


def test_show_profile_table(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The human view shows the totals and one row per layer."""
    code, out, _ = run(monkeypatch, capsys, "show", "profile", "pipedream/vgg16")
    assert code == 0
    assert "profile pipedream/vgg16" in out
    assert "233.902" in out  # total forward ms (Input excluded)
    assert "node1:Input" in out


def test_show_cluster_table_and_png(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The human view lists device groups and link classes; --png writes a PNG image."""
    png = tmp_path / "bw.png"
    code, out, _ = run(monkeypatch, capsys, "show", "cluster", "v100-8x1", "--png", str(png))
    assert code == 0
    assert "cluster v100-8x1: 8 devices on 1 nodes" in out
    assert "intra-node" in out and "50" in out and "10" in out
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 10_000


def test_show_lists(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`show profiles --json` and `show clusters --json` list every built-in."""
    code, out, _ = run(monkeypatch, capsys, "show", "profiles", "--json")
    assert code == 0
    assert [p["name"] for p in json.loads(out)["profiles"]] == list(list_profiles())
    code, out, _ = run(monkeypatch, capsys, "show", "clusters", "--json")
    assert code == 0
    rows = json.loads(out)["clusters"]
    assert [c["name"] for c in rows] == list(list_clusters())
    assert next(c for c in rows if c["name"] == "h100-8x128")["devices"] == 1024


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("show", "profile", "bert48"), "error: ProfileError: unknown profile 'bert48'"),
        (("show", "cluster", "dgx"), "error: ClusterError: unknown cluster 'dgx'"),
        (("show", "profile", "dapple/bert-48", "--profile-batch-size", "4"), "error: ProfileError: dapple/bert-48: "),
    ],
)
def test_bad_names_exit_2_with_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], args: tuple[str, ...], message: str
) -> None:
    """An unknown name exits with code 2 and a one-line message, no traceback."""
    code, _, err = run(monkeypatch, capsys, *args)
    assert code == 2
    assert err.startswith(message)
    assert len(err.strip().splitlines()) == 1
    assert "Traceback" not in err


def test_bad_files_exit_2(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A cluster file with a negative entry and a graph.txt with a cycle exit 2 naming file, field and value."""
    cluster = tmp_path / "neg.json"
    cluster.write_text(json.dumps({"name": "n", "devices": [{"kind": "V100"}, {"kind": "V100"}],
                                   "bandwidth_gb_per_s": [[0, -1], [1, 0]], "latency_us": 5}))  # fmt: skip
    code, _, err = run(monkeypatch, capsys, "show", "cluster", str(cluster))
    assert code == 2
    assert "neg.json: bandwidth_gb_per_s[0][1] must be a finite number >= 0, got -1" in err
    graph = tmp_path / "cyc-pbs-1.txt"
    fields = "forward_compute_time=1, backward_compute_time=1, activation_size=1, parameter_size=0"
    graph.write_text(f"n1 -- a -- {fields}\nn2 -- b -- {fields}\n\tn1 -- n2\n\tn2 -- n1\n")
    code, _, err = run(monkeypatch, capsys, "show", "profile", str(graph))
    assert code == 2
    assert "cyc-pbs-1.txt: the graph has a cycle through node n1" in err
    assert "Traceback" not in err


def test_show_profile_names_the_sizes_threads_model_and_optimizer_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A several-size profile's table lists its batch sizes, thread count, model source and optimizer step totals."""
    layer = {"name": "l0", "fwd_ms": [1.0, 1.5], "bwd_ms": [2.0, 3.0], "activation_bytes": [8, 16], "param_bytes": 64,
             "optimizer_ms": {"adam": 0.5, "sgd": 0.125}}  # fmt: skip
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"format": "pipeplan.profile/2", "name": "two", "batch_size": 4, "batch_sizes": [2, 4],
                                "threads": 1, "layers": [layer], "source": {"module": "mlp", "options": {"hidden": "8"},
                                "dataset": "digits", "dtype": "float32"}}))  # fmt: skip
    code, out, _ = run(monkeypatch, capsys, "show", "profile", str(path))
    assert code == 0
    assert "measured at batch sizes" in out and "2, 4" in out and "CPU threads" in out
    assert "mlp --opt hidden=8 (dataset digits)" in out
    assert "adam step (ms)" in out and "0.500" in out and "sgd step (ms)" in out and "0.125" in out


def test_a_mixed_node_lists_each_kinds_own_devices(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Two nodes of [V100, A100, V100, A100]: the V100 row lists devices 0,2,4,6 and the A100 row 1,3,5,7."""
    devices = [{"kind": ("V100", "A100")[i % 2], "memory_gb": (16, 40)[i % 2], "node": i // 4} for i in range(8)]
    bandwidth = [[0 if a == b else 10 for b in range(8)] for a in range(8)]
    cluster = {"format": "pipeplan.cluster/1", "name": "mixed", "devices": devices, "bandwidth_gb_per_s": bandwidth,
               "latency_us": [[0 if a == b else 5 for b in range(8)] for a in range(8)]}  # fmt: skip
    path = tmp_path / "mixed.json"
    path.write_text(json.dumps(cluster))
    code, out, _ = run(monkeypatch, capsys, "show", "cluster", str(path))
    assert code == 0
    rows = [line.split() for line in out.splitlines() if "V100" in line or "A100" in line]
    assert [row[:4] for row in rows] == [["0-1", "1,3,5,7", "2", "A100"], ["0-1", "0,2,4,6", "2", "V100"]]
