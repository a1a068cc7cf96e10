"""What a run keeps and what may break it: checkpoints (data, never code) and injected faults."""
