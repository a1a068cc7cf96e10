"""Tests of the baseline planners: balanced, DAPPLE's latency model and placement (PipeDream: test_pipedream)."""

from __future__ import annotations

import numpy as np
import pytest

from pipeplan.core.errors import PlanError
from pipeplan.planner.baselines.balanced import plan_balanced
from pipeplan.planner.baselines.dapple import plan_dapple
from pipeplan.planner.baselines.dapple_model import (
    APPEND_FIRST,
    FRESH_FIRST,
    SCATTER_FIRST,
    allocate,
    allocate_replicas,
    dapple_allreduce_ms,
    pivot_latency,
    pivot_stage,
)
from pipeplan.planner.baselines.layer_groups import merge_layers
from pipeplan.planner.request import PlanRequest
from pipeplan.presets.resolve import load_cluster, load_profile
from pipeplan.sim.cost.memory import check_fits


def test_balanced_planner_uses_devices_in_order_with_enough_microbatches() -> None:
    """bert-48 on 8 V100s: 8 stages on devices 0..7, 1F1B, m >= 4p, and the plan fits."""
    request = PlanRequest(load_profile("dapple/bert-48"), load_cluster("v100-8x1"), 256)
    result = plan_balanced(request)
    plan = result.plan
    assert [s.devices for s in plan.stages] == [(i,) for i in range(8)]
    assert plan.schedule == "1f1b" and plan.microbatches >= 32 and plan.global_batch == 256
    check_fits(plan, request.model)


def test_baselines_refuse_other_schedules() -> None:
    """A baseline asked for gpipe says it runs 1f1b only."""
    request = PlanRequest(load_profile("dapple/bert-48"), load_cluster("v100-8x1"), 64, schedule="gpipe")
    with pytest.raises(PlanError, match="runs 1f1b only"):
        plan_balanced(request)


def test_pivot_latency_uniform_is_the_1f1b_closed_form() -> None:
    """Equal stages without all-reduce: L = (M + S - 1)(F + B), pivot the last stage."""
    latency, pivot = pivot_latency([1.0] * 3, [2.0] * 3, [0.0] * 3, 4)
    assert pivot == 2
    assert latency == pytest.approx((4 + 3 - 1) * 3.0)


def test_pivot_latency_hand_case_with_slow_middle_stage() -> None:
    """F=[1,3,1], B=[2,6,2], M=4: the middle stage is the pivot, L = 4 + 3*9 + 8; a last-stage all-reduce of 20 ends it."""
    assert pivot_stage([1.0, 3.0, 1.0], [2.0, 6.0, 2.0], 4) == 1
    latency, _ = pivot_latency([1.0, 3.0, 1.0], [2.0, 6.0, 2.0], [0.0, 0.0, 0.0], 4)
    assert latency == pytest.approx(4 + 27 + 8)
    latency, _ = pivot_latency([1.0, 3.0, 1.0], [2.0, 6.0, 2.0], [0.0, 0.0, 20.0], 4)
    assert latency == pytest.approx(4 + 27 + 20)


def test_dapple_allreduce_formula() -> None:
    """2 W (r-1) / (r B): 1 GB over 4 replicas at 1e6 bytes/ms takes 1500 ms; one replica needs none."""
    assert dapple_allreduce_ms(1e9, 4, 1e6) == pytest.approx(1500.0)
    assert dapple_allreduce_ms(1e9, 1, 1e6) == 0.0


