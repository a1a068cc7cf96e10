"""pipeplan.runtime."""
