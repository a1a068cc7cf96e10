"""pipeplan.cli."""
