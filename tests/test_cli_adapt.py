"""The `pipeplan trace` and `pipeplan adapt` commands, and `simulate --iterations`, end to end in-process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_runner import run
from pipeplan.adapt import PipelineModel
from pipeplan.io.bandwidth_trace_json import read_bandwidth_trace
from pipeplan.io.plan_json import read_plan
from pipeplan.presets.resolve import load_cluster, load_profile
from pipeplan.sim.cost.model import CostModel
from test_bad_input import ADAPT_PLAN

DATA = Path(__file__).parent / "data" / "norway_train_1.csv"


def test_trace_commands_write_the_same_bytes_for_the_same_arguments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """periodic, markov (seeded) and replay write readable traces; running again writes identical files."""
    commands = {
        "p.json": ["periodic", "--period-ms", "400", "--duty", "0.5", "--factor", "0.25", "--links", "7=8",
                   "--duration-ms", "4000"],
        "m.json": ["markov", "--seed", "3", "--mean-slow-ms", "300", "--mean-fast-ms", "500", "--factor-range", "0.1,0.5",
                   "--links", "7-8,8-7", "--duration-ms", "8000"],
        "r.json": ["replay", str(DATA), "--nominal", "2.7", "--time-scale", "0.5", "--links", "7=8"],
    }  # fmt: skip
    for name, args in commands.items():
        first = tmp_path / name
        code, out, _ = run(monkeypatch, capsys, "trace", *args, "--out", str(first))
        assert code == 0 and out.startswith(f"wrote {first}: ")
        again = tmp_path / f"again-{name}"
        assert run(monkeypatch, capsys, "trace", *args, "--out", str(again))[0] == 0
        assert first.read_bytes() == again.read_bytes()
        assert read_bandwidth_trace(first).links() == ((7, 8), (8, 7))
    replayed = json.loads((tmp_path / "r.json").read_text())
    assert replayed["generator"]["kind"] == "replay" and replayed["generator"]["unit"] == "mbit_per_s"
    assert any("Riiser" in line for line in replayed["generator"]["source"])
    assert read_bandwidth_trace(tmp_path / "r.json").end_ms == pytest.approx(298.81 * 0.5 * 1000)


@pytest.fixture
def adapt_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Path:
    """A two-stage bert-48 plan across the 25 Gb/s NICs of v100-8x2-25g and a periodic trace on that link."""
    (tmp_path / "plan.json").write_text(json.dumps(ADAPT_PLAN))
    args = ["trace", "periodic", "--period-ms", "6000", "--duty", "0.5", "--factor", "0.2", "--links", "7=8"]
    assert run(monkeypatch, capsys, *args, "--duration-ms", "60000", "--out", str(tmp_path / "t.json"))[0] == 0
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_adapt_prints_every_policy_and_the_controllers_switches(
    adapt_files: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The table lists the controller, 1F1B, GPipe, the best fixed k, the oracle and each fixed k; the PNG is written."""
    code, out, err = run(
        monkeypatch, capsys, "adapt", "--plan", "plan.json", "--bandwidth-trace", "t.json", "--iterations", "8", "--png", "a.png"
    )
    assert code == 0, err
    for name in ("adaptive", "1f1b", "gpipe", "best_static", "oracle"):
        assert name in out
    assert out.count("fixed k=") == 6 and "fixed k: the 6 fastest of 8 shown (--json lists every one)" in out
    assert "best fixed k in hindsight: k=" in out and "decision time mean" in out
    assert "iteration 0: start: k=" in out or "switches" in out
    assert (adapt_files / "a.png").stat().st_size > 10_000


def test_adapt_json_has_the_issues_shape_and_is_deterministic_but_for_timing(
    adapt_files: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """policies -> {total_ms, iteration_ms, k, peak_bytes}, decisions with reasons; two runs agree except decision times."""
    args = ["adapt", "--plan", "plan.json", "--bandwidth-trace", "t.json", "--iterations", "6", "--json"]
    runs = []
    for _ in range(2):
        code, out, _ = run(monkeypatch, capsys, *args)
        assert code == 0
        obj = json.loads(out)
        timing = obj.pop("controller")
        assert set(timing) == {"decision_ms_mean", "decision_ms_max", "decision_share_max", "decision_cpu_ms_mean"}
        runs.append(obj)
    assert runs[0] == runs[1]
    obj = runs[0]
    assert set(obj["policies"]) == {"adaptive", "1f1b", "gpipe", "best_static", "oracle"}
    adaptive = obj["policies"]["adaptive"]
    assert len(adaptive["iteration_ms"]) == len(adaptive["k"]) == len(adaptive["peak_bytes"]) == 6
    assert adaptive["total_ms"] == pytest.approx(adaptive["start_ms"][-1] + adaptive["iteration_ms"][-1])
    assert obj["decisions"][0]["reason"].startswith("start: k=")
    assert {"factors", "bandwidth_gb_per_s", "predicted_ms", "peak_bytes", "memory_limit_bytes"} <= set(obj["decisions"][1])
    assert obj["policies"]["oracle"]["total_ms"] <= min(run["total_ms"] for run in obj["fixed_k"].values()) + 1e-6


def test_simulate_iterations_reports_each_iteration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """simulate --iterations N under a trace: N per-iteration times that add up, each start the previous end."""
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps([{"t_ms": 0, "link": [1, 2], "factor": 0.25}, {"t_ms": 150, "link": [1, 2], "factor": 1.0}]))
    code, out, _ = run(monkeypatch, capsys, "simulate", "1f1b", "-p", "4", "-m", "16", "--comm", "1", "--bandwidth-trace",
                       str(trace), "--iterations", "4", "--json")  # fmt: skip
    assert code == 0
    iterations = json.loads(out)["iterations"]
    times, starts = iterations["iteration_ms"], iterations["start_ms"]
    assert len(times) == 4 and starts[1] == times[0] and iterations["total_ms"] == pytest.approx(sum(times))
    assert times[0] > times[-1] == 85.0


