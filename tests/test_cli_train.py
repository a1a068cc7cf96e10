"""The `pipeplan train` command with a plan that carries an adaptive setting: it adapts with no other flag."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from train_job import write_mlp_job

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
def test_local_workers_never_open_a_user_file(tmp_path: Path) -> None:
    """train --local 2: the launcher reads and checks every file it is given, then they are all removed before any
    worker starts; the workers run the TrainConfig the launcher handed them (the files' contents values in it) and
    train. One run with --plan, its profile and cluster (the step predicted from them) and a --bandwidth-trace whose
    links take the cluster's rate (no --emulate-gb-per-s); one with a --schedule file."""
    import subprocess
    import sys

    from pipeplan.io.schedule_io import write_schedule_csv
    from pipeplan.schedules import make_schedule

    model = ["--opt", "hidden=16", "--opt", "blocks=4", "--dataset", "sample"]
    write_mlp_job(tmp_path)
    write_schedule_csv(make_schedule("1f1b", 2, 4), tmp_path / "order.csv")

    runs = {
        "plan": [*model, "--plan", "plan.json", "--bandwidth-trace", "trace.json"],
        "schedule": [*model, "--schedule", "order.csv", "--batch-size", "32", "--no-predict"],
    }
    boot = (
        "import os, pipeplan.runtime.training.launch as launch; real = launch.launch_local\n"
        "def gone(*args, **kwargs):\n    [os.remove(name) for name in os.listdir('.')]; return real(*args, **kwargs)\n"
        "launch.launch_local = gone\nfrom pipeplan.cli import main; main()"
    )
    outs = {}
    for name, args in runs.items():
        folder = tmp_path / name
        folder.mkdir()
        for file in ("profile.json", "cluster.json", "plan.json", "trace.json", "order.csv"):
            (folder / file).write_bytes((tmp_path / file).read_bytes())
        done = subprocess.run([sys.executable, "-c", boot, "train", "--local", "2", "--steps", "3", "--optimizer", "sgd",
                               "--json", *args], capture_output=True, text=True, timeout=600, check=False,
                              cwd=folder)  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert list(folder.iterdir()) == []  # every file gone before the workers started
        outs[name] = json.loads(done.stdout)
        assert len(outs[name]["losses"]) == 3, done.stderr
    assert outs["plan"]["predicted_step_ms"] > 0  # predicted by process 0 from the profile and cluster it was handed
    assert outs["schedule"]["predicted_step_ms"] is None
    assert outs["schedule"]["schedule"] == "order"  # the file's schedule, as the launcher read it
