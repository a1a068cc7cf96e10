"""Tests of planner.time_budget: a budget that binds still returns a valid plan and says where the search stopped, one
that does not bind changes nothing, byte for byte. The clock is replaced by one that advances one second per read
(one read per phase change), so every budget here is a count of checkpoints and every test is deterministic."""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeplan.core.errors import PlanError
from pipeplan.core.hardware.cluster import Cluster, Device
from pipeplan.core.profile import LayerProfile, ModelProfile
from pipeplan.planner.planners import run_planner
from pipeplan.planner.request import PlanRequest, PlanResult
from pipeplan.planner.time_budget import BudgetSpent, Deadline, budget_run, budget_spent, clock_source, fallback
from pipeplan.sim.cost.memory import check_fits
from pipeplan.sim.plan_sim import simulate_plan

GIB = 2**30


def request(time_budget_s: float | None = None, schedule: str = "auto", devices: int = 4) -> PlanRequest:
    """Eight uneven layers on `devices` equal devices at 10 GB/s, global batch 16."""
    layers = tuple(LayerProfile(f"l{i}", 1.0 + i % 3, 2.0 + i % 2, 1e6, 1e6, 4e6) for i in range(8))
    profile = ModelProfile("tiny", 1, layers)
    gpus = tuple(Device(i, "gpu", 16 * GIB) for i in range(devices))
    bandwidth = tuple(tuple(0.0 if a == b else 10e9 for b in range(devices)) for a in range(devices))
    latency = tuple(tuple(0.0 for _ in range(devices)) for _ in range(devices))
    cluster = Cluster(f"flat{devices}", gpus, bandwidth, latency)
    return PlanRequest(profile, cluster, 16, schedule=schedule, time_budget_s=time_budget_s)


@contextmanager
def counting_clock() -> Iterator[None]:
    """A clock that reads 0, 1, 2, ...: a budget of n seconds is n checkpoints."""
    counter = itertools.count()
    with clock_source(lambda: float(next(counter))):
        yield


def plan_json(result: PlanResult) -> str:
    """The plan --json text of `result` without what measures time (planning_seconds, planning)."""
    obj = result.to_json("tiny", "flat4")
    obj.pop("planning_seconds")
    obj.pop("planning")
    return json.dumps(obj, sort_keys=True)


def planned(budget: float | None, schedule: str = "auto") -> PlanResult:
    with counting_clock():
        return run_planner("pipeplan", request(budget, schedule))


def valid(result: PlanResult, req: PlanRequest) -> None:
    """The plan fits, keeps the request's rules and its reported time is its full simulation's."""
    check_fits(result.plan, req.model)
    assert req.replication_violation(result.plan) is None
    assert result.iteration_time == simulate_plan(result.plan, req.model).iteration_time


def test_a_deadline_stops_only_past_its_budget_with_a_plan_to_fall_back_on_and_once() -> None:
    """check raises past the budget only when armed and ready, records the phases open, then never again."""
    now = [0.0]
    deadline = Deadline(5.0, lambda: now[0], 0.0)
    now[0] = 9.0
    deadline.check(["other", "candidates"])  # not armed: no search to catch it
    deadline.ready = lambda: False
    deadline.check(["other", "candidates"])  # armed, but nothing found yet
    deadline.ready = lambda: True
    now[0] = 5.0
    deadline.check(["other", "candidates"])  # at the budget, not past it
    now[0] = 5.5
    with pytest.raises(BudgetSpent):
        deadline.check(["other", "refine", "simulation"])
    deadline.check(["other", "final_simulation"])  # stopped once: the search finishes its plan
    assert deadline.to_json() == {
        "time_budget_s": 5.0,
        "stopped_early": True,
        "stopped_after_s": 5.5,
        "phase_reached": "refine",
        "phases_open": ["other", "refine", "simulation"],
    }


def test_no_budget_opens_no_deadline_and_fallback_without_one_does_nothing() -> None:
    """None and 0 are no limit; outside a run, fallback and budget_spent are inert."""
    for seconds in (None, 0, 0.0):
        with budget_run(seconds) as deadline:
            assert deadline is None
    with fallback(lambda: True):
        assert not budget_spent()


