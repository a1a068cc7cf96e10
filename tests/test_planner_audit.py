"""Tests of the planner audit: it passes sound planners on fuzz requests and catches each kind of broken answer."""

from __future__ import annotations

import dataclasses
import re

import pytest

from pipeplan.core.errors import PlanError
from pipeplan.planner.planners import PLANNERS as REGISTRY
from pipeplan.planner.request import PlanRequest, PlanResult
from planner_audit import audit
from planner_instances import fuzz_request

PLANNERS = ("pipeplan", "dapple", "pipedream", "balanced")


@pytest.mark.slow
@pytest.mark.parametrize("seed", [41, 52, 161, 786])
def test_fuzz_requests_that_once_broke_an_invariant_pass(seed: int) -> None:
    """Seeds where a fuzz run found dapple's list order under --schedule 1f1b (41, 52, 161) and pipedream beating
    an unseeded restricted pipeplan (786): every planner's answer is now sound."""
    request = fuzz_request(seed)
    planners = REGISTRY
    result = audit(request, {name: planners[name] for name in PLANNERS})
    assert result.ok, result.problems
    assert isinstance(result.times["pipeplan"], float)


def test_fuzz_requests_are_seeded() -> None:
    """The same seed gives the same request; another seed another one."""
    assert fuzz_request(3) == fuzz_request(3)
    assert fuzz_request(3) != fuzz_request(4)


def balanced_with(change: str):  # type: ignore[no-untyped-def]
    """The balanced planner with one thing wrong in its answer."""
    planner = REGISTRY["balanced"]

    def wrong(request: PlanRequest) -> PlanResult:
        result = planner(request)
        if change == "time":
            return dataclasses.replace(result, sim=dataclasses.replace(result.sim, iteration_time=result.iteration_time / 2))
        if change == "schedule":
            return dataclasses.replace(result, plan=dataclasses.replace(result.plan, schedule="gpipe"))
        if change == "crash":
            raise ZeroDivisionError("float division by zero")
        raise PlanError("refused")

    return wrong


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("time", "reports .* ms but its plan simulates to"),
        ("schedule", "returned schedule 'gpipe' for --schedule '1f1b'"),
        ("crash", "crashed: ZeroDivisionError"),
    ],
)
def test_each_broken_answer_is_caught(change: str, message: str) -> None:
    """A planner that under-reports its time, ignores --schedule or crashes is named with what it broke."""
    request = dataclasses.replace(fuzz_request(786), schedule="1f1b")
    result = audit(request, {"balanced": balanced_with(change)})
    assert not result.ok
    assert any(re.search(message, p) for p in result.problems), result.problems


def test_pipeplan_slower_than_a_baseline_or_missing_is_caught() -> None:
    """Posing balanced's answer (30.7 ms) as pipeplan's beside pipedream (21.5 ms), or a refusing pipeplan, breaks the
    cross-planner invariants."""
    request = fuzz_request(786)
    planners = REGISTRY
    got = audit(request, {"pipeplan": planners["balanced"], "pipedream": planners["pipedream"]})
    assert any("is slower than pipedream" in p for p in got.problems), got.problems
    refused = audit(request, {"pipeplan": balanced_with("refuse"), "balanced": planners["balanced"]})
    assert any("pipeplan found no plan" in p for p in refused.problems)
