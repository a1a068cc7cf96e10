"""The `pipeplan plan` command's adaptive setting end to end in-process: --adaptive, --memory-budget, then adapt --plan."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli_runner import run
from pipeplan.core.plan import MEMORY_MARGIN
from pipeplan.io.plan_json import read_plan
from pipeplan.presets.resolve import load_cluster, load_profile
from pipeplan.sim.cost.memory import memory_per_device
from pipeplan.sim.cost.model import CostModel
from pipeplan.sim.plan_sim import simulate_plan

CLUSTER = {"format": "pipeplan.cluster/1", "name": "two", "nodes": 2, "gpus_per_node": 1, "device": {"kind": "V100"},
           "intra_node_gb_per_s": 100, "inter_node_gb_per_s": 10, "latency_us": 5}  # fmt: skip
"""Two 16 GB V100s 10 GB/s apart: bert-48 in 2 stages of 16 microbatches, whose peak grows with k up to k = 8."""
PLAN = ["plan", "--profile", "dapple/bert-48", "--cluster", "two.json", "--global-batch", "32", "--microbatch-size", "2",
        "--replication", "none"]  # fmt: skip
GIB = float(1 << 30)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> CostModel:
    """The plans' cost model (the command's defaults: auto scaling, adam)."""
    path = tmp_path_factory.mktemp("cluster") / "two.json"
    path.write_text(json.dumps(CLUSTER))
    return CostModel.build(load_profile("dapple/bert-48"), load_cluster(str(path)))


def planned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *extra: str) -> Path:
    """Run plan --adaptive with `extra` flags into tmp_path/plan.json; its path."""
    (tmp_path / "two.json").write_text(json.dumps(CLUSTER))
    monkeypatch.chdir(tmp_path)
    code, out, err = run(monkeypatch, capsys, *PLAN, "--adaptive", *extra, "--out", "plan.json")
    assert code == 0, err
    assert "adaptive: starts at k=" in out
    return tmp_path / "plan.json"


def test_plan_adaptive_writes_every_k_within_the_budget_and_starts_at_the_fastest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], model: CostModel
) -> None:
    """The default budget is the device memory less the margin; k_choices are exactly the k whose simulated peak fits
    it (brute force over k); the start k is the fastest of them at nominal bandwidth (within 0.1 %)."""
    plan, _ = read_plan(planned(tmp_path, monkeypatch, capsys))
    assert plan.schedule == "kfkb" and plan.adaptive is not None
    device = min(d.memory_bytes for d in model.cluster.devices)
    assert plan.adaptive.memory_budget_bytes == pytest.approx((1 - MEMORY_MARGIN) * device)
    at = {k: dataclasses.replace(plan, k=k, adaptive=None) for k in range(1, plan.microbatches + 1)}
    fits = [k for k, p in at.items() if max(memory_per_device(p, model)) <= plan.adaptive.memory_budget_bytes]
    assert list(plan.adaptive.k_choices) == fits
    times = {k: simulate_plan(at[k], model, record=False).iteration_time for k in fits}
    assert plan.k == min(k for k in fits if times[k] <= min(times.values()) * 1.001)


def test_a_budget_limits_the_k_and_adapt_plan_runs_within_the_block(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], model: CostModel
) -> None:
    """--memory-budget between k=2's and k=3's peak keeps k 1..2; adapt --plan starts at the plan's k, tries only
    its k_choices, reports the block's budget and each k's peak, and prints the peak of each k used."""
    first, _ = read_plan(planned(tmp_path, monkeypatch, capsys))
    peak = {k: max(memory_per_device(dataclasses.replace(first, k=k, adaptive=None), model)) for k in (2, 3)}
    budget = int((peak[2] + peak[3]) / 2)
    plan, _ = read_plan(planned(tmp_path, monkeypatch, capsys, "--memory-budget", str(budget)))
    assert plan.adaptive is not None and plan.adaptive.k_choices == (1, 2)
    assert plan.adaptive.memory_budget_bytes == budget
    (tmp_path / "t.json").write_text(json.dumps([{"t_ms": 0, "link": "all", "factor": 0.5}]))
    args = ["adapt", "--plan", "plan.json", "--bandwidth-trace", "t.json", "--iterations", "3"]
    code, out, err = run(monkeypatch, capsys, *args, "--json")
    assert code == 0, err
    obj = json.loads(out)
    assert obj["memory_budget_bytes"] == budget and sorted(obj["fixed_k"]) == ["1", "2"]
    assert set(obj["peak_bytes_per_k"]) == {"1", "2"} and max(obj["peak_bytes_per_k"].values()) <= budget
    assert obj["decisions"][0]["k"] == plan.k and obj["decisions"][0]["reason"].startswith("start: k=")
    code, out, err = run(monkeypatch, capsys, *args, "--memory-budget", f"{peak[3] / GIB + 0.5:.3f}GiB")
    assert code == 0, err
    assert "per device; peak of each k used: k=" in out and "fixed k=3" in out  # the flag overrides the block's budget


def test_plan_bandwidth_trace_writes_the_setting_when_its_plan_is_kfkb_and_none_otherwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--bandwidth-trace with --schedule kfkb: the chosen plan carries the block (default budget); under auto the
    trace's choice here is an interleaved plan, which has no k, so it is written without one."""
    (tmp_path / "two.json").write_text(json.dumps(CLUSTER))
    (tmp_path / "tr.json").write_text(json.dumps([{"t_ms": 0, "link": "all", "factor": 0.3},
                                                  {"t_ms": 3000, "link": "all", "factor": 1.0}]))  # fmt: skip
    monkeypatch.chdir(tmp_path)
    for schedule, name in (("kfkb", "k.json"), ("auto", "a.json")):
        code, _, err = run(monkeypatch, capsys, *PLAN, "--schedule", schedule, "--bandwidth-trace", "tr.json", "--out", name)
        assert code == 0, err
    kfkb, _ = read_plan(tmp_path / "k.json")
    assert kfkb.adaptive is not None and kfkb.k in kfkb.adaptive.k_choices
    auto, _ = read_plan(tmp_path / "a.json")
    assert auto.schedule == "interleaved-1f1b" and auto.adaptive is None


