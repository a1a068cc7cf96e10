"""Tests of planner.phase_clock: exclusive phase times that add up to the run's, the planners' "planning" record,
and plans that do not depend on the bookkeeping."""

from __future__ import annotations

import time

import pytest

from pipeplan.core.hardware.cluster import Cluster, Device
from pipeplan.core.profile import LayerProfile, ModelProfile
from pipeplan.io.plan_json import plan_to_json
from pipeplan.planner.phase_clock import PHASES, phase, planning_run, timed_phase
from pipeplan.planner.planners import run_planner
from pipeplan.planner.request import PlanRequest
from pipeplan.planner.search.selection import plan_pipeplan

GIB = 2**30


def request() -> PlanRequest:
    """Six uneven layers on four equal devices at 10 GB/s, global batch 8."""
    layers = tuple(LayerProfile(f"l{i}", 1.0 + i % 3, 2.0 + i % 2, 1e6, 1e6, 4e6) for i in range(6))
    profile = ModelProfile("tiny", 1, layers)
    devices = tuple(Device(i, "gpu", 16 * GIB) for i in range(4))
    bandwidth = tuple(tuple(0.0 if a == b else 10e9 for b in range(4)) for a in range(4))
    latency = tuple(tuple(0.0 for _ in range(4)) for _ in range(4))
    return PlanRequest(profile, Cluster("flat4", devices, bandwidth, latency), 8)


def busy(seconds: float) -> None:
    """Spend `seconds` of CPU time."""
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_without_a_clock_a_phase_does_nothing() -> None:
    with phase("simulation"):
        busy(0.001)


def test_nested_phases_are_exclusive_and_add_up_to_the_run() -> None:
    with planning_run() as clock:
        assert clock is not None
        with phase("candidates"):
            busy(0.02)
            with phase("simulation"):
                busy(0.03)
            with phase("simulation"):
                busy(0.01)
    record = clock.to_json()
    by_name = {p["name"]: p for p in record["phases"]}
    assert set(by_name) == {"other", "candidates", "simulation"}
    assert by_name["simulation"]["entries"] == 2
    # exclusive: the inner 0.04 s are the simulation's, not the candidates'
    assert by_name["simulation"]["cpu_seconds"] >= 0.04
    assert 0.02 <= by_name["candidates"]["cpu_seconds"] < 0.04
    assert record["seconds"] == pytest.approx(sum(p["seconds"] for p in record["phases"]), abs=1e-12)
    assert record["cpu_seconds"] == pytest.approx(sum(p["cpu_seconds"] for p in record["phases"]), abs=1e-12)
    assert record["peak_rss_bytes"] > 0


def test_a_run_inside_a_run_is_the_outer_runs_seeds_phase() -> None:
    @timed_phase("partition_dp")
    def work() -> None:
        busy(0.005)

    with planning_run() as outer, planning_run() as inner:
        assert inner is None
        work()
    assert outer is not None
    names = [p["name"] for p in outer.to_json()["phases"]]
    assert names == ["seeds", "partition_dp", "other"]  # PHASES order


def test_an_unknown_phase_is_refused() -> None:
    with planning_run(), pytest.raises(ValueError, match="unknown planning phase 'nope'"), phase("nope"):
        pass


@pytest.mark.parametrize("planner", ["pipeplan", "dapple", "balanced"])
def test_every_planner_records_its_phases(planner: str) -> None:
    result = run_planner(planner, request())
    record = result.extra["planning"]
    names = [p["name"] for p in record["phases"]]
    assert names and set(names) <= set(PHASES)
    assert names == [n for n in PHASES if n in names]
    assert all(p["seconds"] >= 0 and p["cpu_seconds"] >= 0 and p["peak_rss_growth_bytes"] >= 0 for p in record["phases"])
    assert sum(p["seconds"] for p in record["phases"]) == pytest.approx(record["seconds"], abs=1e-9)
    assert record["seconds"] >= result.planning_seconds  # the clock wraps the planner's own timing
    assert result.to_json("tiny", "flat4")["planning"] == record
    if planner == "pipeplan":
        assert {"seeds", "simulation", "final_simulation"} <= set(names)


def test_plans_are_the_same_with_and_without_the_bookkeeping() -> None:
    timed = run_planner("pipeplan", request())  # guarded: phases recorded
    plain = plan_pipeplan(request())  # the bare search: no clock open, every phase a no-op
    assert "planning" not in plain.extra
    assert plan_to_json(timed.plan, "tiny", "flat4") == plan_to_json(plain.plan, "tiny", "flat4")
    assert timed.iteration_time == plain.iteration_time
    assert timed.extra["simulations"] == plain.extra["simulations"]
