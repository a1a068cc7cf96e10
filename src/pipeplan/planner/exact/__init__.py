"""`exact`: the best plan under pipeplan's simulator for small instances, by branch and bound.

Modules, one idea each: space (how to walk its part of planner.plan_space once), stages (a stage's costs, cached),
bounds (bounds from placed stages), suffix (the best-split bound on the layers left), search (the branch and
bound), planner (the entry point and its refusals).
"""

from pipeplan.planner.exact.planner import MAX_ORDERS, plan_exact
from pipeplan.planner.exact.space import canonical_tuples, ordered_groups, search_space
from pipeplan.planner.plan_space import EXACT_SCHEDULES as SCHEDULES

__all__ = ["MAX_ORDERS", "SCHEDULES", "canonical_tuples", "ordered_groups", "plan_exact", "search_space"]
