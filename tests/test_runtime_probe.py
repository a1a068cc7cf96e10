"""`pipeplan probe` measures the job's processes as a cluster; the chain profile -> probe -> plan -> train holds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("sklearn")

from pipeplan.io.load import load_cluster

BOOT = "from pipeplan.cli import main; main()"
TINY = ["--opt", "hidden=32", "--opt", "blocks=3"]


def pipeplan(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run `pipeplan ARGS` in a fresh interpreter."""
    return subprocess.run([sys.executable, "-c", BOOT, *args], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, **(env or {})))  # fmt: skip


def test_probe_without_a_profile_writes_two_cpu_devices_with_links_and_all_reduce(tmp_path: Path) -> None:
    """Two local processes become two `cpu` devices of speed 1.0 with measured links and a measured all-reduce."""
    out = tmp_path / "c.json"
    done = pipeplan("probe", "--local", "2", "--out", str(out), "--rounds", "3")
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    assert [d["kind"] for d in data["devices"]] == ["cpu", "cpu"] and [d["speed"] for d in data["devices"]] == [1.0, 1.0]
    assert data["bandwidth_gb_per_s"][0][1] > 0 and data["bandwidth_gb_per_s"][1][0] > 0
    assert data["allreduce"]["gb_per_s"] > 0
    cluster = load_cluster(str(out))
    assert cluster.speed_reference == "cpu" and cluster.allreduce_bandwidth is not None


def test_the_chain_profile_probe_plan_train_runs_and_predicts_before_running(tmp_path: Path) -> None:
    """profile -> probe -> plan -> train --plan: the plan names the files beside it, train builds the profile's model
    from its source, and reports the plan's predicted step, the measured one, and memory per process."""
    profile, cluster, plan = tmp_path / "p.json", tmp_path / "c.json", tmp_path / "plan.json"
    done = pipeplan("profile", "mlp", *TINY, "-b", "8", "-o", str(profile), "--runs", "2", "--warmup", "1", "-q")
    assert done.returncode == 0, done.stderr
    done = pipeplan("probe", "--local", "2", "--profile", str(profile), "--out", str(cluster), "--steps", "3", "--rounds", "3")
    assert done.returncode == 0, done.stderr
    data = json.loads(cluster.read_text())
    assert all(d["speed"] > 0 for d in data["devices"]) and "against profile" in data["notes"]
    done = pipeplan("plan", "--profile", str(profile), "--cluster", str(cluster), "--global-batch", "16", "--out", str(plan))
    assert done.returncode == 0, done.stderr
    written = json.loads(plan.read_text())
    assert (written["profile"], written["cluster"]) == ("p.json", "c.json")  # relative to the plan file
    devices = len({d for stage in written["stages"] for d in stage["devices"]})  # the planner may leave one idle
    done = pipeplan("train", "--local", str(devices), "--plan", str(plan), "--steps", "6", "--json", "-q")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["predicted_step_ms"] > 0 and report["measured_step_ms"] > 0
    used = [m for m in report["measured_memory_bytes"] if m > 0]
    assert len(report["predicted_memory_bytes"]) == len(used)
    # the same bytes are predicted and measured: weights, gradients, Adam's two moments and saved activations
    for predicted, measured in zip(report["predicted_memory_bytes"], used, strict=True):
        assert abs(predicted - measured) <= 0.2 * measured


def test_a_peer_that_never_answers_is_an_error_naming_the_timeout_and_nothing_is_written(tmp_path: Path) -> None:
    """With process 1 silent after joining, the probe fails within its --timeout, exit 2, one error line, no file."""
    out = tmp_path / "c.json"
    done = pipeplan("probe", "--local", "2", "--out", str(out), "--timeout", "3", env={"PIPEPLAN_PROBE_HANG": "1"}, timeout=120)
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "did not complete within 3 s (--timeout)" in errors[0], done.stderr
    assert "Traceback" not in done.stderr
    assert not out.exists() and not list(tmp_path.glob(".*"))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--steps", "0"], "--steps must be >= 1, got 0"),
        (["--optimizer", "lion"], "--optimizer must be adam or sgd, got 'lion'"),
        (["--timeout", "0"], "--timeout must be > 0 seconds, got 0.0"),
        (["--local", "0"], "--local must be >= 1, got 0"),
    ],
)
def test_bad_probe_options_exit_2_with_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    """Bad options are refused before any process starts."""
    done = pipeplan("probe", "--out", str(tmp_path / "c.json"), *args, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"error: TrainConfigError: {message}"]
