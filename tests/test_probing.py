"""Tests of api/probing.py: probe's job checked once by the launcher, handed to --local's workers as one JSON value."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipeplan.api.probing import ProbeJob, probe_job
from pipeplan.core.errors import TrainConfigError
from pipeplan.presets.resolve import load_profile


def test_a_probe_job_reads_back_from_its_json_with_the_profile_as_a_value() -> None:
    """ProbeJob -> JSON text -> ProbeJob gives the same job, its profile equal to the one read (not a path)."""
    job = ProbeJob("c.json", load_profile("dapple/bert-48"), "mlp", "two", 3, 4, 5.0, 1, "sgd")
    back = ProbeJob.from_json(json.loads(json.dumps(job.to_json())))
    assert back == job
    assert ProbeJob.from_json(ProbeJob("c.json").to_json()) == ProbeJob("c.json")
    with pytest.raises(TrainConfigError, match="a probe job has no field 'argv'"):
        ProbeJob.from_json({**job.to_json(), "argv": []})


def test_probe_job_checks_the_numbers_then_the_outputs_then_the_profile() -> None:
    """probe_job refuses a bad number before it runs the output guard, and the guard before it reads the profile."""
    calls: list[str] = []
    with pytest.raises(TrainConfigError, match="--rounds must be >= 1, got 0"):
        probe_job("c.json", "gone.json", None, (1, 0, 1, 5.0), "adam", 2, None, lambda: calls.append("guard"))
    assert calls == []
    with pytest.raises(TrainConfigError, match="--module names the model of --profile"):
        probe_job("c.json", None, "m:f", (1, 1, 1, 5.0), "adam", 2, None, lambda: calls.append("guard"))
    assert calls == ["guard"]
    assert probe_job("c.json", None, None, (2, 3, 1, 5.0), "sgd", 2) == ProbeJob("c.json", None, None, None, 2, 3, 5.0, 1, "sgd")


@pytest.mark.torch
@pytest.mark.slow
def test_local_workers_never_open_a_user_file(tmp_path: Path) -> None:
    """probe --local 2 --profile: the launcher reads the profile and checks every option, then the profile is removed
    before any worker starts; the workers run the job they were handed (the profile's value in it), time its model
    and process 0 writes the cluster."""
    from pipeplan import api

    profile = api.profile_model("mlp", 8, options={"hidden": 16, "blocks": 4}, dataset="sample", batch_sizes=[8],
                                runs=1, warmup=0)  # fmt: skip
    api.save_profile(profile, str(tmp_path / "profile.json"))
    boot = (
        "import os, pipeplan.runtime.training.launch as launch; real = launch.launch_local\n"
        "def gone(*args, **kwargs):\n    [os.remove(name) for name in os.listdir('.')]; return real(*args, **kwargs)\n"
        "launch.launch_local = gone\nfrom pipeplan.cli import main; main()"
    )
    done = subprocess.run([sys.executable, "-c", boot, "probe", "--local", "2", "--profile", "profile.json", "--out",
                           "c.json", "--steps", "2", "--rounds", "1"], capture_output=True, text=True, timeout=600,
                          check=False, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["c.json"]  # the profile was gone before the workers started
    cluster = json.loads((tmp_path / "c.json").read_text())
    assert len(cluster["devices"]) == 2
    assert done.stdout.startswith("wrote cluster c.json: 2 cpu device(s), speeds "), done.stdout
