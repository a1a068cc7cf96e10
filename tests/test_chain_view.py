"""Tests of sim.cost.chain_view: a plan over a layer order costs and simulates as the chain plan of that order."""

from __future__ import annotations

import dataclasses

import pytest

from models import default_model
from pipeplan.core.dag import inputs_of, reorder
from pipeplan.core.errors import PlanError
from pipeplan.core.plan import Plan, Stage
from pipeplan.presets.resolve import load_cluster, load_profile
from pipeplan.sim.cost.memory import memory_per_device
from pipeplan.sim.cost.plan_costs import plan_costs
from pipeplan.sim.plan_sim import simulate_plan


def swapped_order(name: str) -> tuple[int, tuple[int, ...]]:
    """The profile's order with the first two neighbours past the middle that do not feed each other swapped, and the
    position of the first of them: a cut there is an antichain cut no prefix of the default order gives."""
    profile = load_profile(name)
    inputs = inputs_of(profile)
    n = profile.num_layers
    p = next(q for q in range(n // 5, n - 1) if q not in inputs[q + 1])
    order = list(range(n))
    order[p], order[p + 1] = order[p + 1], order[p]
    return p, tuple(order)


def dag_plan(p: int, order: tuple[int, ...]) -> Plan:
    """Two stages cut after position p of `order`, 1F1B, 8 microbatches of 32."""
    stages = (Stage(0, p, (0,)), Stage(p + 1, len(order) - 1, (1,)))
    return Plan(stages, 1, 8, 32, "1f1b", layer_order=order)


def test_a_dag_plan_simulates_as_the_chain_plan_of_its_order() -> None:
    """resnet50 cut at an antichain: costs, iteration time and memory equal the chain plan's on the reordered profile,
    and the cut carries the live set of that order, not the default order's cut at that position."""
    p, order = swapped_order("resnet50")
    profile, cluster = load_profile("resnet50"), load_cluster("v100-8x1")
    plan = dag_plan(p, order)
    chain = dataclasses.replace(plan, layer_order=None)
    model, reordered = default_model(profile, cluster), default_model(reorder(profile, order), cluster)
    assert plan_costs(plan, model) == plan_costs(chain, reordered)
    assert simulate_plan(plan, model).iteration_time == simulate_plan(chain, reordered).iteration_time
    assert memory_per_device(plan, model) == memory_per_device(chain, reordered)
    assert reorder(profile, order).cut_bytes[p] != profile.cut_bytes[p]
    assert simulate_plan(plan, model).iteration_time != simulate_plan(chain, model).iteration_time


def test_an_order_against_the_graph_is_refused_naming_the_layer_and_its_input() -> None:
    """An order that runs a layer before its input (here on a chain profile) is refused before any pricing."""
    profile, cluster = load_profile("vgg16"), load_cluster("v100-8x1")
    order = (1, 0, *range(2, profile.num_layers))
    with pytest.raises(PlanError, match=r"puts layer 1 \(.*\) \(position 0\) before its input layer 0"):
        plan_costs(dag_plan(5, order), default_model(profile, cluster))
