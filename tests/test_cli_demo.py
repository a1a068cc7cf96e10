"""Tests of `pipeplan demo --quick`: every step's output and the files it writes (the full demo is timed by hand:
BENCHMARKS.md / the README)."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from pipeplan.cli import app
from pipeplan.cli.demo.demo_manifest import MANIFEST, check_folder, read_manifest
from pipeplan.cli.demo.demo_run import CASES, FILES, STEPS, compare_schedules
from pipeplan.cli.demo.demo_steps import DemoSetting
from pipeplan.schedules import make_schedule
from pipeplan.sim import simulate, uniform_costs
from pipeplan.viz.tables import format_ms

pytestmark = [pytest.mark.slow, pytest.mark.torch]
torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Result]:
    """Run `pipeplan demo --quick --out DIR` once for this module (DIR does not exist beforehand)."""
    out = tmp_path_factory.mktemp("demo") / "out"
    result = CliRunner().invoke(app, ["demo", "--quick", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out, result


@pytest.mark.slow
def test_demo_writes_a_png_and_a_trace_per_schedule(demo_run: tuple[Path, Result]) -> None:
    """demo --out DIR writes <name>.png and <name>.trace.json for the five schedules and prints their paths."""
    out, result = demo_run
    names = ["gpipe", "1f1b", "kfkb", "interleaved-1f1b", "zb-h1"]
    assert [c.name for c in CASES] == names
    for name in names:
        png, trace = out / f"{name}.png", out / f"{name}.trace.json"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
        assert json.loads(trace.read_text())["traceEvents"]
        assert str(png) in result.stdout and str(trace) in result.stdout
    assert sorted(p.name for p in out.iterdir()) == sorted([*FILES, MANIFEST])


@pytest.mark.slow
def test_demo_records_every_file_it_wrote_so_a_rerun_may_replace_them(demo_run: tuple[Path, Result]) -> None:
    """The manifest lists every file the demo wrote with its SHA-256, so the guard of a second run into the same
    folder accepts them all (and would refuse any other same-named file)."""
    out, _ = demo_run
    recorded = read_manifest(out)
    assert sorted(recorded) == sorted(FILES)
    assert all(recorded[name] == hashlib.sha256((out / name).read_bytes()).hexdigest() for name in FILES)
    check_folder(str(out), FILES)


def test_demo_plans_gpt2_with_every_fast_planner(demo_run: tuple[Path, Result]) -> None:
    """Step 1 lists pipeplan and the three baselines for GPT-2 projected onto A100s; step 2 writes the winner's plan,
    timeline and trace and says where."""
    out, result = demo_run
    rows = [line.split("│")[1].strip() for line in result.stdout.splitlines() if line.count("│") > 3]
    assert {"pipeplan", "dapple", "pipedream", "balanced"} <= set(rows)
    assert "gpt2-small on a100-8x2" in result.stdout
    assert (out / "plan_best.png").read_bytes()[:4] == b"\x89PNG"
    assert json.loads((out / "plan_best.trace.json").read_text())["traceEvents"]
    assert json.loads((out / "gpt2-plan.json").read_text())["cluster"] == "a100-8x2"
    for name in ("gpt2-plan.json", "plan_best.png", "plan_best.trace.json"):
        assert str(out / name) in result.stdout


def test_demo_runs_the_chain_here_and_prints_predicted_against_measured(demo_run: tuple[Path, Result]) -> None:
    """Step 3 profiles, probes, plans and trains on local processes, then prints the loss and both step times."""
    out, result = demo_run
    text = result.stdout
    assert "loss " in text and " at step 8" in text
    measured = re.search(r"predicted ([0-9.]+) ms per step, measured ([0-9.]+) ms", text)
    assert measured is not None and float(measured.group(1)) > 0 and float(measured.group(2)) > 0
    cluster = json.loads((out / "local-cluster.json").read_text())
    assert [d["kind"] for d in cluster["devices"]] == ["cpu", "cpu"]
    assert json.loads((out / "local-plan.json").read_text())["profile"] == "local-profile.json"


def test_demo_shows_pipemare_adaptive_k_and_what_next(demo_run: tuple[Path, Result]) -> None:
    """Step 4 prints PipeMare's utilization and delays and the controller against 1F1B; step 5 names the commands."""
    out, result = demo_run
    text = result.stdout
    assert "PipeMare streams minibatches: 100.0% busy" in text and "stage delays [1, 1, 1, 0]" in text
    assert re.search(r"adaptive +[0-9.]+ s  [0-9.]+x vs 1F1B", text)
    assert (out / "adapt.png").read_bytes()[:4] == b"\x89PNG"
    for command in ("pipeplan profile", "pipeplan probe", "pipeplan plan", "pipeplan train"):
        assert command in text.split("What to try next", 1)[1]


