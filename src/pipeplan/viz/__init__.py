"""pipeplan.viz."""
