"""Make tests/data/linear_golden.json: plans and the times, memory and bounds the simulator gave them.

Run once at commit ea0b8ba (before costs followed the microbatch size), from the repository root:
    .venv/bin/python tests/data/make_linear_golden.py
tests/test_linear_golden.py checks that `--batch-scaling linear` still scores every plan exactly so.
The plans come from the planners of that commit on built-in profiles and clusters and on fuzzed requests.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pipeplan.sim.plan_costs import memory_per_device, simulate_plan

from pipeplan.core.errors import PipeplanError
from pipeplan.io.plan_json import plan_to_json
from pipeplan.planner.planners import PLANNERS
from pipeplan.planner.request import PlanRequest
from pipeplan.presets.resolve import load_cluster, load_profile
from planner_instances import fuzz_request

CASES = [
    ("dapple/bert-48", "v100-8x2-25g", 256, None),
    ("dapple/bert-48", "v100-8x1", 64, 2),
    ("pipedream/vgg16", "v100-8x1", 512, None),
    ("pipedream/alexnet", "pcie-4x4-10g", 1024, None),
    ("dapple/gnmt-16", "a100-8x2", 512, None),
    ("pipedream/resnet50", "hetero-a100-v100", 256, None),
    ("dapple/xlnet-24", "v100-1x16-25g", 32, None),
    ("dapple/amoeba-36", "h100-8x4", 64, None),
]
SCHEDULED = [("dapple/bert-24", "v100-8x1", 96, s) for s in ("gpipe", "kfkb", "zb-h1", "interleaved-1f1b", "list")]
FAST = ("pipedream", "balanced")


def entry(request: PlanRequest, profile_name: str, cluster_name: str, planner: str) -> dict | None:
    """One golden record: the plan a planner gives and what the simulator says of it."""
    try:
        result = PLANNERS[planner](request)
    except PipeplanError:
        return None
    plan = result.plan
    sim = simulate_plan(plan, request.profile, request.cluster, record=False, optimizer_factor=request.optimizer_factor)
    memory = memory_per_device(plan, request.profile, request.cluster, optimizer_factor=request.optimizer_factor)
    return {
        "profile": profile_name,
        "cluster": cluster_name,
        "planner": planner,
        "optimizer_factor": request.optimizer_factor,
        "plan": plan_to_json(plan, profile_name, cluster_name),
        "iteration_time": sim.iteration_time,
        "lower_bound": sim.lower_bound,
        "bubble_fraction": sim.bubble_fraction,
        "memory_per_device": list(memory),
    }


def main() -> None:
    records = []
    for profile_name, cluster_name, batch, size in CASES:
        request = PlanRequest(load_profile(profile_name), load_cluster(cluster_name), batch, size)
        for planner in ("pipeplan", "dapple", *FAST):
            got = entry(request, profile_name, cluster_name, planner)
            if got is not None:
                records.append(got)
                print(profile_name, cluster_name, planner, got["iteration_time"], file=sys.stderr)
    for profile_name, cluster_name, batch, schedule in SCHEDULED:
        request = PlanRequest(load_profile(profile_name), load_cluster(cluster_name), batch, None, schedule)
        got = entry(request, profile_name, cluster_name, "pipeplan")
        if got is not None:
            records.append(got)
            print(profile_name, cluster_name, schedule, got["iteration_time"], file=sys.stderr)
    for seed in range(24):
        request = fuzz_request(seed)
        if request.cluster.num_devices > 16:
            continue
        for planner in FAST:
            got = entry(request, f"fuzz:{seed}", f"fuzz:{seed}", planner)
            if got is not None:
                records.append(got)
    out = Path(__file__).with_name("linear_golden.json")
    out.write_text(json.dumps({"commit": "ea0b8ba", "records": records}, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(records)} records to {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
