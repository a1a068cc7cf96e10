"""`bound`: every lower bound the planners prove on a plan's iteration time, and the tables they are built from.

shape_bounds (per shape: the terms every plan of it obeys, and `lower_bound` over a request), stage_term,
phase_term and fill_term (its terms), over_orders and plan_bound (the bound over the DAG planner's stage orders,
and one plan's), best_rings (the fastest all-reduce ring r devices allow), placed_bounds (bounds from placed
stages, on a partial or a whole plan) and suffix_table (the best split of the layers left into stages). The
simulator's own bound on one schedule is sim.engine.lower_bound.
"""
