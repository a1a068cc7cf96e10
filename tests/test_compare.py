"""Tests of planner comparison: rows per planner, failures as rows, speed-ups, and `pipeplan compare` output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_runner import run
from pipeplan.planner.compare import PlannerFailure, best_baseline, best_row, compare, planner_names, speedup
from pipeplan.planner.request import PlanRequest, PlanResult
from pipeplan.presets.resolve import load_cluster, load_profile
from planner_instances import random_cluster, random_profile

FAST = "balanced,pipedream,exact"


def test_compare_gives_one_row_per_planner_with_failures_as_rows() -> None:
    """exact refuses 16 distinct GPUs: its row is a PlannerFailure with the message; the others found plans."""
    request = PlanRequest(load_profile("dapple/bert-48"), load_cluster("v100-8x2-25g"), 64)
    rows = compare(request, ["balanced", "pipedream", "exact"])
    assert [r.planner for r in rows] == ["balanced", "pipedream", "exact"]
    assert isinstance(rows[0], PlanResult) and isinstance(rows[1], PlanResult)
    assert isinstance(rows[2], PlannerFailure) and "handles at most" in rows[2].error


def test_compare_runs_each_baseline_once_and_pipeplan_seeds_from_its_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each baseline plans once in a comparison; pipeplan takes their rows as seeds and finds the plan `plan` finds."""
    import pipeplan.planner.baselines as baselines
    import pipeplan.planner.planners as registry

    request = PlanRequest(random_profile(3, 6), random_cluster(3, 4), 16)
    alone = registry.PLANNERS["pipeplan"](request)
    calls: list[str] = []
    for name in ("dapple", "pipedream", "balanced"):
        planner = baselines.BASELINES[name]

        def counted(req: PlanRequest, progress: object = None, _name: str = name, _planner: object = planner) -> PlanResult:
            calls.append(_name)
            return _planner(req)  # type: ignore[operator]

        monkeypatch.setitem(baselines.BASELINES, name, counted)
        monkeypatch.setitem(registry.PLANNERS, name, counted)
    rows = compare(request, ["pipeplan", "dapple", "pipedream", "balanced"])
    assert [r.planner for r in rows] == ["pipeplan", "dapple", "pipedream", "balanced"]
    assert sorted(calls) == ["balanced", "dapple", "pipedream"]
    row = rows[0]
    assert isinstance(row, PlanResult) and row.plan == alone.plan and row.iteration_time == alone.iteration_time
    assert row.extra["seeds_reused"] == ["dapple", "pipedream", "balanced"]
    assert row.extra["seeds"] == alone.extra["seeds"]


def test_default_planners_start_with_pipeplan_then_baselines() -> None:
    """All registered planners run, in the order pipeplan, dapple, pipedream, balanced, exact."""
    names = planner_names()
    assert names[:5] == ["pipeplan", "dapple", "pipedream", "balanced", "exact"]


def test_speedup_is_best_baseline_over_row() -> None:
    """On a small random instance: the best baseline is the fastest of dapple/pipedream/balanced; exact's speed-up >= 1."""
    request = PlanRequest(random_profile(1, 6), random_cluster(1, 4), 16)
    rows = compare(request, ["dapple", "pipedream", "balanced", "exact"])
    baseline = best_baseline(rows)
    assert baseline is not None
    assert baseline.iteration_time == min(r.iteration_time for r in rows if isinstance(r, PlanResult) and r.planner != "exact")
    exact = next(r for r in rows if r.planner == "exact")
    ratio = speedup(exact, baseline)
    assert ratio is not None and ratio >= 1.0 - 1e-12
    assert best_row(rows) is exact or best_row(rows).iteration_time == exact.iteration_time  # type: ignore[union-attr]


def test_compare_json_shape(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """--json prints {"results": [...]}: plan objects with timings, and {planner, error, planning_seconds} for failures."""
    code, out, _ = run(
        monkeypatch, capsys, "compare", "--profile", "dapple/bert-48", "--cluster", "v100-8x2-25g",
        "--global-batch", "64", "--planners", FAST, "--json",
    )  # fmt: skip
    assert code == 0
    results = json.loads(out)["results"]
    assert [r["planner"] for r in results] == ["balanced", "pipedream", "exact"]
    for r in results[:2]:
        assert {"stages", "schedule", "microbatches", "iteration_time", "memory_per_device", "planning_seconds"} <= set(r)
        assert r["format"] == "pipeplan.plan/1" and r["iteration_time"] > 0
    assert set(results[2]) == {"planner", "error", "planning_seconds"}


@pytest.mark.slow
def test_compare_table_and_png(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The table names every planner, lists exact's refusal under it, and --png writes the fastest plan's timeline."""
    png = tmp_path / "best.png"
    code, out, _ = run(
        monkeypatch, capsys, "compare", "--profile", "dapple/bert-48", "--cluster", "v100-8x2-25g",
        "--global-batch", "64", "--planners", FAST, "--png", str(png),
    )  # fmt: skip
    assert code == 0
    for name in ("balanced", "pipedream", "exact"):
        assert name in out
    assert "exact: planner 'exact' handles at most" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_compare_unknown_planner_exits_2(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown planner name is a one-line error with exit code 2."""
    code, _, err = run(
        monkeypatch, capsys, "compare", "--profile", "dapple/bert-48", "--cluster", "v100-8x1",
        "--global-batch", "64", "--planners", "nope",
    )  # fmt: skip
    assert code == 2
    assert "unknown planner 'nope'" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--planners", ","], "--planners ',': no planner named; choose among"),
        (["--planners", "balanced,nope"], "--planners 'balanced,nope': unknown planner 'nope'"),
        (["--png", "best.xyz"], "--png 'best.xyz' must end with .png"),
    ],
)
def test_compare_checks_planners_and_outputs_before_planning(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    """No planner, an unknown one among known ones, or a bad --png: exit 2, one line, before any planner runs."""
    code, out, err = run(monkeypatch, capsys, "compare", "--profile", "dapple/bert-48", "--cluster", "v100-8x1",
                         "--global-batch", "64", *args)  # fmt: skip
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and message in err, err


@pytest.mark.slow
def test_compare_takes_a_schedule_and_an_optimizer_factor(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--schedule gpipe: pipeplan's plan is GPipe and the 1F1B-only baselines say why they have none;
    --optimizer-factor 6 raises every plan's memory over the default Adam's 2; a negative factor is refused."""
    common = ["compare", "--profile", "pipedream/vgg16", "--cluster", "v100-8x1", "--global-batch", "64", "--json"]
    code, out, _ = run(monkeypatch, capsys, *common, "--schedule", "gpipe", "--planners", "pipeplan,balanced")
    rows = {r["planner"]: r for r in json.loads(out)["results"]}
    assert code == 0 and rows["pipeplan"]["schedule"] == "gpipe" and "runs 1f1b only" in rows["balanced"]["error"]
    memory = {}
    for factor in ("2", "6"):
        code, out, _ = run(monkeypatch, capsys, *common, "--planners", "balanced", "--optimizer-factor", factor)
        memory[factor] = max(json.loads(out)["results"][0]["memory_per_device"])
    assert memory["6"] > memory["2"]
    code, _, err = run(monkeypatch, capsys, *common, "--optimizer-factor", "-1")
    assert code == 2 and "--optimizer-factor must be a finite number >= 0" in err
