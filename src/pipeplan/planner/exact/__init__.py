"""`exact`: the best plan under pipeplan's simulator for small instances, by branch and bound.

Modules, one idea each: space (how to walk its part of planner.plan_space once), stages (a stage's costs, cached),
symmetry (the cluster's automorphisms), search_tables (what the search reads besides its incumbent), search (the
branch and bound), filled and lookahead (its pruning steps, on those tables and the best time), first_plans (its
early incumbents), planner (the entry point and its refusals). Its bounds are in planner.bound (placed_bounds,
suffix_table, best_rings).
"""

from pipeplan.planner.exact.planner import MAX_ORDERS, plan_exact
from pipeplan.planner.exact.space import canonical_tuples, ordered_groups, search_space
from pipeplan.planner.plan_space import EXACT_SCHEDULES as SCHEDULES

__all__ = ["MAX_ORDERS", "SCHEDULES", "canonical_tuples", "ordered_groups", "plan_exact", "search_space"]
