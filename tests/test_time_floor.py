"""Tests of planner.search.time_floor and Evaluator.floor: never above the evaluator's time, on random plans of every
schedule the floor covers (short runs simulated in full, long ones extrapolated); tight on an even pipeline. PassFloor:
never above the simulation of any plan of its family; exact for one microbatch through an even chain. resource_floor:
never above a simulation with queueing transfers, exact on one link; screening with the floors never changes what the
local searches and the ranking choose."""

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
from pipeplan.planner.search.refine import improve_placement, refine_boundaries, twin_classes
from pipeplan.planner.search.schedule_choice import interleave
from pipeplan.planner.search.scoring import FLOOR_MARGIN, Evaluator
from pipeplan.planner.search.selection import Search
from pipeplan.planner.search.time_floor import PassFloor, chain_floor, resource_floor
from pipeplan.schedules import make_schedule
from pipeplan.schedules.one_f_one_b import one_f_one_b
from pipeplan.sim import Costs, Flow, StageCost, simulate
from pipeplan.sim.cost.synthetic import uniform_costs
from pipeplan.sim.cost.types import GradBucket
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


SHARED = ("nic:0:out", "nic:1:in", "pair:a", "pair:b")
TIMES = st.sampled_from([0.0, 0.1, 0.25, 0.3, 1.0, 1.7, 3.0])


@st.composite
def shared_costs(draw: st.DrawFn, stages: int) -> Costs:
    """Random stage costs (split or halved backwards, bucketed or plain all-reduces, optimizer steps) and transfers of
    0-2 flows on 1-2 resources of a small pool, so that transfers of both directions and of several boundaries queue
    on one resource."""

    def flows(src: int, dst: int) -> tuple[Flow, ...]:
        out = []
        for _ in range(draw(st.integers(0, 2))):
            resources = tuple(draw(st.lists(st.sampled_from(SHARED), min_size=1, max_size=2, unique=True)))
            out.append(Flow(resources, (src, dst), draw(TIMES), draw(TIMES)))
        return tuple(out)

    def stage() -> StageCost:
        allreduce = draw(TIMES)
        buckets = (GradBucket(0.5, allreduce / 2), GradBucket(1.0, allreduce / 2)) if draw(st.booleans()) else ()
        split = draw(st.sampled_from([None, 0.0, 0.5, 1.0]))
        bwd = draw(TIMES)
        return StageCost(
            draw(TIMES),
            bwd,
            bwd_input_ms=None if split is None else bwd * split,
            allreduce_ms=allreduce,
            optimizer_ms=draw(TIMES),
            allreduce_buckets=buckets,
        )

    return Costs(
        tuple(stage() for _ in range(stages)),
        tuple(flows(b, b + 1) for b in range(stages - 1)),
        tuple(flows(b + 1, b) for b in range(stages - 1)),
    )


@settings(max_examples=400, deadline=None)
@given(
    p=st.integers(1, 4), m=st.integers(1, 9), name=st.sampled_from(["gpipe", "1f1b", "kfkb", "zb-h1", "early"]), data=st.data()
)
def test_the_resource_floor_is_never_above_a_simulated_iteration(p: int, m: int, name: str, data: st.DataObject) -> None:
    """Transfers queueing on shared resources (both event loops), every schedule the floor covers (an explicit order:
    1F1B with DAPPLE's early backward): resource_floor, and the larger of it and chain_floor, less FLOOR_MARGIN, is
    at most the simulated iteration (the simulator is the reference)."""
    if name == "early":
        schedule = one_f_one_b(p, m, extra_warmup=True)
    else:
        schedule = make_schedule(name, p, m, k=min(2, m) if name == "kfkb" else 1)
    split = name == "zb-h1"
    costs = data.draw(shared_costs(p))
    time = simulate(schedule, costs, record=False).iteration_time
    assert resource_floor(costs, m, split) * FLOOR_MARGIN <= time
    assert max(resource_floor(costs, m, split), chain_floor(costs, m, split)) * FLOOR_MARGIN <= time


