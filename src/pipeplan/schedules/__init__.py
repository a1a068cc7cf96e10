"""pipeplan.schedules."""
