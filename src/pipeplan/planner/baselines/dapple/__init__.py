"""DAPPLE (Fan et al., PPoPP 2021) as a baseline: its planning model, partition-and-placement DP, pivot latency and
ranking, and HPGO (the authors' planner) kept to check the port."""