TP_PROFILE = "gpt:layers=2,hidden=256,heads=16,seq=128,vocab=1024"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--tensor-parallel", "3"), "tensor_parallel 3 does not divide layer"),
        (("--tensor-parallel", "0"), "--tensor-parallel must be an integer >= 1"),
        (("--zero", "1", "--replication", "none"), "zero 1 shards state"),
        (("--zero", "1", "--tensor-parallel", "16"), "no plan can have two"),
        (("--zero", "3"), "--zero too large"),
        (("--tensor-parallel", "2", "--planner", "dapple"), "planner 'dapple' plans tp 1 and zero 0 only"),
        (("--sequence-parallel", "yes"), "--sequence-parallel must be one of auto, on, off"),
        (("--sequence-parallel", "on", "--planner", "megatron"), "planner 'megatron' plans no sequence parallelism"),
    ],
)
def test_plan_refuses_bad_tensor_and_zero_options_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path, args: tuple[str, ...], says: str
) -> None:
    out_file = tmp_path / "plan.json"
    code, _, err = run(
        monkeypatch, capsys, "plan", "--profile", TP_PROFILE, "--cluster", "dgx-a100-8x2", "--global-batch", "16",
        "--out", str(out_file), *args,
    )  # fmt: skip
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and says in err and err.startswith("error: PlanError")
    assert not out_file.exists()


def test_plan_with_tensor_parallelism_across_servers_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(
        monkeypatch, capsys, "plan", "--profile", TP_PROFILE, "--cluster", "dgx-a100-8x2", "--global-batch", "16",
        "--tensor-parallel", "16", "--json",
    )  # fmt: skip
    assert code == 0
    obj = json.loads(out)
    assert obj["stages"][0]["tp"] == 16
    assert any("span servers" in note for note in obj["notes"])
    assert obj["tensor_search"]["flat_searched"] is False


