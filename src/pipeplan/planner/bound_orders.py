"""The one-stage-per-rank bound over every layer order pipeplan's search may place a DAG profile's layers in.

planner.bound's stage term splits the layers into stages contiguous in the profile's order; a plan of a DAG
profile may place its layers in another topological order (core.dag), where its stages are contiguous instead.
pipeplan's search (planner.search.dag_search) plans on the profile's order and on each order of
planner.search.dag_orders, so every plan it returns with one stage per rank is one of the plans the stage term
covers on one of those orders, priced as the chain of that order (sim.cost.chain_view): the least of the bounds
over those orders holds for it.
"""

from __future__ import annotations

import dataclasses
import math

from pipeplan.core.dag import reorder
from pipeplan.planner.bound import LowerBound, lower_bound
from pipeplan.planner.request import PlanRequest
from pipeplan.planner.search.dag_orders import dag_orders
from pipeplan.planner.search.dag_search import slowest_rate_bytes_per_ms


def search_orders(request: PlanRequest) -> list[tuple[int, ...] | None]:
    """The layer orders pipeplan's search plans on: None (the profile's own), then each of dag_orders'."""
    orders, _ = dag_orders(request.profile, slowest_rate_bytes_per_ms(request), request.cluster.num_devices)
    return [None, *orders]


def stage_bound_over_orders(request: PlanRequest) -> LowerBound:
    """The least, over search_orders, of lower_bound(stages=True) on the profile reordered so (module docstring)."""
    best: LowerBound | None = None
    for order in search_orders(request):
        chained = request if order is None else dataclasses.replace(request, profile=reorder(request.profile, order))
        found = lower_bound(chained, stages=True, stop_at=math.inf if best is None else best.ms)
        if best is None or found.ms < best.ms:
            best = found
    assert best is not None
    return best
