"""A plan over a layer order priced as the chain plan of that order: the one place a DAG plan meets the cost model.

A plan with a `layer_order` (core.dag) costs exactly what the chain plan
with the same stages costs on `reorder(profile, order)`: stage sums over the
layers at its positions, cut bytes of the live sets at its boundaries.
Everything that prices a plan (plan_costs, hence the simulator, memory,
train's prediction and the adapt controller) goes through `chain_view`.
"""

from __future__ import annotations

import dataclasses

from pipeplan.core.dag import reorder
from pipeplan.core.plan import Plan
from pipeplan.sim.cost.layers import LayerCosts
from pipeplan.sim.cost.model import CostModel

_VIEWS: dict[tuple[int, tuple[int, ...]], tuple[CostModel, CostModel]] = {}
"""(id of the model, order) -> (that model, the model of the reordered profile); the model is kept so its id stays its."""
_KEEP = 16


def reordered_model(model: CostModel, order: tuple[int, ...]) -> CostModel:
    """The cost model of `reorder(model.profile, order)`, same cluster, scaling, optimizer and split (memoized).

    Raises:
        PlanError: `order` is not a topological order of the profile's layers (naming the layer and its input).
    """
    key = (id(model), order)
    hit = _VIEWS.get(key)
    if hit is not None and hit[0] is model:
        return hit[1]
    profile = reorder(model.profile, order)
    view = (
        model
        if profile is model.profile
        else dataclasses.replace(model, profile=profile, layers=LayerCosts(profile, model.layers.scaling, model.layers.optimizer))
    )
    if len(_VIEWS) >= _KEEP:
        _VIEWS.pop(next(iter(_VIEWS)))
    _VIEWS[key] = (model, view)
    return view


def chain_view(plan: Plan, model: CostModel) -> tuple[Plan, CostModel]:
    """(plan, model) as a chain: a plan without a layer order as it is, else its stages over the reordered profile.

    Raises:
        PlanError: the order does not fit the profile (check_plan_matches says which layer).
    """
    if plan.layer_order is None:
        return plan, model
    return dataclasses.replace(plan, layer_order=None), reordered_model(model, plan.layer_order)
