"""The `pipeplan train` command with a plan that carries an adaptive setting: it adapts with no other flag."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.torch  # trains (make test-fast leaves it out)

TINY = ["--local", "2", "--steps", "4", "--opt", "hidden=16", "--opt", "blocks=4", "--dataset", "sample", "--dtype",
        "float64", "--optimizer", "sgd", "--lr", "0.05", "--no-predict", "--json"]  # fmt: skip
BUDGET = 1e9
"""The plan's memory budget: far above what the tiny model holds, far below this host's memory per process."""


@pytest.mark.slow
def test_a_plan_with_an_adaptive_setting_adapts_within_its_budget_with_no_other_flag(tmp_path: Path) -> None:
    """train --plan of a kfkb plan with an "adaptive" block (no --adaptive): the run reports its k per iteration and
    decisions, starts at the plan's k, and its controller's memory limit is the plan's budget."""
    from runtime_cli import run_train

    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({
        "format": "pipeplan.plan/1", "profile": "none.json", "cluster": "none.json", "pipeline_replicas": 1,
        "microbatches": 4, "microbatch_size": 8, "schedule": "kfkb", "k": 2, "chunks": 1, "order": None,
        "stages": [{"first_layer": 0, "last_layer": 1, "devices": [0]}, {"first_layer": 2, "last_layer": 3, "devices": [1]}],
        "adaptive": {"k": 2, "k_choices": [1, 2, 3, 4], "memory_budget_bytes": BUDGET},
    }))  # fmt: skip
    done = run_train([*TINY, "--plan", str(plan)])
    assert done.returncode == 0, done.stderr
    adaptive = json.loads(done.stdout)["adaptive"]
    assert len(adaptive["k"]) == 4 and adaptive["k"][0] == 2
    assert adaptive["decisions"] and all(d["memory_limit_bytes"] == BUDGET for d in adaptive["decisions"])


@pytest.mark.slow
def test_local_workers_never_open_the_plan_or_the_bandwidth_trace(tmp_path: Path) -> None:
    """train --local 2 --plan --bandwidth-trace: the launcher reads and checks both files, then they are removed
    before any worker starts; the workers run the TrainConfig the launcher handed them (the plan and the trace's steps
    values in it), on the emulated network, and train."""
    import subprocess
    import sys

    from pipeplan.core.hardware.bandwidth_trace import BandwidthTrace, TraceStep
    from pipeplan.io.bandwidth_trace_json import write_bandwidth_trace

    trace = tmp_path / "trace.json"
    write_bandwidth_trace(BandwidthTrace((TraceStep(0.0, None, 0.5),)), trace, {"kind": "test"})

    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({
        "format": "pipeplan.plan/1", "profile": "none.json", "cluster": "none.json", "pipeline_replicas": 1,
        "microbatches": 4, "microbatch_size": 8, "schedule": "1f1b", "k": 1, "chunks": 1, "order": None,
        "stages": [{"first_layer": 0, "last_layer": 1, "devices": [0]}, {"first_layer": 2, "last_layer": 3, "devices": [1]}],
    }))  # fmt: skip
    boot = (
        "import os, pipeplan.runtime.training.launch as launch; real = launch.launch_local\n"
        f"def gone(*args, **kwargs):\n    os.remove({str(plan)!r}); os.remove({str(trace)!r}); return real(*args, **kwargs)\n"
        "launch.launch_local = gone\nfrom pipeplan.cli import main; main()"
    )
    done = subprocess.run([sys.executable, "-c", boot, "train", *TINY, "--plan", str(plan),
                           "--bandwidth-trace", str(trace), "--emulate-gb-per-s", "1"], capture_output=True,
                          text=True, timeout=600, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert not plan.exists() and not trace.exists()
    assert len(json.loads(done.stdout)["losses"]) == 4  # each wire built from the steps it was given