def test_placement_policies_on_two_machines() -> None:
    """Machine 0 half used: Fresh First opens machine 1, Append First fills machine 0, Scatter First alternates."""
    nodes = [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert allocate(nodes, (2, 0), 2, FRESH_FIRST) == ((4, 5), (2, 2))
    assert allocate(nodes, (2, 0), 2, APPEND_FIRST) == ((2, 3), (4, 0))
    assert allocate(nodes, (0, 0), 3, SCATTER_FIRST) == ((0, 1, 4), (2, 1))
    assert allocate(nodes, (4, 3), 2, FRESH_FIRST) is None
    assert allocate_replicas(nodes, (0, 0), 2, 2, FRESH_FIRST) == ((0, 1, 4, 5), (2, 2))


def test_dapple_plan_fits_and_is_deterministic() -> None:
    """DAPPLE on two DGX-1 over 25 Gb/s: a plan that fits, the same twice, with a 1F1B-family order."""
    request = PlanRequest(load_profile("dapple/bert-24"), load_cluster("v100-8x2-25g"), 128)
    first, second = plan_dapple(request), plan_dapple(request)
    assert first.plan == second.plan
    assert first.plan.schedule in ("1f1b", "list") and first.plan.global_batch == 128
    check_fits(first.plan, request.model)


def test_dapple_keeps_plain_1f1b_when_asked_for_it() -> None:
    """alexnet on a DGX-1: DAPPLE's own pick is its early backward with extra warm-up (a list order, transfers are
    comparable to compute); asked for 1f1b it returns the plain 1F1B order instead."""
    profile, cluster = load_profile("pipedream/alexnet"), load_cluster("v100-8x1")
    auto = plan_dapple(PlanRequest(profile, cluster, 256))
    plain = plan_dapple(PlanRequest(profile, cluster, 256, schedule="1f1b"))
    assert auto.plan.schedule == "list" and auto.plan.order is not None
    assert plain.plan.schedule == "1f1b" and plain.plan.order is None


def test_merge_layers_keeps_totals_and_cuts() -> None:
    """Merging nasnet into 48 blocks keeps the compute and weight totals; block cuts are the layers' cuts."""
    profile = load_profile("pipedream/nasnetalarge")
    blocks = merge_layers(profile, 48)
    assert blocks.profile.num_layers == 48
    assert blocks.profile.total_fwd_ms == pytest.approx(profile.total_fwd_ms)
    assert blocks.profile.total_param_bytes == pytest.approx(profile.total_param_bytes)
    assert blocks.profile.cut_bytes[0] == profile.cut_bytes[blocks.starts[1] - 1]  # type: ignore[index]
    assert blocks.layer_range(0, 47) == (0, profile.num_layers - 1)


def _reference_allocation(nodes: list[list[int]], used: tuple[int, ...], need: int, replicas: int, policy: str):  # type: ignore[no-untyped-def]
    """The policies read literally: every step scans the machines again."""
    count = list(used)
    if sum(len(n) - c for n, c in zip(nodes, count, strict=True)) < need * replicas:
        return None
    devices: list[int] = []
    for _ in range(replicas):
        taken: list[int] = []
        while len(taken) < need:
            free = [i for i, n in enumerate(nodes) if count[i] < len(n)]
            fresh = [i for i in free if count[i] == 0]
            partly = [i for i in free if count[i] > 0]
            if policy == SCATTER_FIRST:
                picks = [(i, 1) for i in free[: need - len(taken)]]
            elif policy == FRESH_FIRST and fresh:
                picks = [(fresh[0], need - len(taken))]
            elif policy == APPEND_FIRST and partly:
                picks = [(partly[0], need - len(taken))]
            else:
                picks = [(free[0], need - len(taken))]
            for i, want in picks:
                k = min(len(nodes[i]) - count[i], want)
                taken += nodes[i][count[i] : count[i] + k]
                count[i] += k
        devices += sorted(taken)
    return tuple(devices), tuple(count)


def test_replica_allocation_equals_the_policies_read_literally() -> None:
    """The pointer-and-heap allocation, and the numpy one on machines of one size, give what rescanning the machines
    at every step gives (random clusters)."""
    rng = np.random.default_rng(11)
    for trial in range(6000):
        even = trial % 2 == 1  # machines of one size: the numpy paths
        count = int(rng.integers(1, 9))
        one_size = [int(rng.choice([1, 2, 4, 8]))] * count
        sizes = one_size if even else [int(rng.choice([0, 1, 2, 3, 4, 8])) for _ in range(count)]
        starts = np.cumsum([0, *sizes])
        nodes = [list(range(int(a), int(a) + s)) for a, s in zip(starts, sizes, strict=False)]
        used = tuple(int(rng.integers(0, s + 1)) for s in sizes)
        if even and trial % 4 == 1:  # a few machines in use, the rest equally so (as a pipeline fills them)
            cut, level = int(rng.integers(0, count + 1)), int(rng.integers(0, sizes[0] + 1))
            used = used[:cut] + (level,) * (count - cut)
        need, replicas = int(rng.integers(1, 7)), int(rng.integers(1, 12))
        policy = str(rng.choice([FRESH_FIRST, APPEND_FIRST, SCATTER_FIRST]))
        grid = np.asarray(nodes) if even else None
        ints = list(range(int(starts[-1]))) if even else None
        got = allocate_replicas(nodes, used, need, replicas, policy, grid=grid, ints=ints)
        assert got == _reference_allocation(nodes, used, need, replicas, policy), (sizes, used, need, replicas, policy)
