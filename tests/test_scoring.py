"""Tests of planner.search.scoring's Evaluator: exact times for short runs, extrapolation for long ones, memory margins."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from models import linear_model
from pipeplan.core.dag import reorder
from pipeplan.core.errors import ScheduleError
from pipeplan.core.hardware.cluster import Cluster, Device
from pipeplan.core.plan import Plan, Stage
from pipeplan.core.profile import LayerProfile, ModelProfile
from pipeplan.planner.request import PlanRequest
from pipeplan.planner.search.scoring import RANK_MICROBATCHES, Evaluator, SharedMemos
from pipeplan.schedules.plan_schedule import plan_schedule
from pipeplan.sim import simulate
from pipeplan.sim.cost.memory import rank_memory
from pipeplan.sim.plan_sim import simulate_plan

GIB = 2**30


def setup(devices: int, layers: int) -> tuple[ModelProfile, Cluster]:
    """Uniform layers (1 ms F, 2 ms B per sample, 1 MB cut, 1 MB params) on `devices` equal devices at 100 GB/s."""
    profile = ModelProfile("u", 1, tuple(LayerProfile(f"l{i}", 1.0, 2.0, 1e6, 1e6, 1e6) for i in range(layers)))
    devs = tuple(Device(i, "gpu", 80 * GIB) for i in range(devices))
    bandwidth = tuple(tuple(0.0 if a == b else 100e9 for b in range(devices)) for a in range(devices))
    latency = tuple(tuple(0.0 for _ in range(devices)) for _ in range(devices))
    return profile, Cluster("flat", devs, bandwidth, latency)


def straight(p: int, m: int, schedule: str = "1f1b", chunks: int = 1) -> Plan:
    """p ranks of one layer each (p * chunks stages for interleaved), chunk c on device c mod p, batch 1 per microbatch."""
    stages = tuple(Stage(c, c, (c % p,)) for c in range(p * chunks))
    return Plan(stages, 1, m, 1, schedule, chunks=chunks)


def test_short_runs_are_simulated_exactly() -> None:
    """m <= RANK_MICROBATCHES: the score is the full simulation's iteration time."""
    profile, cluster = setup(4, 4)
    evaluator = Evaluator(PlanRequest(profile, cluster, 16))
    plan = straight(4, 16)
    exact = simulate_plan(plan, linear_model(profile, cluster), record=False).iteration_time
    assert evaluator.score(plan).time_ms == pytest.approx(exact)
    assert evaluator.score(plan).fits


def test_long_1f1b_runs_extrapolate_to_the_closed_form() -> None:
    """Uniform 1F1B is linear in m, (m + p - 1)(F + B) plus transfers: the extrapolation from 48 and 24 is exact."""
    profile, cluster = setup(4, 4)
    m = 4 * RANK_MICROBATCHES
    evaluator = Evaluator(PlanRequest(profile, cluster, m))
    plan = straight(4, m)
    exact = simulate_plan(plan, linear_model(profile, cluster), record=False).iteration_time
    assert evaluator.score(plan).time_ms == pytest.approx(exact, rel=1e-9)
    assert evaluator.exact(plan, record=False).iteration_time == pytest.approx(exact)


@pytest.mark.slow
@pytest.mark.parametrize("p", [25, 32, 48, 64])
def test_interleaved_with_more_ranks_than_half_the_ranking_count_extrapolates(p: int) -> None:
    """Interleaved plans step m by p; with p > RANK_MICROBATCHES / 2 both short runs used to be the same m.

    Regression: dapple/gnmt-16 on h100-8x4 raised ZeroDivisionError. The estimate must be finite and, for uniform
    stages, equal the full simulation (the steady state is linear in m).
    """
    profile, cluster = setup(p, 2 * p)
    m = 4 * p
    evaluator = Evaluator(PlanRequest(profile, cluster, m))
    plan = straight(p, m, "interleaved-1f1b", chunks=2)
    exact = simulate_plan(plan, linear_model(profile, cluster), record=False).iteration_time
    assert evaluator.score(plan).time_ms == pytest.approx(exact, rel=1e-6)


def test_a_plan_over_memory_does_not_fit_and_names_its_rank() -> None:
    """Devices of 1 MiB cannot hold a stage's weights: the score is infinite with a positive excess on rank 0."""
    profile, cluster = setup(2, 2)
    small = dataclasses.replace(cluster, devices=tuple(dataclasses.replace(d, memory_bytes=2**20) for d in cluster.devices))
    score = Evaluator(PlanRequest(profile, small, 4)).score(straight(2, 4))
    assert not score.fits
    assert score.time_ms == float("inf")
    assert score.excess_bytes > 0 and score.excess_rank == 0


@given(st.integers(1, 6), st.integers(1, 40), st.integers(1, 5), st.sampled_from(["gpipe", "1f1b", "kfkb", "zb-h1"]))
@settings(max_examples=120, deadline=None)
def test_rank_memory_closed_forms_equal_the_generated_orders(p: int, m: int, k: int, schedule: str) -> None:
    """GPipe, 1F1B and kFkB peaks from their closed forms (and zb-h1 from its short order) equal sim.memory.rank_memory
    on the full generated schedule, for stages of different sizes."""
    layers = [LayerProfile(f"l{i}", 1.0, 2.0, 1e6 * (i + 1), 1e6 * (2 + i % 3), 1e6 * (1 + i)) for i in range(p)]
    profile = ModelProfile("v", 1, tuple(layers))
    _, cluster = setup(p, p)
    evaluator = Evaluator(PlanRequest(profile, cluster, m))
    plan = Plan(tuple(Stage(i, i, (i,)) for i in range(p)), 1, m, 1, schedule, k=min(k, m) if schedule == "kfkb" else 1)
    full = rank_memory(plan, evaluator.costs(plan), plan_schedule(plan))
    assert evaluator.rank_memory(plan) == pytest.approx(full, rel=1e-12)


