"""What a run measures and predicts: the probed cluster, calibration, the plan's prediction, the timeline."""
