"""Tests of the exact planner: equal to brute force, never beaten by another planner, sound bounds, refusals."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from pipeplan.core.errors import PipeplanError, PlanError
from pipeplan.core.plan import Plan, Stage
from pipeplan.planner.bound.placed_bounds import placed_bound, schedule_bound
from pipeplan.planner.exact import SCHEDULES, canonical_tuples, ordered_groups, plan_exact, search_space
from pipeplan.planner.exact.stages import StageCosts
from pipeplan.planner.planners import PLANNERS
from pipeplan.planner.request import PlanRequest
from pipeplan.presets.resolve import load_cluster, load_profile
from pipeplan.sim.cost.memory import check_fits
from pipeplan.sim.plan_sim import simulate_plan
from planner_instances import random_cluster, random_profile


def brute_force(request: PlanRequest) -> float:
    """Simulate every plan of the exact planner's space with no pruning; return the best time."""
    layers, devices, batch = request.profile.num_layers, request.cluster.num_devices, request.global_batch
    best = math.inf
    for stages in range(1, min(layers, devices) + 1):
        for cuts in itertools.combinations(range(1, layers), stages - 1):
            bounds = [0, *cuts, layers]
            for rp in (r for r in range(1, devices + 1) if batch % r == 0):
                for sizes in itertools.product(range(1, devices // rp + 1), repeat=stages):
                    for order in itertools.permutations(range(devices), sum(sizes) * rp):
                        groups, i = [], 0
                        for size in sizes:
                            groups.append(order[i : i + size * rp])
                            i += size * rp
                        plan_stages = tuple(Stage(bounds[s], bounds[s + 1] - 1, groups[s]) for s in range(stages))
                        for m in (m for m in range(1, batch // rp + 1) if (batch // rp) % m == 0):
                            b = batch // rp // m
                            if any(b % size for size in sizes):
                                continue
                            for name, k in SCHEDULES:
                                if name == "kfkb" and k >= m:
                                    continue
                                plan = Plan(plan_stages, rp, m, b, name, k=k)
                                try:
                                    check_fits(plan, request.model)
                                except PipeplanError:
                                    continue
                                result = simulate_plan(plan, request.model, record=False)
                                best = min(best, result.iteration_time)
    return best


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_exact_equals_brute_force_on_tiny_instances(seed: int) -> None:
    """4 layers on 3 devices, global batch 4: branch and bound finds the brute-force optimum."""
    request = PlanRequest(random_profile(seed, 4), random_cluster(seed, 3), 4)
    assert plan_exact(request).iteration_time == pytest.approx(brute_force(request), rel=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [3, 4])
def test_exact_is_never_beaten_by_another_planner(seed: int) -> None:
    """8 layers on 4 devices: no registered planner finds a faster plan than exact."""
    request = PlanRequest(random_profile(seed, 8), random_cluster(seed, 4), 16)
    best = plan_exact(request)
    check_fits(best.plan, request.model)
    for name, planner in PLANNERS.items():
        if name != "exact":
            assert best.iteration_time <= planner(request).iteration_time * (1 + 1e-9), name


def test_schedule_bound_never_exceeds_the_simulation() -> None:
    """On 150 random plans (any partition, devices, replicas, microbatches, schedule) the bound is <= the simulated time."""
    rng = random.Random(7)
    for trial in range(150):
        layers, devices = rng.randint(2, 6), rng.randint(2, 5)
        request = PlanRequest(random_profile(trial, layers), random_cluster(trial, devices), 16)
        search = StageCosts(request)
        rp = rng.choice([r for r in (1, 2) if r <= devices])
        stages_count = rng.randint(1, min(layers, devices // rp))
        cuts = sorted(rng.sample(range(1, layers), stages_count - 1))
        bounds = [0, *cuts, layers]
        free = list(range(devices))
        rng.shuffle(free)
        m = rng.choice([1, 2, 4, 8])
        size = 16 // rp // m
        placed = []
        for s in range(stages_count):
            group = tuple(free.pop() for _ in range(rp))
            placed.append(search.place(bounds[s], bounds[s + 1] - 1, group, rp, size, placed[-1] if placed else None))
        name, k = rng.choice([sch for sch in SCHEDULES if sch[0] != "kfkb" or sch[1] < m])
        plan = Plan(tuple(Stage(p.first, p.last, p.devices) for p in placed), rp, m, size, name, k=k)
        simulated = simulate_plan(plan, request.model, record=False).iteration_time
        assert schedule_bound(placed, m, name == "zb-h1") <= simulated * (1 + 1e-9)
        for s, stage in enumerate(placed):
            assert placed_bound(stage, placed[s - 1] if s else None, m) <= simulated * (1 + 1e-9)


def test_search_space_counts() -> None:
    """4 devices give 64 single ordered groups; 8 layers on 4 devices give 3,844 (partition, groups) pairs."""
    assert ordered_groups(4, 1) == 4 + 12 + 24 + 24
    assert search_space(8, 4) == 3844
    assert search_space(8, 4) == sum(math.comb(7, s - 1) * ordered_groups(4, s) for s in range(1, 5))
    assert 3844 >= search_space(8, 4, limit=100) > 100  # stops as soon as it passes the limit
    assert search_space(53, 1024, limit=10**6) < 10**12  # 1024 devices: no number with thousands of digits


def test_exact_refuses_large_instances() -> None:
    """bert-48 on 16 GPUs (no twins: 16! device orders) is far beyond the exact search: a PlanError points to pipeplan."""
    request = PlanRequest(load_profile("dapple/bert-48"), load_cluster("v100-8x2-25g"), 64)
    with pytest.raises(
        PlanError,
        match=r"handles at most 10,080 device orders up to twins; 16 devices in 16 twin classes give more; "
        r"use --planner pipeplan",
    ):
        plan_exact(request)


def test_exact_refuses_schedules_it_does_not_cover() -> None:
    """Interleaved schedules are outside the exact search."""
    request = PlanRequest(random_profile(0, 4), random_cluster(0, 2), 4, schedule="interleaved-1f1b")
    with pytest.raises(PlanError, match="covers gpipe, 1f1b, kfkb and zb-h1"):
        plan_exact(request)


def test_exact_honours_a_requested_schedule() -> None:
    """Asked for gpipe, exact returns the best gpipe plan, no faster than the unrestricted optimum."""
    base = PlanRequest(random_profile(5, 5), random_cluster(5, 3), 8)
    free = plan_exact(base)
    gpipe = plan_exact(PlanRequest(base.profile, base.cluster, 8, schedule="gpipe"))
    assert gpipe.plan.schedule == "gpipe"
    assert gpipe.iteration_time >= free.iteration_time * (1 - 1e-12)


def test_exact_equals_brute_force_on_twin_devices() -> None:
    """3 identical devices on equal links (all twins), 4 layers, batch 4: skipping twins keeps the brute-force optimum."""
    from pipeplan.core.hardware.cluster import Cluster, Device

    gib = float(1 << 30)
    devices = tuple(Device(i, "gpu", 16 * gib, 1.0, 0) for i in range(3))
    links = tuple(tuple(0.0 if a == b else 10e9 for b in range(3)) for a in range(3))
    latency = tuple(tuple(0.0 if a == b else 5e-3 for b in range(3)) for a in range(3))
    for seed in (0, 1):
        request = PlanRequest(random_profile(seed, 4), Cluster("twins", devices, links, latency), 4)
        result = plan_exact(request)
        assert result.iteration_time == pytest.approx(brute_force(request), rel=1e-12)


def test_canonical_tuples_cover_every_permutation_once_up_to_twins() -> None:
    """Each ordered tuple of free devices is a twin relabelling of exactly one canonical tuple; no twins: all of them."""
    classes = (0, 0, 2, 2, 2, 5)
    free = (0, 1, 2, 3, 4, 5)
    for length in range(1, 5):
        canonical = list(canonical_tuples(free, length, classes))
        shapes = [tuple(classes[d] for d in t) for t in itertools.permutations(free, length)]
        assert sorted(tuple(classes[d] for d in t) for t in canonical) == sorted(set(shapes))
        assert list(canonical_tuples(free, length, tuple(range(6)))) == list(itertools.permutations(free, length))
