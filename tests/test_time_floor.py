"""Tests of planner.search.time_floor and Evaluator.floor: never above the evaluator's time, on random plans of every
schedule the floor covers (short runs simulated in full, long ones extrapolated); tight on an even pipeline."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeplan.core.hardware.cluster import Cluster, Device
from pipeplan.core.plan import Plan, Stage
from pipeplan.core.profile import LayerProfile, ModelProfile
from pipeplan.planner.request import PlanRequest
from pipeplan.planner.search.scoring import Evaluator
from pipeplan.planner.search.time_floor import chain_floor
from pipeplan.schedules.one_f_one_b import one_f_one_b
from pipeplan.sim import simulate
from pipeplan.sim.cost.synthetic import uniform_costs

GIB = 2**30


@st.composite
def instances(draw: st.DrawFn) -> tuple[Evaluator, Plan]:
    layers = draw(st.integers(2, 7))
    devices = draw(st.integers(2, 4))
    times = st.floats(0.1, 5.0)
    profile = ModelProfile(
        "r",
        1,
        tuple(
            LayerProfile(f"l{i}", draw(times), draw(times), draw(st.floats(0, 5e7)), draw(st.floats(0, 5e7)), 1e6)
            for i in range(layers)
        ),
    )
    rate = st.sampled_from([1e9, 5e9, 25e9, 100e9])
    bandwidth = tuple(tuple(0.0 if a == b else draw(rate) for b in range(devices)) for a in range(devices))
    lat = st.sampled_from([0.0, 5e-6, 1e-4])
    latency = tuple(tuple(0.0 if a == b else draw(lat) for b in range(devices)) for a in range(devices))
    cluster = Cluster("rand", tuple(Device(i, "gpu", 80 * GIB) for i in range(devices)), bandwidth, latency)
    p = draw(st.integers(1, min(layers, devices)))
    cuts = sorted(draw(st.lists(st.integers(0, layers - 2), min_size=p - 1, max_size=p - 1, unique=True)))
    bounds = [-1, *cuts, layers - 1]
    order = draw(st.permutations(range(devices)))
    stages = tuple(Stage(bounds[i] + 1, bounds[i + 1], (order[i],)) for i in range(p))
    m = draw(st.sampled_from([1, 2, 3, 8, 47, 48, 49, 96, 200]))
    schedule = draw(st.sampled_from(["gpipe", "1f1b", "kfkb", "zb-h1"]))
    k = draw(st.integers(1, min(m, 24))) if schedule == "kfkb" else 1
    plan = Plan(stages, 1, m, 1, schedule, k=k)
    return Evaluator(PlanRequest(profile, cluster, m)), plan


@settings(max_examples=600, deadline=None)
@given(instances())
def test_the_floor_is_never_above_the_evaluators_time(case: tuple[Evaluator, Plan]) -> None:
    evaluator, plan = case
    floor = evaluator.floor(plan)  # before the score: from the closed form
    time = evaluator.score(plan).time_ms  # inf where the schedule cannot run (kfkb's k above a short run's m)
    assert floor <= time
    assert floor > 0


def test_the_floor_of_an_even_pipeline_is_its_fill_drain_and_steady_state() -> None:
    # p stages of F = 1, B = 2, nothing else: 1F1B takes exactly (p - 1 + m)(F + B), and so does the floor
    schedule = one_f_one_b(4, 10)
    costs = uniform_costs(schedule, 1.0, 2.0, 0.0)
    assert simulate(schedule, costs).iteration_time == pytest.approx((4 - 1 + 10) * 3.0)
    assert chain_floor(costs, 10, split=False) == pytest.approx((4 - 1 + 10) * 3.0)


def test_a_known_score_is_its_own_floor_and_chunk_stages_have_none() -> None:
    layers = tuple(LayerProfile(f"l{i}", 1.0, 2.0, 1e6, 1e6, 1e6) for i in range(4))
    cluster = Cluster(
        "flat",
        tuple(Device(i, "gpu", 80 * GIB) for i in range(2)),
        ((0.0, 10e9), (10e9, 0.0)),
        ((0.0, 0.0), (0.0, 0.0)),
    )
    evaluator = Evaluator(PlanRequest(ModelProfile("u", 1, layers), cluster, 8))
    plan = Plan((Stage(0, 1, (0,)), Stage(2, 3, (1,))), 1, 8, 1, "1f1b")
    assert evaluator.floor(plan) < evaluator.score(plan).time_ms
    assert evaluator.floor(plan) == evaluator.score(plan).time_ms
    chunks = Plan(tuple(Stage(i, i, (i % 2,)) for i in range(4)), 1, 8, 1, "interleaved-1f1b", chunks=2)
    assert evaluator.floor(dataclasses.replace(chunks)) == 0.0
