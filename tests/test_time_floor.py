"""Tests of planner.search.time_floor and Evaluator.floor: never above the evaluator's time, on random plans of every
schedule the floor covers (short runs simulated in full, long ones extrapolated); tight on an even pipeline. PassFloor:
never above the simulation of any plan of its family; exact for one microbatch through an even chain."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeplan.core.hardware.cluster import Cluster, Device
from pipeplan.core.plan import Plan, Stage
from pipeplan.core.profile import LayerProfile, ModelProfile
from pipeplan.planner.plan_space import divisors
from pipeplan.planner.request import PlanRequest
from pipeplan.planner.search.schedule_choice import interleave
from pipeplan.planner.search.scoring import FLOOR_MARGIN, Evaluator
from pipeplan.planner.search.time_floor import PassFloor, chain_floor
from pipeplan.schedules.one_f_one_b import one_f_one_b
from pipeplan.sim import simulate
from pipeplan.sim.cost.synthetic import uniform_costs
from pipeplan.sim.plan_sim import simulate_plan

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


@st.composite
def family_plans(draw: st.DrawFn) -> tuple[PlanRequest, Plan]:
    """A random model and cluster, and a plan of PassFloor's family: one device per stage, any cuts, devices,
    microbatch size and schedule (interleaved included)."""
    layers = draw(st.integers(2, 8))
    devices = draw(st.integers(2, 5))
    times = st.floats(0.05, 4.0)
    split = draw(st.booleans())
    profile = ModelProfile(
        "r",
        draw(st.sampled_from([1, 2, 4])),
        tuple(
            LayerProfile(
                f"l{i}",
                draw(times),
                (bwd := draw(times)),
                draw(st.floats(0, 5e7)),
                draw(st.floats(0, 1e7)),
                bwd_input_ms=bwd * draw(st.floats(0.0, 1.2)) if split else None,
                bwd_weight_ms=draw(times) if split else None,
            )
            for i in range(layers)
        ),
    )
    rate = st.sampled_from([1e9, 5e9, 25e9, 100e9])
    bandwidth = tuple(tuple(0.0 if a == b else draw(rate) for b in range(devices)) for a in range(devices))
    lat = st.sampled_from([0.0, 5e-3, 1e-1])
    latency = tuple(tuple(0.0 if a == b else draw(lat) for b in range(devices)) for a in range(devices))
    speeds = [draw(st.sampled_from([0.5, 1.0, 2.0])) for _ in range(devices)]
    cluster = Cluster("rand", tuple(Device(i, "gpu", 80 * GIB, speeds[i]) for i in range(devices)), bandwidth, latency)
    batch = draw(st.sampled_from([1, 2, 4, 6, 8, 12]))
    request = PlanRequest(profile, cluster, batch, batch_scaling=draw(st.sampled_from(["floor", "linear"])))
    p = draw(st.integers(1, min(layers, devices)))
    cuts = sorted(draw(st.lists(st.integers(0, layers - 2), min_size=p - 1, max_size=p - 1, unique=True)))
    bounds = [-1, *cuts, layers - 1]
    order = draw(st.permutations(range(devices)))
    stages = tuple(Stage(bounds[i] + 1, bounds[i + 1], (order[i],)) for i in range(p))
    b = draw(st.sampled_from([x for x in range(1, batch + 1) if batch % x == 0]))
    m = batch // b
    schedule = draw(st.sampled_from(["gpipe", "1f1b", "kfkb", "zb-h1"]))
    plan = Plan(stages, 1, m, b, schedule, k=draw(st.integers(1, m)) if schedule == "kfkb" else 1)
    if draw(st.booleans()):
        chunked = interleave(plan, request.model, draw(st.sampled_from([2, 3])))
        plan = chunked if chunked is not None else plan
    return request, plan


@settings(max_examples=400, deadline=None)
@given(family_plans())
def test_the_pass_floor_is_never_above_a_simulated_iteration(case: tuple[PlanRequest, Plan]) -> None:
    """PassFloor.at(p - 1) is at most the full simulation of any plan of its family (any cuts, devices, microbatch
    size that divides the batch, schedule, chunk-stages), and at most the evaluator's score."""
    request, plan = case
    crossings = plan.num_ranks - 1
    floor = PassFloor(request.model, [plan.microbatch_size]).at(crossings) * FLOOR_MARGIN  # the family at one size
    assert PassFloor(request.model, divisors(request.global_batch)).at(crossings) * FLOOR_MARGIN <= floor
    assert floor <= simulate_plan(plan, request.model, record=False).iteration_time
    score = Evaluator(request).score(plan)
    assert not score.fits or floor <= score.time_ms


def test_the_pass_floor_is_exact_for_one_microbatch_through_an_even_chain() -> None:
    """One microbatch through 4 stages of F = 1, B = I = 2 (W = 0) with 1e6-byte cuts over 1 GB/s links of 0.1 ms
    latency: GPipe takes every layer's F + B and 3 crossings of 0.1 + 1 ms each way, which is the floor with 3
    crossings; with B split in halves (no I measured) the floor counts I = 1 per layer instead, what zb-h1 passes on."""
    layers = tuple(LayerProfile(f"l{i}", 1.0, 2.0, 1e6, 0.0, bwd_input_ms=2.0, bwd_weight_ms=0.0) for i in range(4))
    bandwidth = tuple(tuple(0.0 if a == b else 1e9 for b in range(4)) for a in range(4))
    latency = tuple(tuple(0.0 if a == b else 0.1 for b in range(4)) for a in range(4))
    cluster = Cluster("even", tuple(Device(i, "gpu", 80 * GIB) for i in range(4)), bandwidth, latency)
    request = PlanRequest(ModelProfile("even", 1, layers), cluster, 1, batch_scaling="linear")
    plan = Plan(tuple(Stage(i, i, (i,)) for i in range(4)), 1, 1, 1, "gpipe")
    floor = PassFloor(request.model, [1])
    assert floor.at(3) == pytest.approx(4 * 3.0 + 2 * 3 * 1.1, rel=1e-12)
    assert simulate_plan(plan, request.model).iteration_time == pytest.approx(floor.at(3), rel=1e-12)
    assert floor.at(0) == pytest.approx(12.0, rel=1e-12)  # no crossing: the compute alone
    halves = tuple(LayerProfile(f"l{i}", 1.0, 2.0, 1e6, 0.0) for i in range(4))
    unsplit = PlanRequest(ModelProfile("even", 1, halves), cluster, 1, batch_scaling="linear")
    assert PassFloor(unsplit.model, [1]).at(3) == pytest.approx(4 * 2.0 + 2 * 3 * 1.1, rel=1e-12)
    zero_bubble = simulate_plan(dataclasses.replace(plan, schedule="zb-h1"), unsplit.model).iteration_time
    assert zero_bubble == pytest.approx(PassFloor(unsplit.model, [1]).at(3) + 1.0, rel=1e-12)  # and stage 0's W
