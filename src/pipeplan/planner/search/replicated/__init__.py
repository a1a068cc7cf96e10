"""pipeplan's own DAPPLE-inspired generator of replicated-pipeline seeds for its search (not a baseline planner)."""
