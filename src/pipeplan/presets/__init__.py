"""pipeplan.presets."""
