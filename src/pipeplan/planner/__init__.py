"""pipeplan.planner."""