def test_a_binding_budget_returns_a_valid_plan_and_says_how_far_the_search_got() -> None:
    """A budget of 3 checkpoints stops the search: the plan is the fastest one scored, fits, and the record says so."""
    result = planned(3)
    valid(result, request())
    planning = result.extra["planning"]
    assert planning["time_budget_s"] == 3
    assert planning["stopped_early"] is True
    assert planning["phase_reached"] in planning["phases_open"]
    assert planning["phases_open"][0] == "other"
    assert result.extra["simulations"] < planned(None).extra["simulations"]
    # how far it got, in plan --json: the simulations and candidates when it stopped (the final one runs after)
    assert planning["simulations"] == result.extra["simulations"] and planning["candidates"] >= 1


def test_every_budget_either_stops_early_with_a_valid_plan_or_changes_nothing() -> None:
    """Over budgets from 0 to past the whole search's checkpoints: a stopped search returns a valid plan; one not
    stopped returns the unlimited plan byte for byte; the whole search's count of checkpoints does not bind."""
    free = planned(None)
    checkpoints = sum(p["entries"] for p in free.extra["planning"]["phases"])
    reference = plan_json(free)
    outcomes = set()
    for budget in sorted({*range(0, 12), *range(12, checkpoints + 3, max(1, checkpoints // 12))}):
        result = planned(budget)
        stopped = result.extra["planning"]["stopped_early"]
        outcomes.add(stopped)
        if stopped:
            valid(result, request())
        else:
            assert plan_json(result) == reference, budget
    assert outcomes == {True, False}
    assert plan_json(planned(checkpoints + 1)) == reference


def test_the_same_binding_budget_gives_the_same_plan() -> None:
    """The search's order is fixed: the same budget (in checkpoints) stops it at the same place."""
    first, second = planned(40), planned(40)
    assert plan_json(first) == plan_json(second)
    assert first.extra["planning"]["phases_open"] == second.extra["planning"]["phases_open"]


def test_a_stopped_search_keeps_the_schedule_asked_for() -> None:
    """With --schedule gpipe the pool's 1F1B plans are no answer: the search stops only once a gpipe plan is scored."""
    result = planned(0.5, "gpipe")
    assert result.extra["planning"]["stopped_early"] is True
    assert result.plan.schedule == "gpipe"
    valid(result, request(schedule="gpipe"))


def test_the_baselines_plan_in_full_under_a_budget() -> None:
    """Only pipeplan's search falls back: a baseline planner under a budget of 0 plans as without one."""
    with counting_clock():
        limited = run_planner("balanced", request(0.5))
    free = run_planner("balanced", request())
    assert limited.extra["planning"] == {**limited.extra["planning"], "time_budget_s": 0.5, "stopped_early": False}
    assert limited.plan == free.plan


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), True, "5"])
def test_a_request_refuses_a_bad_budget(bad: Any) -> None:
    """time_budget_s is a finite number >= 0 or None."""
    with pytest.raises(PlanError, match="time_budget_s must be a finite number >= 0"):
        dataclasses.replace(request(), time_budget_s=bad)


def test_on_a_dag_a_later_order_stopped_keeps_the_plan_found_and_searches_no_further_order() -> None:
    """The branchy DAG (tests/test_dag_search.py), budgets from 1 checkpoint to the whole run's: a stopped run
    returns a valid plan no slower than its default order's search found, one not stopped the unlimited plan; a
    budget that runs out in a further order's search (the default one done) stops it at once, and no order after
    it is searched."""
    from test_dag_search import branchy, two_nodes

    def planned_dag(budget: float | None) -> PlanResult:
        with counting_clock():
            return run_planner("pipeplan", PlanRequest(branchy(), two_nodes(), 8, time_budget_s=budget))

    free = planned_dag(None)
    orders = free.extra["layer_orders"]["orders"]
    assert orders > 1
    checkpoints = sum(p["entries"] for p in free.extra["planning"]["phases"])
    later = 0
    for budget in range(1, checkpoints + 2, max(1, checkpoints // 16)):
        result = planned_dag(budget)
        record = result.extra["layer_orders"]
        if not result.extra["planning"]["stopped_early"]:
            assert result.plan == free.plan and result.iteration_time == free.iteration_time
            continue
        req = PlanRequest(branchy(), two_nodes(), 8)
        valid(result, req)
        if record["ms"][0] is not None and len(record["ms"]) > 1:  # stopped in a further order's search
            later += 1
            assert result.iteration_time <= record["ms"][0]
            assert len(record["ms"]) <= orders
    assert later > 0


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    fwd=st.lists(st.floats(0.1, 5.0), min_size=2, max_size=9),
    devices=st.integers(1, 4),
    fraction=st.floats(0.0, 1.2),
)
def test_any_budget_on_any_small_chain_stops_with_a_valid_plan_or_changes_nothing(
    fwd: list[float], devices: int, fraction: float
) -> None:
    """A budget anywhere from the start to past the whole run (as a fraction of its checkpoints): stopped, the plan
    fits and its time is its full simulation's; not stopped, the unlimited plan byte for byte."""
    layers = tuple(LayerProfile(f"l{i}", f, 2 * f, 1e6, 1e6, 4e6) for i, f in enumerate(fwd))
    gpus = tuple(Device(i, "gpu", 16 * GIB) for i in range(devices))
    bandwidth = tuple(tuple(0.0 if a == b else 10e9 for b in range(devices)) for a in range(devices))
    latency = tuple(tuple(0.0 for _ in range(devices)) for _ in range(devices))
    cluster = Cluster(f"flat{devices}", gpus, bandwidth, latency)
    free = run_planner("pipeplan", PlanRequest(ModelProfile("chain", 1, layers), cluster, 8))
    checkpoints = sum(p["entries"] for p in free.extra["planning"]["phases"])
    budget = max(0.5, round(fraction * checkpoints))
    req = PlanRequest(ModelProfile("chain", 1, layers), cluster, 8, time_budget_s=budget)
    with counting_clock():
        result = run_planner("pipeplan", req)
    if result.extra["planning"]["stopped_early"]:
        valid(result, req)
    else:
        assert plan_json(result) == plan_json(free)


def test_on_a_profile_with_tensor_splits_the_3d_search_is_budgeted_too() -> None:
    """The plain search takes half the budget left and the 3D search the rest: every budget from 0 to past both
    searches' checkpoints either stops one of them with a valid plan, recorded (the 3D search's own stop in
    extra["tensor"]["stopped_early"], and in "later_stops" after the plain search's), or gives the unlimited plan."""
    from pipeplan.api.planning import plan_request

    def planned_3d(budget: float | None) -> PlanResult:
        req = plan_request("gpt:layers=2,hidden=64,heads=8,seq=32,vocab=64", "dgx-a100-8x1", 8, time_budget_s=budget)
        with counting_clock():
            return run_planner("pipeplan", req)

    req = plan_request("gpt:layers=2,hidden=64,heads=8,seq=32,vocab=64", "dgx-a100-8x1", 8, time_budget_s=None)
    free = planned_3d(None)
    reference = json.dumps(dataclasses.asdict(free.plan), sort_keys=True)
    checkpoints = sum(p["entries"] for p in free.extra["planning"]["phases"])
    seen = set()
    for budget in sorted({*range(1, 40, 3), *range(40, checkpoints + 3, max(1, checkpoints // 10))}):
        result = planned_3d(budget)
        planning, tensor = result.extra["planning"], result.extra["tensor"]
        if planning["stopped_early"]:
            valid(result, req)
            seen.add(("tensor" if tensor["stopped_early"] else "plain", "later_stops" in planning))
            # a later stop is the 3D search's, after the plain one's; a 3D stop without one is the run's first stop
            # (the plain search finished within its share), recorded as the run's own
            assert "later_stops" not in planning or (tensor["stopped_early"] and planning["later_stops"] == ["tensor_search"])
        else:
            assert not tensor["stopped_early"] and json.dumps(dataclasses.asdict(result.plan), sort_keys=True) == reference
    # both searches stopped somewhere: the plain one at its share, the 3D one after it (later_stops); whether a
    # budget also exists that stops only one of them depends on the two searches' relative checkpoint counts
    assert ("tensor", True) in seen
    assert all(outcome in {("tensor", True), ("plain", False), ("tensor", False)} for outcome in seen)
