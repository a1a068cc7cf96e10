"""Tests of api/train/train_inputs.py: train's launcher opens each file it is given once (the plan, its profile and
cluster, the bandwidth trace), every check after it takes the values read."""

from __future__ import annotations

import collections
import json
import os
from pathlib import Path

import pytest

from train_job import write_mlp_job

pytestmark = pytest.mark.torch  # the launcher checks the model (one batch through it) before it would start workers

FILES = ("plan.json", "profile.json", "cluster.json", "trace.json")


@pytest.fixture
def job(tmp_path: Path) -> Path:
    """A plan of a tiny mlp on two CPUs, its profile and cluster (recorded in the plan beside it) and a trace."""
    write_mlp_job(tmp_path)
    return tmp_path


@pytest.mark.parametrize("given", [True, False], ids=["profile-and-cluster-given", "the-plan-s-own"])
def test_the_launcher_opens_each_file_once(
    job: Path, given: bool, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:  # fmt: skip
    """train --local 2 --plan --bandwidth-trace with the step predicted from a profile and cluster (given, or the
    plan's own): every file is opened exactly once (os.open, which every reader goes through: io.files) before the
    workers would start, and the config they would get carries the profile, cluster and trace as values."""
    from cli_runner import run
    from pipeplan.runtime.training import launch

    opened: collections.Counter[str] = collections.Counter()
    real_open = os.open

    def counting(path: str | os.PathLike[str], *args: object, **kwargs: object) -> int:
        name = os.path.basename(os.fspath(path))
        if name in FILES:
            opened[name] += 1
        return real_open(path, *args, **kwargs)  # type: ignore[arg-type]

    started: list[dict[str, object]] = []

    def record(nprocs: int, boot: str, *args: object, job: bytes, **kwargs: object) -> int:
        started.append(json.loads(job)["config"])
        return 0

    monkeypatch.setattr(launch, "launch_local", record)
    monkeypatch.chdir(job)
    monkeypatch.setattr(os, "open", counting)
    files = ["--profile", "profile.json", "--cluster", "cluster.json"] if given else []
    code, _, err = run(monkeypatch, capsys, "train", "--local", "2", "--plan", "plan.json", "--bandwidth-trace",
                       "trace.json", *files, "--opt", "hidden=16", "--opt", "blocks=4", "--dataset", "sample",
                       "--steps", "3", "--optimizer", "sgd", "--json")  # fmt: skip
    monkeypatch.undo()
    assert code == 0, err
    assert dict(opened) == dict.fromkeys(FILES, 1)
    (config,) = started
    assert config["profile_value"] is not None and config["cluster_value"] is not None
    network = config["network"]
    assert isinstance(network, dict) and network["trace_steps"] is not None and network["cluster_value"] is not None


def test_a_read_keeps_its_error_until_the_check_that_needs_it(tmp_path: Path) -> None:
    """A plan whose own profile does not exist reads (the plan, its cluster); the profile's read holds the error
    load_profile raises, naming the file, and raises it when its value is asked for."""
    from pipeplan.api.train.train_inputs import read_plan_inputs
    from pipeplan.core.errors import ProfileError
    from pipeplan.core.plan import Plan, Stage
    from pipeplan.io.plan_json import write_plan

    write_plan(Plan((Stage(0, 1, (0,)), Stage(2, 3, (1,))), 1, 4, 2, "1f1b"), tmp_path / "plan.json", "gone.json",
               "v100-8x2-25g")  # fmt: skip
    inputs = read_plan_inputs(str(tmp_path / "plan.json"), None, None).get()
    assert inputs.cluster.get().num_devices == 16
    assert inputs.profile.value is None and inputs.profile.spec == "gone.json"
    with pytest.raises(ProfileError, match=r"gone\.json"):
        inputs.profile.get()
    missing = read_plan_inputs(str(tmp_path / "none.json"), None, None)
    assert missing.value is None and "none.json" in str(missing.error)
