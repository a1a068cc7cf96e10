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

from full_disk import fill, full_folder_fixture, leftovers  # noqa: F401 (the fixture full_folder)
from pipeplan.presets.resolve import load_cluster

pytestmark = pytest.mark.torch  # every test here needs torch (make test-fast leaves them out)

BOOT = "from pipeplan.cli import main; main()"
TINY = ["--opt", "hidden=32", "--opt", "blocks=3"]


def pipeplan(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run `pipeplan ARGS` in a fresh interpreter."""
    return subprocess.run([sys.executable, "-c", BOOT, *args], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, **(env or {})))  # fmt: skip


@pytest.mark.slow
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
    assert cluster.speed_reference == "cpu" and cluster.allreduce_bytes_per_s is not None


@pytest.mark.slow
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
    # (the loss's included); they differ only by the few bytes of scalars autograd keeps
    for predicted, measured in zip(report["predicted_memory_bytes"], used, strict=True):
        assert abs(predicted - measured) <= 0.01 * measured


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["1f1b", "zb-h1"])
def test_two_stages_hold_exactly_the_predicted_memory(tmp_path: Path, schedule: str) -> None:
    """Split after a ReLU, 4 microbatches: each rank's measured peak (weights, gradients, Adam's moments, saved
    activations, the loss's included) is the predicted one but for Adam's step counters (4 bytes per parameter
    tensor): a storage two layers save is counted once, an activation sent on is freed with its backward."""
    profile, cluster, plan = tmp_path / "profile.json", tmp_path / "cluster.json", tmp_path / "plan.json"
    done = pipeplan("profile", "mlp", *TINY, "-b", "4", "-o", str(profile), "--runs", "1", "--warmup", "0", "-q")
    assert done.returncode == 0, done.stderr
    done = pipeplan("probe", "--local", "2", "--out", str(cluster), "--rounds", "2")
    assert done.returncode == 0, done.stderr
    layers = len(json.loads(profile.read_text())["layers"])
    stages = [{"first_layer": 0, "last_layer": 1, "devices": [0]}, {"first_layer": 2, "last_layer": layers - 1, "devices": [1]}]
    plan.write_text(json.dumps({"format": "pipeplan.plan/1", "profile": "profile.json", "cluster": "cluster.json",
                                "stages": stages, "pipeline_replicas": 1, "microbatches": 4, "microbatch_size": 4,
                                "schedule": schedule, "k": 1, "chunks": 1, "order": None}))  # fmt: skip
    done = pipeplan("train", "--local", "2", "--plan", str(plan), "--steps", "2", "--json", "-q")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    counters = [2 * 4 * 2, 2 * 4 * (layers - 2)]  # a weight and a bias per layer, one float32 step counter each
    pairs = zip(report["predicted_memory_bytes"], report["measured_memory_bytes"], strict=True)
    assert [measured - predicted for predicted, measured in pairs] == counters


@pytest.mark.slow
def test_a_peer_that_never_answers_is_an_error_naming_the_timeout_and_nothing_is_written(tmp_path: Path) -> None:
    """With process 1 silent after joining, the probe fails within its --timeout, exit 2, one error line, no file."""
    out = tmp_path / "c.json"
    done = pipeplan("probe", "--local", "2", "--out", str(out), "--timeout", "3", env={"PIPEPLAN_PROBE_HANG": "1"}, timeout=120)
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "did not complete within 3 s (--timeout)" in errors[0], done.stderr
    assert "Traceback" not in done.stderr
    assert not out.exists() and not list(tmp_path.glob(".*"))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--steps", "0"], "--steps must be >= 1, got 0"),
        (["--optimizer", "lion"], "--optimizer must be one of adam, sgd, sgd_momentum, got 'lion'"),
        (["--timeout", "0"], "--timeout must be > 0 seconds, got 0.0"),
        (["--local", "0"], "--local must be >= 1, got 0"),
    ],
)
def test_bad_probe_options_exit_2_with_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    """Bad options are refused before any process starts."""
    done = pipeplan("probe", "--out", str(tmp_path / "c.json"), *args, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"error: TrainConfigError: {message}"]


@pytest.mark.parametrize(("overhead_us", "latency_us"), [(0, 0), (750, 2000), (1500, 250), (325, 1175)])
def test_fit_messages_recovers_the_message_costs_that_made_the_steps(overhead_us: int, latency_us: int) -> None:
    """Steps simulated with a known message overhead and latency (the calibration plans of a two-process probe)
    fit back to those two values: GPipe and 1F1B runs tell them apart."""
    import dataclasses

    from pipeplan.core.hardware.cluster import Cluster, Device
    from pipeplan.core.profile import LayerCurve, LayerProfile, ModelProfile
    from pipeplan.runtime.measurement.calibrate import Run, fit_messages, pipeline_plans
    from pipeplan.sim.cost.model import CostModel
    from pipeplan.sim.plan_sim import simulate_plan

    def layer(i: int) -> LayerProfile:  # a fixed cost per action and a part per sample, as on a CPU
        fwd, bwd = (0.2 + 0.05 * i, 0.4 + 0.2 * i), (0.5 + 0.1 * i, 1.2 + 0.5 * i)
        curve = LayerCurve(fwd, bwd, (5e4, 2e5), (2.5e4, 1e5))
        return LayerProfile(f"l{i}", fwd[1], bwd[1], 2e5, 4e5, 1e5, curve=curve)

    layers = tuple(layer(i) for i in range(6))
    profile = ModelProfile("six", 4, layers, batch_sizes=(1, 4), cut_curves=((5e4, 2e5),) * 5)
    devices = tuple(Device(i, "cpu", 8 * 2**30, 1.0, 0) for i in range(2))
    base = Cluster("two", devices, ((0.0, 3e9), (3e9, 0.0)), ((0.0, 0.1), (0.1, 0.0)))
    truth = dataclasses.replace(base, message_overhead_ms=overhead_us / 1000, message_latency_ms=latency_us / 1000)
    model = CostModel.build(profile, truth, optimizer="sgd")
    plans = pipeline_plans(profile, 2)
    assert {p.schedule for p in plans} == {"gpipe", "1f1b"} and {p.microbatch_size for p in plans} == {1, 4}
    runs = [Run(p, (), 0.0, simulate_plan(p, model, record=False).iteration_time) for p in plans]
    overhead, latency = fit_messages(profile, base, runs, "sgd")
    assert (overhead, latency) == (pytest.approx(overhead_us / 1000), pytest.approx(latency_us / 1000))
    alone, none = fit_messages(profile, base, runs, "sgd", with_latency=False)  # the one-cost model, on the same runs
    assert none == 0.0
    if latency_us == 0:
        assert alone == pytest.approx(overhead_us / 1000)


def test_speed_is_the_median_step_so_one_slowed_step_does_not_move_it() -> None:
    """Every step of the data-parallel calibration runs at 0.8 x the profile's speed but one, three times slower (a
    neighbour on a shared machine): the speed is 0.8 (a ratio of summed times would be lower)."""
    from pipeplan.core.profile import LayerCurve, LayerProfile, ModelProfile
    from pipeplan.runtime.measurement.calibrate import Run, data_parallel_plans, speed_of
    from pipeplan.sim.cost.layers import LayerCosts

    layers = tuple(
        LayerProfile(
            f"l{i}", 1.0 + i, 2.0 + i, 4e4, 2e5, 4e4, curve=LayerCurve((0.5, 1.0 + i), (1.0, 2.0 + i), (1e4, 4e4), (1e4, 4e4))
        )
        for i in range(3)
    )
    profile = ModelProfile("three", 4, layers, batch_sizes=(1, 4), cut_curves=((1e4, 4e4),) * 2)
    costs = LayerCosts(profile, "auto", "adam")
    runs = []
    for plan in data_parallel_plans(profile, 2):
        work = costs.stage(range(3), plan.microbatch_size, plan.replicas_of(0))
        step = plan.microbatches * (work.fwd_ms + work.bwd_ms) / 0.8
        steps = [{"F": step / 3, "B": 2 * step / 3} for _ in range(10)]
        runs.append(Run(plan, tuple(steps), 0.0, step))
    first = runs[0]
    runs[0] = Run(first.plan, ({"F": first.step_ms, "B": 2 * first.step_ms}, *first.compute_ms[1:]), 0.0, first.step_ms)
    assert speed_of(profile, runs) == pytest.approx(0.8)


def test_link_fit_recovers_a_line_and_never_reports_an_absurd_bandwidth() -> None:
    """Exact times of 50 us + size / 5 GB/s give both back; when noise makes the 8-byte message slower than the
    4 MiB one, the bandwidth is capped at 10x what the 4 MiB message alone shows (not 4,194,304 GB/s)."""
    from pipeplan.runtime.measurement.probe import link_fit

    sizes = [8.0, 1e6, 4e6]
    latency, bandwidth = link_fit(sizes, [50e-6 + n / 5e9 for n in sizes])
    assert latency == pytest.approx(50e-6) and bandwidth == pytest.approx(5e9)
    latency, bandwidth = link_fit([8.0, 4 * 2**20], [2.0e-3, 1.9e-3])
    assert bandwidth == pytest.approx(10 * 4 * 2**20 / 1.9e-3)


@pytest.mark.slow
def test_probe_on_a_full_disk_says_so_once_and_leaves_nothing(full_folder: Path) -> None:
    """probe --out on a full disk (a filled tmpfs: the workers are other processes): one error line naming --out and
    "no space left on device", exit 1, no file and no temporary file left."""
    if not os.path.ismount(full_folder):
        pytest.skip("the workers are other processes: this needs a real full disk (a tmpfs)")
    fill(full_folder)
    out = full_folder / "c.json"
    done = pipeplan("probe", "--local", "2", "--out", str(out), "--rounds", "2")
    assert done.returncode == 1, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: NoSpaceError: --out {str(out)!r} not written: no space left on device (ENOSPC); nothing half-written "
        "was left: free some space or write elsewhere"
    ], done.stderr
    assert leftovers(full_folder) == []


def test_the_probe_s_cluster_file_is_io_s_matrix_form_of_its_rounded_values() -> None:
    """Two CPU processes: GB/s to 4 decimals, us to 2 (the message costs to 1), GiB to 3, with the probe's notes;
    whole numbers are JSON integers, as in every cluster file io writes."""
    from pipeplan.runtime.measurement.probe import ProbeResult, cluster_json

    result = ProbeResult(
        speeds=(1.0, 0.987654), bandwidth_bytes_per_s=((0.0, 2.345678e9), (3e9, 0.0)),
        latency_ms=((0.0, 41.234e-3), (35e-3, 0.0)), allreduce_bytes_per_s=1.23456789e9, allreduce_latency_ms=12.3456e-3,
        nodes=(0, 0), memory_bytes=(16.0004 * 2**30, 7.12345 * 2**30), kind="cpu", backend="gloo",
        message_overhead_ms=123.44e-3, message_latency_ms=0.0,
    )  # fmt: skip
    expected = {
        "format": "pipeplan.cluster/1",
        "name": "two",
        "devices": [
            {"kind": "cpu", "memory_gb": 16, "speed": 1.0, "node": 0},
            {"kind": "cpu", "memory_gb": 7.123, "speed": 0.9877, "node": 0},
        ],
        "bandwidth_gb_per_s": [[0, 2.3457], [3, 0]],
        "latency_us": [[0, 41.23], [35, 0]],
        "allreduce": {"gb_per_s": 1.2346, "latency_us": 12.35},
        "message_overhead_us": 123.4,
        "notes": "measured by pipeplan probe over gloo (no profile: speeds 1.0)",
    }
    assert json.dumps(cluster_json(result, "two", None), sort_keys=True) == json.dumps(expected, sort_keys=True)


def test_matmul_fraction_is_achieved_flops_over_peak_and_reaches_the_cluster_file() -> None:
    """2 n^3 FLOPs in t seconds over the peak (capped at 1); a GPU's measured fraction is written per device to 3
    decimals, and a CPU (no peak) measures none."""
    import torch

    from pipeplan.runtime.measurement.probe import ProbeResult, cluster_json, matmul_fraction, measure_matmul_fraction

    assert matmul_fraction(8192, 2 * 8192**3 / 250e12, 312.0) == pytest.approx(250 / 312, rel=1e-12)
    assert matmul_fraction(8192, 1e-9, 312.0) == 1.0
    assert measure_matmul_fraction(torch.device("cpu")) is None
    result = ProbeResult(
        speeds=(1.0, 1.0), bandwidth_bytes_per_s=((0.0, 300e9), (300e9, 0.0)), latency_ms=((0.0, 5e-3), (5e-3, 0.0)),
        allreduce_bytes_per_s=None, allreduce_latency_ms=0.0, nodes=(0, 0), memory_bytes=(80 * 2**30, 80 * 2**30),
        kind="NVIDIA H100 80GB HBM3", backend="nccl", matmul_fractions=(0.80123, None),
    )  # fmt: skip
    devices = cluster_json(result, "two", None)["devices"]
    assert devices[0]["kind"] == "H100" and devices[0]["matmul_fraction"] == 0.801
    assert "matmul_fraction" not in devices[1]
