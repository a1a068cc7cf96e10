"""planner.trace_aware and `plan --bandwidth-trace`: finalists re-scored by expected time under a trace."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from adapt_cases import bert_plan
from cli_runner import run
from pipeplan.core.hardware.bandwidth_trace import BandwidthTrace, TraceStep
from pipeplan.planner.search.trace_aware import MAX_ITERATIONS, MIN_ITERATIONS, iterations_to_cover, rescore, score_under_trace
from pipeplan.sim.plan_sim import simulate_plan

SLOW_NIC = BandwidthTrace((TraceStep(0.0, (7, 8), 0.2), TraceStep(0.0, (8, 7), 0.2)))


def test_runs_cover_the_trace_within_bounds() -> None:
    """Enough iterations of the idle time to pass the last step, never fewer than 10 nor more than 200."""
    trace = BandwidthTrace((TraceStep(0.0, None, 0.5), TraceStep(5000.0, None, 1.0)))
    assert iterations_to_cover(trace, 200.0) == 26
    assert iterations_to_cover(trace, 5000.0) == MIN_ITERATIONS
    assert iterations_to_cover(trace, 1.0) == MAX_ITERATIONS


def test_an_idle_trace_scores_a_plan_at_its_idle_time_or_better() -> None:
    """Under a trace of factor 1 the expected time is the idle time of the better of 1F1B and the controller's k."""
    plan, model = bert_plan(8)
    idle = simulate_plan(plan, model, record=False).iteration_time
    score = score_under_trace(plan, model, BandwidthTrace((TraceStep(0.0, None, 1.0),)), 0, iterations=4)
    assert score.expected_ms <= idle * (1 + 1e-9) and score.how.startswith("adaptive kFkB")


def test_a_slow_link_under_one_plan_lets_the_other_win() -> None:
    """Two plans alike but for the device pair at their cross-node boundary: the one whose pair the trace slows loses."""
    plan, model = bert_plan(8)
    other = dataclasses.replace(
        plan, stages=tuple(dataclasses.replace(s, devices=(d,)) for s, d in zip(plan.stages, (5, 6, 9, 10), strict=True))
    )
    scores = rescore([plan, other], model, SLOW_NIC, iterations=4)
    assert [s.plan for s in scores] == [other, plan]
    assert scores[0].idle_rank == 1 and scores[0].expected_ms < scores[1].expected_ms


@pytest.mark.slow
def test_plan_with_a_trace_reports_the_rescored_finalists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """plan --bandwidth-trace --json adds the candidates, whether the choice changed and the expected gain."""
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps([{"t_ms": 0, "link": "all", "factor": 0.5}, {"t_ms": 400, "link": "all", "factor": 1.0}]))
    args = ["plan", "--profile", "dapple/gnmt-16", "--cluster", "pcie-4x4-10g", "--global-batch", "64", "--microbatch-size", "16"]
    code, out, err = run(monkeypatch, capsys, *args, "--bandwidth-trace", str(trace), "--trace-iterations", "3", "--json")
    assert code == 0, err
    report = json.loads(out)["bandwidth_trace"]
    assert 1 <= len(report["candidates"]) <= 4 and report["candidates"][0]["iterations"] == 3
    assert report["expected_ms"] == min(c["expected_ms"] for c in report["candidates"])
    assert report["expected_gain"] >= 0 and isinstance(report["changed"], bool)
    code, out, _ = run(monkeypatch, capsys, *args, "--bandwidth-trace", str(trace), "--trace-iterations", "3")
    assert code == 0 and "finalists under the bandwidth trace" in out and "the trace " in out


def test_trace_iterations_beyond_the_work_limit_are_refused_before_planning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """plan --trace-iterations 1,000,000,000: priced with the smallest finalists and refused before the planner runs."""
    import pipeplan.planner.planners as registry

    trace = tmp_path / "t.json"
    trace.write_text(json.dumps([{"t_ms": 10, "link": "all", "factor": 0.5}]))
    monkeypatch.setattr(registry, "run_planner", lambda *a, **k: pytest.fail("planned"))
    args = ["plan", "--profile", "dapple/bert-48", "--cluster", "v100-8x2-25g", "--global-batch", "16",
            "--bandwidth-trace", str(trace), "--trace-iterations", "1000000000"]  # fmt: skip
    code, out, err = run(monkeypatch, capsys, *args)
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "re-scoring 4 finalists under the trace (--trace-iterations 1,000,000,000) too large" in lines[0]


def test_rescoring_real_finalists_is_priced_from_their_sizes() -> None:
    """check_rescoring with the finalists themselves: a count the smallest plans pass is refused for bert's plan."""
    from pipeplan.core.errors import PlanError
    from pipeplan.planner.search.trace_aware import check_rescoring

    plan, _ = bert_plan(64)
    trace = BandwidthTrace((TraceStep(10.0, None, 0.5),))
    check_rescoring(None, trace, 50_000, "--trace-iterations")
    with pytest.raises(PlanError, match=r"re-scoring 1 finalists .*\(--trace-iterations 50,000\) too large"):
        check_rescoring([plan], trace, 50_000, "--trace-iterations")
    check_rescoring([plan], trace, None, "--trace-iterations")  # the default: at most MAX_ITERATIONS