def test_adapt_iterations_beyond_the_work_limit_are_refused_before_any_policy_runs(
    adapt_files: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """adapt --iterations 10,000,000: one line naming the flag and the most iterations that fit, before the controller
    is built (it generates every k's schedule) or any iteration is simulated."""
    import pipeplan.adapt.fixed_baselines as compare

    monkeypatch.setattr(compare, "AdaptiveController", lambda *a, **k: pytest.fail("built the controller"))
    args = ["adapt", "--plan", "plan.json", "--bandwidth-trace", "t.json", "--iterations", "10000000"]
    code, out, err = run(monkeypatch, capsys, *args)
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: AdaptError: adapt of a 2-stage pipeline, m=8")
    assert "(--iterations 10,000,000) too large" in lines[0] and "or fewer" in lines[0]


def test_simulate_plan_iterations_are_priced_before_the_plan_is_simulated(
    adapt_files: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """simulate --plan --iterations over the limit: refused before the API simulates the plan's first iteration."""
    import pipeplan.api as api

    monkeypatch.setattr(api, "simulate", lambda *a, **k: pytest.fail("simulated"))
    code, _, err = run(monkeypatch, capsys, "simulate", "--plan", "plan.json", "--iterations", "100000000")
    assert code == 2 and "plan plan.json (--iterations 100,000,000) too large" in err
    assert len(err.strip().splitlines()) == 1


def test_adapt_json_shows_the_all_reduces_slowdown_and_the_rings_estimate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A plan of two 2-device stages under a trace that slows only stage 0's ring (4,5),(5,4) to 0.25: the trace is
    accepted (it names a link the plan's all-reduces use), each run's "allreduce" shows stage 0's mean all-reduce
    latency + 4 x its work against the nominal one, stage 1's unchanged, and from the second decision on the
    controller's "ring_factors" give stage 0's ring 0.25."""
    plan = {**ADAPT_PLAN, "stages": [{"first_layer": 0, "last_layer": 26, "devices": [4, 5]},
                                     {"first_layer": 27, "last_layer": 52, "devices": [8, 9]}]}  # fmt: skip
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    (tmp_path / "t.json").write_text(json.dumps([{"t_ms": 0, "link": link, "factor": 0.25} for link in ([4, 5], [5, 4])]))
    monkeypatch.chdir(tmp_path)
    code, out, err = run(
        monkeypatch, capsys, "adapt", "--plan", "plan.json", "--bandwidth-trace", "t.json", "--iterations", "4", "--json"
    )
    assert code == 0, err
    obj = json.loads(out)
    model = CostModel.build(load_profile("dapple/bert-48"), load_cluster("v100-8x2-25g"))
    stage = PipelineModel.from_plan(read_plan(tmp_path / "plan.json")[0], model).costs.stages[0]
    for name in ("adaptive", "1f1b", "oracle"):
        allreduce = obj["policies"][name]["allreduce"]
        assert allreduce["stages"] == [0, 1]
        assert allreduce["nominal_ms"][0] == stage.allreduce_ms
        slowed = stage.allreduce_latency_ms + 4 * stage.allreduce_work_ms
        assert allreduce["mean_ms"][0] == pytest.approx(slowed, rel=1e-9)
        assert allreduce["slowdown"][0] == pytest.approx(slowed / stage.allreduce_ms, rel=1e-9) and allreduce["slowdown"][0] > 3
        assert allreduce["mean_ms"][1] == pytest.approx(allreduce["nominal_ms"][1], rel=1e-9)
    assert obj["decisions"][0]["ring_factors"] == {"0": 1.0, "1": 1.0}
    assert obj["decisions"][1]["ring_factors"]["0"] == pytest.approx(0.25, rel=1e-9)
    assert obj["decisions"][1]["ring_factors"]["1"] == pytest.approx(1.0, rel=1e-9)
