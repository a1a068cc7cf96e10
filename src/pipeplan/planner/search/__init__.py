"""pipeplan.planner.search."""
