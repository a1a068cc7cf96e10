"""Tests of the baseline planners: balanced, DAPPLE's plans (its pieces: test_dapple_ranking; PipeDream: test_pipedream)."""

from __future__ import annotations

import pytest

from pipeplan.core.errors import PlanError
from pipeplan.planner.baselines.balanced import plan_balanced
from pipeplan.planner.baselines.dapple.baseline import plan_dapple
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


def test_dapple_plan_fits_and_is_deterministic() -> None:
    """DAPPLE on two DGX-1 over 25 Gb/s: a plan that fits, the same twice, with a 1F1B-family order."""
    request = PlanRequest(load_profile("dapple/bert-24"), load_cluster("v100-8x2-25g"), 128)
    first, second = plan_dapple(request), plan_dapple(request)
    assert first.plan == second.plan
    assert first.plan.schedule in ("1f1b", "list") and first.plan.global_batch == 128
    check_fits(first.plan, request.model)


def test_dapple_keeps_plain_1f1b_when_asked_for_it() -> None:
    """bert-24 on two DGX-1 over 25 Gb/s: DAPPLE's own pick is its early backward with extra warm-up (a list order,
    transfers between machines are comparable to compute); asked for 1f1b it returns the plain 1F1B order instead."""
    profile, cluster = load_profile("dapple/bert-24"), load_cluster("v100-8x2-25g")
    auto = plan_dapple(PlanRequest(profile, cluster, 128))
    plain = plan_dapple(PlanRequest(profile, cluster, 128, schedule="1f1b"))
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
