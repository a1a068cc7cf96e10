"""pipeplan.io."""