@pytest.mark.parametrize("m", [2, 5, 12])
def test_the_resource_floor_is_exact_where_one_link_carries_everything(m: int) -> None:
    """Stage 0 of F = 0.5, B = 0.25, stage 1 of no compute, and a single resource both directions use, 2 ms each way:
    GPipe sends the m activations back to back from stage 0's first forward on, then the m gradients, and stage 0's
    last backward follows the last: 0.5 + 4m + 0.25, what the floor counts (chain_floor counts each way once)."""
    link = "pair:x"
    costs = Costs(
        (StageCost(0.5, 0.25), StageCost(0.0, 0.0)),
        ((Flow((link,), (0, 1), 0.0, 2.0),),),
        ((Flow((link,), (1, 0), 0.0, 2.0),),),
    )
    schedule = make_schedule("gpipe", 2, m)
    assert simulate(schedule, costs).iteration_time == pytest.approx(0.5 + 4 * m + 0.25, rel=1e-12)
    assert resource_floor(costs, m, split=False) == pytest.approx(0.5 + 4 * m + 0.25, rel=1e-12)
    assert chain_floor(costs, m, split=False) < 0.5 + 4 * m + 0.25


class Unscreened(Evaluator):
    """An evaluator that screens nothing: every floor is 0, so every plan a search reaches is simulated."""

    def floor(self, plan: Plan) -> float:
        return 0.0


@st.composite
def node_instances(draw: st.DrawFn) -> PlanRequest:
    """A small random model on 2 nodes of 2 devices whose NICs the replicas of a plan share (nic_bytes_per_s)."""
    layers = draw(st.integers(3, 6))
    times = st.floats(0.1, 3.0)
    profile = ModelProfile(
        "r",
        1,
        tuple(
            LayerProfile(f"l{i}", draw(times), draw(times), draw(st.sampled_from([1e6, 2e7, 8e7])), 1e6, 1e6)
            for i in range(layers)
        ),
    )
    devices = tuple(Device(i, "gpu", 80 * GIB, node=i // 2) for i in range(4))
    rate = st.sampled_from([2e9, 25e9, 100e9])
    bandwidth = tuple(tuple(0.0 if a == b else (draw(rate) if a // 2 == b // 2 else 3e9) for b in range(4)) for a in range(4))
    latency = tuple(tuple(0.0 if a == b else 1e-3 for b in range(4)) for a in range(4))
    cluster = Cluster("nodes", devices, bandwidth, latency, nic_bytes_per_s=draw(st.sampled_from([1e9, 4e9])))
    return PlanRequest(profile, cluster, draw(st.sampled_from([8, 16, 64])))


@settings(max_examples=40, deadline=None)
@given(node_instances(), st.data())
def test_screening_never_changes_what_the_local_searches_and_the_ranking_choose(
    request: PlanRequest, data: st.DataObject
) -> None:
    """Random plans on shared NICs: improve_placement and refine_boundaries end at the same plan, and ranked returns
    the same plans in the same order, with the floors (chain and resource) as with none (every move simulated)."""
    layers = request.profile.num_layers
    plans = []
    for _ in range(data.draw(st.integers(2, 6))):
        rp = data.draw(st.sampled_from([1, 2]))
        p = data.draw(st.integers(1, min(layers, 4 // rp)))
        cuts = sorted(data.draw(st.lists(st.integers(0, layers - 2), min_size=p - 1, max_size=p - 1, unique=True)))
        bounds = [-1, *cuts, layers - 1]
        order = data.draw(st.permutations(range(4)))
        stages = tuple(Stage(bounds[i] + 1, bounds[i + 1], tuple(order[i * rp : (i + 1) * rp])) for i in range(p))
        b = data.draw(st.sampled_from([1, 2]))
        m = request.global_batch // (rp * b)
        schedule = data.draw(st.sampled_from(["gpipe", "1f1b", "kfkb", "zb-h1"]))
        plans.append(Plan(stages, rp, m, b, schedule, k=min(2, m) if schedule == "kfkb" else 1))
    screened, unscreened = Search(request), Search(request)
    unscreened.evaluator = Unscreened(request)
    assert screened.ranked(plans, len(plans)) == unscreened.ranked(plans, len(plans))
    for plan in plans:
        for search in (screened, unscreened):
            search.twins = twin_classes(request.cluster)
        moved = improve_placement(plan, screened.evaluator, 60, screened.twins)
        assert moved == improve_placement(plan, unscreened.evaluator, 60, unscreened.twins)
        assert refine_boundaries(moved, screened.evaluator, 60) == refine_boundaries(moved, unscreened.evaluator, 60)
