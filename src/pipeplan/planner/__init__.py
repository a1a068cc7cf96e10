"""Planners: from a profile, a cluster and a global batch to the fastest plan that fits (planner.planners: by name)."""
