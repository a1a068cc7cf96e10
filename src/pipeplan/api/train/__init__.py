"""`pipeplan train` in the API: its flags and files (train_flags), its checks (train_setup), its wiring (training)."""
