"""The files of a small train job, shared by the tests of train's launcher: a tiny mlp's profile, a two-CPU cluster,
a 1F1B plan of the two (recording them by names relative to it) and a constant bandwidth trace."""

from __future__ import annotations

import json
from pathlib import Path


def write_mlp_job(folder: Path) -> None:
    """profile.json, cluster.json, plan.json and trace.json in `folder` (the mlp: hidden 16, 4 blocks, `sample`)."""
    from pipeplan import api
    from pipeplan.core.hardware.bandwidth_trace import BandwidthTrace, TraceStep
    from pipeplan.io.bandwidth_trace_json import write_bandwidth_trace

    profile = api.profile_model("mlp", 8, options={"hidden": 16, "blocks": 4}, dataset="sample", batch_sizes=[8],
                                runs=1, warmup=0)  # fmt: skip
    api.save_profile(profile, str(folder / "profile.json"))
    cluster = {"format": "pipeplan.cluster/1", "name": "two-cpus", "devices": [{"kind": "cpu", "memory_gb": 4}] * 2,
               "bandwidth_gb_per_s": [[0, 1], [1, 0]], "latency_us": [[0, 10], [10, 0]]}  # fmt: skip
    (folder / "cluster.json").write_text(json.dumps(cluster))
    plan = api.plan(profile, str(folder / "cluster.json"), 32, schedule="1f1b", replication="none").plan
    api.save_plan(plan, str(folder / "plan.json"), "profile.json", "cluster.json")  # names relative to the plan
    write_bandwidth_trace(BandwidthTrace((TraceStep(0.0, None, 0.5),)), folder / "trace.json", {"kind": "test"})