def test_demo_table_shows_the_library_numbers(demo_run: tuple[Path, Result]) -> None:
    """Each schedule's row carries the iteration time and per-rank peak memory the simulator gives for the setting."""
    result = demo_run[1]
    s = DemoSetting()
    table = result.stdout.split("1. Plan", 1)[0]  # step 0's table (later steps name schedules too)
    rows = {line.split()[0]: line for line in table.splitlines() if line.strip()}
    for name in ("gpipe", "1f1b", "zb-h1"):
        schedule = make_schedule(name, s.stages, s.microbatches)
        costs = uniform_costs(schedule, s.fwd_ms, s.bwd_ms, comm=s.comm_ms, act_bytes=float(s.act_bytes))
        expected = simulate(schedule, costs)
        row = rows[name]
        assert format_ms(expected.iteration_time) in row.split()
        assert "/".join(f"{r.peak_memory_bytes / 2**20:.4g}" for r in expected.per_rank) in row
    # 1f1b holds at most p microbatches on rank 0 at 64 MiB each.
    assert "256/192/128/64" in rows["1f1b"]


def test_demo_trace_has_one_event_per_action(demo_run: tuple[Path, Result]) -> None:
    """The interleaved trace holds one compute event per action of the v=2 schedule."""
    events = json.loads((demo_run[0] / "interleaved-1f1b.trace.json").read_text())["traceEvents"]
    actions = sum(len(r) for r in make_schedule("interleaved-1f1b", 4, 8, chunks=2).ranks)
    assert sum(1 for e in events if e["ph"] == "X" and e["tid"] == 0) == actions


def test_demo_is_a_list_of_steps_starting_with_the_schedule_comparison() -> None:
    """Later features extend the demo by appending to STEPS."""
    assert STEPS[0] is compare_schedules


def test_demo_json_is_one_object_with_every_step(tmp_path: Path) -> None:
    """demo --json prints only JSON: each schedule's `simulate --json` object (the library's numbers), every
    planner's `plan --json` object for GPT-2, each later step's findings, and the files written (the same files as
    without --json)."""
    result = CliRunner().invoke(app, ["demo", "--quick", "--json", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    got = json.loads(result.stdout)
    s = DemoSetting()
    by_label = {r["label"]: r for r in got["schedules"]["results"]}
    schedule = make_schedule("1f1b", s.stages, s.microbatches)
    expected = simulate(schedule, uniform_costs(schedule, s.fwd_ms, s.bwd_ms, comm=s.comm_ms, act_bytes=float(s.act_bytes)))
    assert by_label["1f1b"]["iteration_time"] == expected.iteration_time
    assert [r["planner"] for r in got["planners"]["results"]] == ["pipeplan", "dapple", "pipedream", "balanced"]
    assert sorted(Path(p).name for p in got["written"]) == sorted(p.name for p in tmp_path.iterdir() if p.name != MANIFEST)
    local = got["local"]
    assert len(local["losses"]) == 8 and local["measured_step_ms"] > 0 and local["predicted_step_ms"] > 0
    assert got["pipemare"]["utilization"] == 1.0 and got["adaptive"]["1f1b"]["k"][0] == 1
    assert got["best_plan"]["planner"] in ("pipeplan", "dapple", "pipedream", "balanced") and got["quick"] is True
    assert set(got["step_seconds"]) == {step.__name__ for step in STEPS}
