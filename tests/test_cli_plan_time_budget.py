"""`plan --time-budget` and `compare --time-budget` in-process: a budget that does not bind changes no byte of the plan,
one that binds (1e-9 s binds at the first checkpoint once a plan fits, whatever the machine's speed) returns a valid
plan and says so, and a bad value is refused in one line before any work."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cli_runner import run
from pipeplan.io.plan_json import read_plan
from pipeplan.presets.resolve import load_cluster, load_profile
from pipeplan.sim.cost.memory import check_fits
from pipeplan.sim.cost.model import CostModel
from pipeplan.sim.plan_sim import simulate_plan

PROBLEM = ["--profile", "dapple/bert-48", "--cluster", "v100-8x1", "--global-batch", "8"]


def plan_json(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, Any]:
    code, out, err = run(monkeypatch, capsys, "plan", *PROBLEM, "--json", *extra)
    assert code == 0, err
    return json.loads(out)


def without_timings(obj: dict[str, Any]) -> str:
    """The plan --json text but what measures time (planning_seconds, planning)."""
    return json.dumps({k: v for k, v in obj.items() if k not in ("planning_seconds", "planning")}, sort_keys=True)


@pytest.mark.slow
def test_a_budget_that_does_not_bind_leaves_the_plan_byte_identical(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--time-budget none, 100000 and the default give the same plan file and the same JSON but its timings; the
    budget is reported, the search not stopped."""
    monkeypatch.chdir(tmp_path)
    texts, files = [], []
    for i, budget in enumerate((["--time-budget", "none"], ["--time-budget", "100000"], [])):
        obj = plan_json(monkeypatch, capsys, *budget, "--out", f"p{i}.json")
        assert obj["planning"]["stopped_early"] is False
        assert obj["planning"]["time_budget_s"] == (None, 100000.0, 50.0)[i]
        texts.append(without_timings(obj))
        files.append((tmp_path / f"p{i}.json").read_bytes())
    assert texts[0] == texts[1] == texts[2]
    assert files[0] == files[1] == files[2]


def test_a_binding_budget_returns_a_valid_plan_and_says_how_far_it_got(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A budget of 1e-9 s: the plan fits and its time is its full simulation's; --json says stopped_early and the
    phase reached; the table output ends with one line saying the plan is the best found in the budget."""
    monkeypatch.chdir(tmp_path)
    obj = plan_json(monkeypatch, capsys, "--time-budget", "1e-9", "--out", "p.json")
    planning = obj["planning"]
    assert planning["time_budget_s"] == 1e-9 and planning["stopped_early"] is True
    assert planning["phase_reached"] in planning["phases_open"]
    plan, _ = read_plan(tmp_path / "p.json")
    model = CostModel.build(load_profile("dapple/bert-48"), load_cluster("v100-8x1"))
    check_fits(plan, model)
    assert obj["iteration_time"] == simulate_plan(plan, model).iteration_time
    code, out, err = run(monkeypatch, capsys, "plan", *PROBLEM, "--time-budget", "1e-9")
    assert code == 0, err
    line = out.strip().splitlines()[-1]
    assert line.startswith("time budget: pipeplan's plan is the best found in 1e-09 s; the search stopped in phase ")
    assert "simulations" in line and "--time-budget none" in line


def test_compare_gives_each_planner_run_its_own_budget(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """compare --time-budget: every planner's record carries the budget; only pipeplan's search stops early (the
    baselines plan in full) and the table is followed by its one line."""
    code, out, err = run(monkeypatch, capsys, "compare", *PROBLEM, "--planners", "pipeplan,balanced", "--time-budget",
                         "1e-9", "--json")  # fmt: skip
    assert code == 0, err
    rows = {r["planner"]: r["planning"] for r in json.loads(out)["results"]}
    assert rows["pipeplan"]["stopped_early"] is True and rows["balanced"]["stopped_early"] is False
    assert rows["pipeplan"]["time_budget_s"] == rows["balanced"]["time_budget_s"] == 1e-9
    code, out, err = run(monkeypatch, capsys, "compare", *PROBLEM, "--planners", "pipeplan,balanced", "--time-budget",
                         "1e-9")  # fmt: skip
    assert code == 0, err
    assert (
        [line for line in out.splitlines() if line.startswith("time budget:")]
        == [line for line in out.splitlines() if line.startswith("time budget: pipeplan's plan is the best found in 1e-09 s")]
        != []
    )


@pytest.mark.parametrize(
    ("command", "value", "shown"),
    [("plan", "soon", "'soon'"), ("plan", "-1", "-1.0"), ("plan", "nan", "nan"), ("plan", "inf", "inf"),
     ("compare", "-0.5", "-0.5"), ("compare", "", "''")],
)  # fmt: skip
def test_a_bad_budget_is_refused_in_one_line_before_any_work(
    command: str, value: str, shown: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """Exit 2, one stderr line naming --time-budget, the value and the way out; nothing written."""
    monkeypatch.chdir(tmp_path)
    extra = ["--out", "p.json"] if command == "plan" else ["--png", "p.png"]
    code, _out, err = run(monkeypatch, capsys, command, *PROBLEM, "--time-budget", value, *extra)
    assert code == 2
    assert err == (f"error: PlanError: --time-budget must be a finite number >= 0 (seconds; 0 or none: no limit), got {shown}\n")
    assert list(tmp_path.iterdir()) == []
