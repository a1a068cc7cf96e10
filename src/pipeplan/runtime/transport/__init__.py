"""Moving tensors between processes: the process group, point-to-point messages, the emulated network."""
