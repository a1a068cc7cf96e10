"""pipeplan.adapt."""
