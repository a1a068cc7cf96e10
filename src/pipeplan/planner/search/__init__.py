"""pipeplan's own search: candidates, partition DP, mapping, schedule choice, refinement, list scheduling."""