@pytest.mark.parametrize("k", [RANK_MICROBATCHES // 2 + 1, RANK_MICROBATCHES, RANK_MICROBATCHES + 5])
def test_a_kfkb_group_above_a_short_run_is_refused_before_any_simulation(k: int) -> None:
    """m > RANK_MICROBATCHES ranks from runs at m1 = 48 and m2 = 24; kfkb with k > m2 cannot run at m2 (its schedule is
    refused, plan_schedule), so the plan is INVALID, as before, and neither run is simulated (the m1 run was)."""
    profile, cluster = setup(4, 4)
    m = 4 * RANK_MICROBATCHES
    evaluator = Evaluator(PlanRequest(profile, cluster, m))
    plan = dataclasses.replace(straight(4, m), schedule="kfkb", k=k)
    with pytest.raises(ScheduleError):
        plan_schedule(dataclasses.replace(plan, microbatches=RANK_MICROBATCHES // 2))
    assert not evaluator.score(plan).fits and evaluator.score(plan).time_ms == float("inf")
    assert evaluator.simulations == 0
    fitting = dataclasses.replace(plan, k=RANK_MICROBATCHES // 2)  # k = m2 runs (as gpipe at m2): two runs
    assert evaluator.score(fitting).fits and evaluator.simulations == 2


def test_placements_that_rename_devices_share_one_simulation_and_keep_their_times() -> None:
    """Every order of 4 devices for a 4-stage plan (1f1b, and zb-h1, whose memory is read off its order): on a
    cluster of two speeds of links, each score and each rank's bytes equal a direct simulation and rank_memory of
    that plan's own costs; on a flat cluster every order is the same run, simulated once per schedule."""
    profile, flat = setup(4, 4)
    fast, slow = 100e9, 10e9
    mixed_bw = tuple(tuple(0.0 if a == b else (fast if (a + b) % 3 else slow) for b in range(4)) for a in range(4))
    mixed = dataclasses.replace(flat, bandwidth_bytes_per_s=mixed_bw)
    for cluster, runs in ((mixed, None), (flat, 2)):
        evaluator = Evaluator(PlanRequest(profile, cluster, 8))
        times = set()
        for order, schedule in itertools.product(itertools.permutations(range(4)), ("1f1b", "zb-h1")):
            plan = Plan(tuple(Stage(i, i, (d,)) for i, d in enumerate(order)), 1, 8, 1, schedule)
            costs = evaluator.costs(plan)
            direct = simulate(plan_schedule(plan), costs, record=False).iteration_time
            assert evaluator.score(plan).time_ms == direct
            assert evaluator.rank_memory(plan) == rank_memory(plan, costs, plan_schedule(plan))
            times.add(direct)
        if runs is not None:
            assert evaluator.simulations == runs
        else:
            assert len(times) > 2  # the orders differ, so the test compares more than one run per schedule


def test_an_evaluator_sharing_another_orders_memos_scores_as_a_fresh_one() -> None:
    """A DAG profile's search over another layer order shares the default search's model-free memos (transfers,
    schedules, memory, simulated times): every score on the reordered profile equals that of an evaluator of its
    own (and a direct simulation of the plan's own costs), with fewer simulations; its costs stay its model's."""
    spec = [("in", 1.0, 1e6, ()), ("x", 0.5, 4e6, (0,)), ("y1", 3.0, 2e6, (0,)), ("y2", 3.0, 2e6, (2,)), ("z", 0.5, 1e6, (1, 3))]
    layers = tuple(LayerProfile(name, ms, 2 * ms, act, 1e6) for name, ms, act, _ in spec)
    profile = ModelProfile("branchy", 8, layers, layer_inputs=tuple(inputs for *_, inputs in spec))
    _, cluster = setup(4, 1)
    default = Evaluator(PlanRequest(profile, cluster, 8))
    reordered = PlanRequest(reorder(profile, (0, 2, 1, 3, 4)), cluster, 8)
    shared, own = Evaluator(reordered), Evaluator(reordered)
    memos = SharedMemos()
    memos.join(default)
    memos.join(shared)
    plans = [
        Plan((Stage(0, cut - 1, first), Stage(cut, 4, second)), 1, m, 2, schedule, k=2 if schedule == "kfkb" else 1)
        for cut, m, schedule in itertools.product(range(1, 5), (2, 4, 64), ("1f1b", "gpipe", "kfkb"))
        for first, second in (((0,), (1,)), ((2,), (3,)), ((1, 3), (0, 2)))
    ]
    for plan in plans:  # the default order's search runs first and fills the memos
        default.score(plan)
    for plan in plans:
        score, costs = shared.score(plan), own.costs(plan)
        assert shared.costs(plan) == costs and score == own.score(plan)
        if score.fits and plan.microbatches <= RANK_MICROBATCHES:
            assert score.time_ms == simulate(plan_schedule(plan), costs, record=False).iteration_time
    assert any(shared.costs(plan) != default.costs(plan) for plan in plans)  # the orders price some plans apart
    assert 0 < shared.simulations < own.simulations
    with pytest.raises(ValueError, match="different clusters"):
        Evaluator(PlanRequest(profile, setup(2, 1)[1], 8)).share_memos(default)