def test_plan_sequence_parallel_on_and_off_are_written_in_the_plan_file(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """`plan --sequence-parallel on` (off) writes sequence_parallel true on every stage of its forced tp 4 (leaves it
    out: false)."""
    for setting, want in (("on", True), ("off", False)):
        path = tmp_path / f"{setting}.json"
        code, _, err = run(
            monkeypatch, capsys, "plan", "--profile", TP_PROFILE, "--cluster", "dgx-a100-8x2", "--global-batch", "16",
            "--tensor-parallel", "4", "--sequence-parallel", setting, "--out", str(path),
        )  # fmt: skip
        assert code == 0, err
        stages = json.loads(path.read_text())["stages"]
        assert [(stage["tp"], stage.get("sequence_parallel", False)) for stage in stages] == [(4, want)] * len(stages)


def test_a_plan_file_whose_tp_does_not_divide_the_heads_is_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "bad.json"
    code, _, _ = run(
        monkeypatch, capsys, "plan", "--profile", TP_PROFILE, "--cluster", "dgx-a100-8x2", "--global-batch", "16",
        "--tensor-parallel", "4", "--out", str(path),
    )  # fmt: skip
    assert code == 0
    obj = json.loads(path.read_text())
    for stage in obj["stages"]:
        stage["tp"] = 3
        stage["devices"] = stage["devices"][: 3 * (len(stage["devices"]) // 4)]
    obj["zero"] = 0
    path.write_text(json.dumps(obj))
    code, _, err = run(monkeypatch, capsys, "simulate", "--plan", str(path), "--profile", TP_PROFILE, "--cluster", "dgx-a100-8x2")
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "does not divide" in err


@pytest.mark.parametrize(
    ("where", "value", "says"),
    [
        ("main_grads", "fp64", "main_grads must be one of 'weights', 'fp32', 'fp32_copy', got 'fp64'"),
        ("main_grads", -1, "field 'main_grads' must be a non-empty string, got -1"),
        ("norm_bytes", -8, "tp: field 'norm_bytes' must be a finite number >= 0, got -8"),
    ],
)
def test_a_profile_file_with_a_bad_gradient_layout_is_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path, where: str, value: object, says: str
) -> None:
    """A gpt: profile written out, with a bad main_grads (unknown, no string) or a negative norm_bytes on its first
    split layer: `plan` says so in one line and exits 2."""
    from pipeplan.io.profile_json import profile_to_json

    obj = profile_to_json(load_profile(TP_PROFILE))
    if where == "main_grads":
        obj["main_grads"] = value
    else:
        next(layer for layer in obj["layers"] if "norm_bytes" in layer.get("tp", {}))["tp"]["norm_bytes"] = value
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(obj))
    code, _, err = run(monkeypatch, capsys, "plan", "--profile", str(path), "--cluster", "dgx-a100-8x2", "--global-batch", "16")
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and says in err and err.startswith("error: ProfileError")


def test_plan_json_imports_neither_rich_nor_the_tables() -> None:
    """`plan --json` prints JSON only, so its process never loads rich or the plan tables (start-up, issue 36)."""
    code = (
        "import sys\n"
        "from pipeplan.cli import main\n"
        "try:\n"
        "    main(['plan', '--profile', 'pipedream/alexnet', '--cluster', 'v100-8x1', '--global-batch', '64', '--json'])\n"
        "except SystemExit as stop:\n"
        "    assert not stop.code, stop.code\n"
        "loaded = [m for m in ('rich', 'pipeplan.viz.tables', 'pipeplan.viz.plan_tables') if m in sys.modules]\n"
        "print('LOADED', *loaded, file=sys.stderr)\n"
    )
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root / "src")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert json.loads(done.stdout)["format"] == "pipeplan.plan/1"
    assert done.stderr.split("LOADED")[-1].split() == []
