"""Tests of a plan against its class's proven bound: the class rule, the bound holding, and `plan`/`compare --bound`."""

from __future__ import annotations

import json

import pytest

from cli_runner import run
from pipeplan.core.dag import inputs_of
from pipeplan.core.plan import Plan, Stage
from pipeplan.planner.bound.over_orders import search_orders, stage_bound_over_orders
from pipeplan.planner.bound.plan_bound import EVERY_PLAN, ONE_STAGE, Bounds
from pipeplan.planner.bound.shape_bounds import lower_bound
from pipeplan.planner.planners import PLANNERS
from pipeplan.planner.request import PlanRequest
from pipeplan.presets.resolve import load_cluster, load_profile
from pipeplan.sim.plan_sim import simulate_plan
from planner_instances import random_cluster, random_profile


def test_every_planner_s_plan_is_at_least_its_class_s_bound() -> None:
    """On random instances each planner's plan simulates to at least the bound of its class (gap >= 1)."""
    for seed in range(2):
        request = PlanRequest(random_profile(seed, 8), random_cluster(seed, 4), 16)
        bounds = Bounds(request)
        for name in ("pipeplan", "dapple", "balanced", "exact"):
            result = PLANNERS[name](request)
            measured = bounds.of(result.plan, result.iteration_time)
            assert measured.gap >= 1 - 1e-12, (seed, name, measured)


def test_a_chunked_plan_is_measured_against_the_bound_over_every_plan() -> None:
    """An interleaved plan is outside the one-stage class: its bound is lower_bound's; a 1F1B plan gets the stage bound."""
    request = PlanRequest(load_profile("pipedream/alexnet"), load_cluster("pcie-4x4-10g"), 256)
    stages = (*(Stage(2 * c, 2 * c + 1, (c % 4,)) for c in range(7)), Stage(14, 22, (3,)))
    chunked = Plan(stages, 1, 16, 16, "interleaved-1f1b", chunks=2)
    ms = simulate_plan(chunked, request.model, record=False).iteration_time
    bounds = Bounds(request)
    measured = bounds.of(chunked, ms)
    assert measured.of == EVERY_PLAN and measured.bound == lower_bound(request)
    assert measured.gap >= 1
    straight = Plan((Stage(0, 10, (0,)), Stage(11, 22, (1,))), 1, 16, 16, "1f1b")
    one = bounds.of(straight, simulate_plan(straight, request.model, record=False).iteration_time)
    assert one.of == ONE_STAGE and one.bound == stage_bound_over_orders(request)
    assert one.bound.ms >= measured.bound.ms and one.gap >= 1


def test_a_layer_order_outside_pipeplan_s_orders_falls_back_to_every_plan() -> None:
    """A one-stage plan whose DAG order pipeplan's search does not plan on is not covered by the stage bound."""
    request = PlanRequest(load_profile("pipedream/resnet18"), load_cluster("v100-8x1"), 64)
    bounds = Bounds(request)
    layers = request.profile.num_layers
    chain = Plan((Stage(0, layers // 2, (0,)), Stage(layers // 2 + 1, layers - 1, (1,))), 1, 4, 16, "1f1b")
    assert bounds.one_stage_class(chain)
    inputs, searched = inputs_of(request.profile), search_orders(request)
    order = tuple(range(layers))
    swaps = ((*order[:i], i + 1, i, *order[i + 2 :]) for i in range(layers - 1) if i not in inputs[i + 1])
    swapped = next(o for o in swaps if o not in searched)  # resnet18 branches: some neighbours are independent
    other = Plan(chain.stages, 1, 4, 16, "1f1b", layer_order=swapped)
    assert not bounds.one_stage_class(other)


def test_plan_bound_json_and_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`plan --bound --json` adds lower_bound (ms, the plans it holds for, gap >= 1); the table form prints the line."""
    args = ("plan", "--profile", "dapple/bert-24", "--cluster", "v100-8x1", "--global-batch", "16", "--bound")
    code, out, _ = run(monkeypatch, capsys, *args, "--json")
    assert code == 0
    found = json.loads(out)["lower_bound"]
    assert found["holds_for"] in (EVERY_PLAN, ONE_STAGE) and found["gap"] >= 1
    assert found["ms"] * found["gap"] == pytest.approx(json.loads(out)["iteration_time"])
    code, out, _ = run(monkeypatch, capsys, *args)
    assert code == 0 and f"proven lower bound over {found['holds_for']}" in out and f"{found['gap']:.3f}x" in out


def test_compare_bound_adds_a_column(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`compare --bound`: an 'over bound' column, '-' for a planner without a plan; --json adds lower_bound per plan."""
    args = ("compare", "--profile", "dapple/bert-48", "--cluster", "v100-8x2-25g", "--global-batch", "64",
            "--planners", "balanced,dapple,exact", "--bound")  # fmt: skip
    code, out, _ = run(monkeypatch, capsys, *args)
    assert code == 0 and "over bound" in out and "proven lower bound of its plan's class" in out
    code, out, _ = run(monkeypatch, capsys, *args, "--json")
    results = json.loads(out)["results"]
    assert [("lower_bound" in r) for r in results] == [True, True, False]
    assert all(r["lower_bound"]["gap"] >= 1 for r in results[:2])


def test_a_plan_with_tensor_parallelism_or_sharding_is_measured_against_the_3d_bound() -> None:
    """The every-plan and one-stage bounds price a stage's layers whole on each device: a 3D plan is measured against
    planner.bound.tensor_bound's bound under the EVERY_3D class, and `plan --bound` states it; the same plan at t = 1
    keeps its class."""
    import dataclasses

    from pipeplan.api.planning import plan_request
    from pipeplan.planner.bound.plan_bound import EVERY_3D
    from pipeplan.planner.bound.tensor_bound import tensor_lower_bound
    from pipeplan.viz.plan_tables import bound_line

    request = plan_request("gpt:layers=2,hidden=256,heads=8,seq=128,vocab=1024", "dgx-a100-8x1", 8, time_budget_s=None)
    flat = Plan((Stage(0, 2, (0, 1, 2, 3)), Stage(3, 5, (4, 5, 6, 7))), 1, 2, 4, "1f1b")
    bounds = Bounds(request)
    assert bounds.of(flat, 1.0).of in (EVERY_PLAN, ONE_STAGE)
    split = dataclasses.replace(flat, stages=tuple(dataclasses.replace(s, tp=2) for s in flat.stages))
    sharded = dataclasses.replace(flat, zero=1)
    for plan in (split, sharded):
        ms = simulate_plan(plan, request.model).iteration_time
        measured = bounds.of(plan, ms)
        assert measured.of == EVERY_3D and measured.bound == tensor_lower_bound(request)
        assert measured.gap >= 1 and f"proven lower bound over {EVERY_3D}" in bound_line(measured)
