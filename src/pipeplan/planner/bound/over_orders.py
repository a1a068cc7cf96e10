"""The one-stage-per-rank bound over every layer order pipeplan's search may place a DAG profile's layers in.

planner.bound.shape_bounds's stage term splits the layers into stages contiguous in the profile's order; a plan of a DAG
profile may place its layers in another topological order (core.dag), where its stages are contiguous instead.
pipeplan's search (planner.search.dag_search) plans on the profile's order and on each order of
planner.search.dag_orders, so every plan it returns with one stage per rank is one of the plans the stage term
covers on one of those orders, priced as the chain of that order (sim.cost.chain_view): the least of the bounds
over those orders holds for it. The other terms do not depend on the order (sums over all layers; the fill term
takes the cheapest layers), so they are computed once.
"""

from __future__ import annotations

import dataclasses
import math

from pipeplan.core.dag import reorder
from pipeplan.planner.bound.fill_term import fill_term
from pipeplan.planner.bound.shape_bounds import TERMS, LowerBound, ShapeBounds
from pipeplan.planner.plan_space import shapes
from pipeplan.planner.request import PlanRequest
from pipeplan.planner.search.dag_orders import dag_orders
from pipeplan.planner.search.dag_search import slowest_rate_bytes_per_ms


def search_orders(request: PlanRequest) -> list[tuple[int, ...] | None]:
    """The layer orders pipeplan's search plans on: None (the profile's own), then each of dag_orders'."""
    orders, _ = dag_orders(request.profile, slowest_rate_bytes_per_ms(request), request.cluster.num_devices)
    return [None, *orders]


def stage_bound_over_orders(request: PlanRequest) -> LowerBound:
    """The least, over the shapes, of the largest of planner.bound.shape_bounds's terms and the least over search_orders of the
    stage term on the profile reordered so (module docstring): lower_bound(stages=True) over those orders."""
    base = ShapeBounds(request)
    ordered = [base] + [
        ShapeBounds(dataclasses.replace(request, profile=reorder(request.profile, order))) for order in search_orders(request)[1:]
    ]
    cheap = sorted((max(terms), rp, b, terms) for rp, b in shapes(request) if base.fits(rp) for terms in [base.terms(rp, b)])
    best = LowerBound(math.inf, 0, 0, "memory", (math.inf,) * len(TERMS))
    for value, rp, b, terms in cheap:  # from the smallest partial bound, until none can go below the best
        if value >= best.ms:
            break
        terms = (*terms, fill_term(base, rp, b))
        value = max(terms)
        if value >= best.ms:
            continue
        splits = [bounds.stages(rp, b) for bounds in ordered]
        least = min((value if math.isnan(dp) else max(value, dp)) for dp in splits)
        dp = least if least > value else min((dp for dp in splits if not math.isnan(dp)), default=math.nan)
        terms = (*terms, dp)
        if least < best.ms:
            best = LowerBound(least, rp, b, TERMS[terms.index(least)] if least in terms else "stages", terms)
    return best
