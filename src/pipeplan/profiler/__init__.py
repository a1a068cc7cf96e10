"""pipeplan.profiler."""
