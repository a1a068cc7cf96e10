"""pipeplan.sim."""
