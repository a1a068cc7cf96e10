"""Tests of exact's parts: stage sums equal sim's, the suffix table and the ring bound below every simulated plan."""

from __future__ import annotations

import dataclasses
import itertools
import random

import numpy as np
import pytest

from pipeplan.core.plan import Plan, Stage
from pipeplan.planner.bound.best_rings import Rings
from pipeplan.planner.bound.placed_bounds import Placed
from pipeplan.planner.bound.shape_bounds import ShapeBounds
from pipeplan.planner.bound.suffix_table import SuffixBound
from pipeplan.planner.exact import SCHEDULES
from pipeplan.planner.exact.planner import device_orders
from pipeplan.planner.exact.stages import StageCosts, clone
from pipeplan.planner.request import PlanRequest
from pipeplan.presets.resolve import load_cluster, load_profile
from pipeplan.sim.cost.link_model import ring_allreduce_ms
from pipeplan.sim.plan_sim import simulate_plan
from planner_instances import random_cluster, random_profile


@pytest.mark.parametrize("scaling", ["auto", "floor", "linear"])
def test_stage_sums_equal_layer_costs_to_the_last_bit(scaling: str) -> None:
    """StageCosts.work gives exactly LayerCosts.stage on 300 random stages of gnmt (several batch sizes measured)."""
    request = PlanRequest(load_profile("pipedream/gnmt"), load_cluster("v100-8x1"), 256, batch_scaling=scaling)
    costs, rng = StageCosts(request), random.Random(3)
    layers = request.profile.num_layers
    for _ in range(300):
        first = rng.randrange(layers)
        last = rng.randrange(first, layers)
        size = rng.choice([1, 4, 16, 64, 256])
        r = rng.choice([x for x in (1, 2, 4) if size % x == 0])
        speed = rng.choice([1.0, 0.7])
        assert costs.work(first, last, size, r, speed) == request.model.layers.stage(range(first, last + 1), size, r, speed)


