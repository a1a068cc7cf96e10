"""Tests of pipeplan's replicated-pipeline seeds (search.replicated.seeds) and their place in the search."""

from __future__ import annotations

from pipeplan.planner.request import PlanRequest
from pipeplan.planner.search.replicated.seeds import SEED_NAME, plan_replicated
from pipeplan.planner.search.selection import plan_pipeplan
from pipeplan.presets.resolve import load_cluster, load_profile
from pipeplan.sim.cost.memory import check_fits


def test_replicated_plan_fits_and_is_deterministic() -> None:
    """The replicated seeds on two DGX-1 over 25 Gb/s: a plan that fits, the same twice, with a 1F1B-family order."""
    request = PlanRequest(load_profile("dapple/bert-24"), load_cluster("v100-8x2-25g"), 128)
    first, second = plan_replicated(request), plan_replicated(request)
    assert first.plan == second.plan
    assert first.plan.schedule in ("1f1b", "list") and first.plan.global_batch == 128
    check_fits(first.plan, request.model)


def test_replicated_keeps_plain_1f1b_when_asked_for_it() -> None:
    """alexnet on a DGX-1: the generator's own pick is the early backward with extra warm-up (a list order, transfers are
    comparable to compute); asked for 1f1b it returns the plain 1F1B order instead."""
    profile, cluster = load_profile("pipedream/alexnet"), load_cluster("v100-8x1")
    auto = plan_replicated(PlanRequest(profile, cluster, 256))
    plain = plan_replicated(PlanRequest(profile, cluster, 256, schedule="1f1b"))
    assert auto.plan.schedule == "list" and auto.plan.order is not None
    assert plain.plan.schedule == "1f1b" and plain.plan.order is None


def test_the_search_seeds_from_the_replicated_pipelines_and_never_loses_to_them() -> None:
    """pipeplan's search records its replicated seed in extra["seeds"] (at that seed's own time) and returns no
    slower a plan."""
    request = PlanRequest(load_profile("pipedream/alexnet"), load_cluster("v100-8x1"), 64)
    result = plan_pipeplan(request)
    seeds = result.extra["seeds"]
    assert SEED_NAME in seeds and seeds[SEED_NAME] == plan_replicated(request).iteration_time
    assert result.iteration_time <= seeds[SEED_NAME] * (1 + 1e-9)