def test_suffix_table_never_exceeds_a_simulated_plan() -> None:
    """On 120 random plans of random instances, rest[n][0] of the plan's shape is <= its simulated time."""
    rng = random.Random(11)
    for trial in range(120):
        layers, devices = rng.randint(2, 7), rng.randint(2, 5)
        request = PlanRequest(random_profile(trial, layers), random_cluster(trial, devices), 16)
        bounds = ShapeBounds(request)
        rp = rng.choice([r for r in (1, 2) if r <= devices])
        m = rng.choice([1, 2, 4, 8])
        size = 16 // rp // m
        count = rng.randint(1, min(layers, devices // rp))
        cuts = [0, *sorted(rng.sample(range(1, layers), count - 1)), layers]
        free = list(range(devices))
        rng.shuffle(free)
        stages = tuple(Stage(cuts[s], cuts[s + 1] - 1, tuple(free.pop() for _ in range(rp))) for s in range(count))
        plan = Plan(stages, rp, m, size, rng.choice(["1f1b", "gpipe", "zb-h1"]))
        simulated = simulate_plan(plan, request.model, record=False).iteration_time
        table = SuffixBound(bounds, Rings(bounds), rp, m, size, SCHEDULES)
        assert table.rest[table.n][0] <= simulated * (1 + 1e-9)


def test_rings_bound_every_ring_of_the_nvlink_mesh() -> None:
    """On v100-8x1 (uneven NVLink mesh), the ring bound is <= sim's all-reduce on 300 random rings of 2-8 devices,
    and equal on a best one (its 50 GB/s 8-cycle)."""
    request = PlanRequest(load_profile("pipedream/alexnet"), load_cluster("v100-8x1"), 256)
    rings, rng = Rings(ShapeBounds(request)), random.Random(5)
    nbytes = np.array([4e8])
    for _ in range(300):
        devices = tuple(rng.sample(range(8), rng.randint(2, 8)))
        bound = float(rings.allreduce_ms(nbytes, len(devices))[0])
        assert bound <= ring_allreduce_ms(request.cluster, devices, 4e8) * (1 + 1e-12)
    best = ring_allreduce_ms(request.cluster, (0, 3, 2, 1, 5, 6, 7, 4), 4e8)
    assert float(rings.allreduce_ms(nbytes, 8)[0]) == pytest.approx(best, rel=1e-12)


def test_device_orders_count_orders_up_to_twins() -> None:
    """4 twins: one order; 2 + 2 twins: 6; 8 distinct devices: 8!; the count stops once past its limit."""
    assert device_orders((0, 0, 0, 0), 10) == 1
    assert device_orders((0, 0, 2, 2), 10) == 6
    assert device_orders(tuple(range(8)), 10**6) == 40320
    assert 10 < device_orders(tuple(range(8)), 10) < 40320


def test_cached_ring_all_reduce_equals_the_simulators_to_the_last_bit() -> None:
    """StageCosts.allreduce equals link_model.ring_allreduce_ms on every ring of 1-4 devices of a random cluster."""
    request = PlanRequest(random_profile(3, 4), random_cluster(3, 5), 8)
    costs = StageCosts(request)
    for length in range(1, 5):
        for ring in itertools.permutations(range(5), length):
            for nbytes in (0.0, 1234.5, 3.3e8):
                assert costs.allreduce(ring, nbytes) == ring_allreduce_ms(request.cluster, ring, nbytes)


@pytest.mark.parametrize("counts", [True, False])
def test_suffix_table_bounds_every_later_part_of_a_simulated_plan(counts: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """On 300 random plans (stages of 1-2 replicas, 1-2 pipelines, every schedule), for every stage j: the end of
    the forward before it plus the table's bound for layers first_j.. in exactly p - j stages on the devices the
    earlier stages leave (and for any count, and the stage_row of stage j itself) is <= the simulated time; with
    the table's stage counts and without (STAGE_COUNTS 0: one grid for any count)."""
    from pipeplan.planner.bound import suffix_table as suffix
    from test_exact_fill import simulated_plan

    if not counts:
        monkeypatch.setattr(suffix, "STAGE_COUNTS", 0)
    rng = random.Random(31)
    checked = 0
    for trial in range(300):
        request, placed, rp, m, size, _, _, simulated = simulated_plan(rng, trial)
        bounds = ShapeBounds(request)
        table = SuffixBound(bounds, Rings(bounds), rp, m, size, SCHEDULES)
        assert bool(table.counts) == counts
        p, used = len(placed), 0
        for j, st in enumerate(placed):
            start = placed[j - 1].arrive + placed[j - 1].fwd if j else 0.0
            n = (request.cluster.num_devices - used) // rp
            width = len(st.devices) // rp
            assert start + table.stages_rest(p - j, n)[st.first] <= simulated * (1 + 1e-9)
            assert start + table.rest[n][st.first] <= simulated * (1 + 1e-9)
            assert start + table.stage_row(st.first, n, width)[st.last] <= simulated * (1 + 1e-9)
            used += len(st.devices)
            checked += 1
    assert checked > 300


def test_a_stage_anywhere_costs_no_more_than_on_any_devices() -> None:
    """StageCosts.anywhere (exact's device-free stage) is below the placed stage on every device tuple of the free
    devices, field by field (compute, all-reduce, transfers, arrival, chains; memory at least), after a placed
    stage and after another device-free one, on 40 random instances with uneven links and speeds."""
    rng = random.Random(17)
    fields = ("fwd", "bwd", "inp", "wgt", "allreduce", "fwd_in", "bwd_out", "arrive", "chain", "chain_split")
    for trial in range(40):
        layers, devices = rng.randint(3, 7), rng.randint(3, 6)
        request = PlanRequest(random_profile(trial, layers), random_cluster(trial, devices), 16)
        costs, bounds = StageCosts(request), ShapeBounds(request)
        size = rng.choice([2, 4, 8])
        first_devices = (rng.randrange(devices),)
        head = costs.place(0, 0, first_devices, 1, size, None)
        free = tuple(d for d in range(devices) if d not in first_devices)
        rings = Rings(bounds, free)
        last = rng.randrange(1, layers)
        for r in (1, 2):
            bound = costs.anywhere(1, last, free, r, 1, size, head, rings)
            free_bound = costs.anywhere(1, last, free, r, 1, size, costs.anywhere(0, 0, free, 1, 1, size, None, rings), rings)
            for group in itertools.permutations(free, r):
                placed = costs.place(1, last, group, 1, size, head)
                for name in fields:
                    assert getattr(bound, name) <= getattr(placed, name) * (1 + 1e-12), (trial, name)
                assert bound.memory >= placed.memory and bound.static == placed.static and bound.act == placed.act
                assert free_bound.fwd_in == free_bound.bwd_out == 0.0


def test_a_cloned_stage_equals_its_original_field_by_field() -> None:
    """stages.clone copies every field (a field added to Placed and not to clone would fail here) into a new object."""
    request = PlanRequest(load_profile("pipedream/gnmt"), load_cluster("v100-8x1"), 256)
    costs = StageCosts(request)
    first = costs.place(0, 3, (0,), 1, 32, None)
    second = costs.place(4, 9, (1, 2), 1, 32, first)
    for stage in (first, second):
        copied = clone(stage)
        assert copied is not stage
        assert all(getattr(copied, f.name) == getattr(stage, f.name) for f in dataclasses.fields(Placed))
    assert second.fwd_in > 0 and second.chain > 0  # the fields clone must not drop to their defaults
