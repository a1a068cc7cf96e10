"""`train --data MODULE:FACTORY --loss MODULE:FN` on local processes: the losses and held-out scores of a plain torch
loop over the same samples in the same order (float64), and the refusals said once by the launcher."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional

from runtime_cli import run_train

pytestmark = pytest.mark.torch

MODEL = """
from torch import nn

def build():
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3))
"""
DATA = """
import torch

def _rows():
    g = torch.Generator().manual_seed(11)
    return torch.randn(20, 4, generator=g), torch.randint(0, 3, (20,), generator=g)

def pairs():
    x, y = _rows()
    return [(x[i], int(y[i])) for i in range(20)]

def hf():
    x, y = _rows()
    return [{"inputs": x[i], "labels": y[i], "attention_mask": torch.ones(4)} for i in range(20)]

def nothing():
    return None

def wide():
    return [(torch.randn(5), 0) for _ in range(4)]
"""
LOSS = """
from torch.nn import functional

def ce(out, target):
    return functional.cross_entropy(out, target)

def per_sample(out, target):
    return functional.cross_entropy(out, target, reduction="none")
"""
SEED = 3
EPOCH_SALT = 1_000_003
"""The documented sample order (docs/troubleshooting.md): epoch e of the training split is
torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1_000_003 + e)), and --eval-fraction holds out the
first round(F n) of torch.randperm(n, generator=...manual_seed(seed * 1_000_003 + 999_983)), both in index order."""


def _user_files(folder: Path) -> dict[str, str]:
    """The three user files in `folder`; the environment that puts it on the import path (not the working folder)."""
    for name, text in (("umodel.py", MODEL), ("udata.py", DATA), ("uloss.py", LOSS)):
        (folder / name).write_text(textwrap.dedent(text))
    return {"PYTHONPATH": os.pathsep.join([str(folder), os.environ.get("PYTHONPATH", "")]), "PYTHONDONTWRITEBYTECODE": "1"}


def _reference(epochs: int, batch: int, fraction: float) -> tuple[list[float], list[tuple[float, float]]]:
    """A plain torch loop: the same initial weights (the factory under torch.manual_seed(SEED)), Adam(1e-3), mean
    cross-entropy over each global batch in the documented order; held-out (accuracy, loss) after every epoch."""
    g = torch.Generator().manual_seed(11)
    x, y = torch.randn(20, 4, generator=g).double(), torch.randint(0, 3, (20,), generator=g)
    held = round(fraction * 20)
    order = torch.randperm(20, generator=torch.Generator().manual_seed(SEED * EPOCH_SALT + 999_983))
    test, train = order[:held].sort().values, order[held:].sort().values
    tx, ty, x, y = x[test], y[test], x[train], y[train]
    torch.manual_seed(SEED)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3)).double()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses, scores = [], []
    for epoch in range(epochs):
        perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(SEED * EPOCH_SALT + epoch))
        for lo in range(0, len(x) - batch + 1, batch):
            idx = perm[lo : lo + batch]
            opt.zero_grad()
            loss = functional.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
        if held:
            with torch.no_grad():
                out = model(tx)
                scores.append((float((out.argmax(-1) == ty).double().mean()), float(functional.cross_entropy(out, ty))))
    return losses, scores


@pytest.mark.slow
def test_two_stages_train_on_the_users_data_and_loss_as_a_plain_loop_does(tmp_path: Path) -> None:
    """2 pipeline stages, 2 epochs of a seeded order, a held-out fifth: every loss and both held-out scores equal
    the plain loop's (float64)."""
    env = _user_files(tmp_path)
    done = run_train(["--local", "2", "--schedule", "1f1b", "-p", "2", "-m", "2", "-b", "8", "--module", "umodel:build",
                      "--data", "udata:pairs", "--loss", "uloss:ce", "--eval-fraction", "0.2", "--eval", "--epochs", "2",
                      "--dtype", "float64", "--seed", str(SEED), "--json"], env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    losses, scores = _reference(2, 8, 0.2)
    assert len(out["losses"]) == len(losses) == 4
    assert out["losses"] == pytest.approx(losses, rel=1e-10, abs=1e-12)
    got = [(e["test_accuracy"], e["test_loss"]) for e in out["eval"]]
    assert [e["step"] for e in out["eval"]] == [2, 4]
    assert got == [pytest.approx(s, rel=1e-10, abs=1e-12) for s in scores]


@pytest.mark.slow
def test_two_replicas_read_disjoint_halves_of_each_batch_of_dict_samples(tmp_path: Path) -> None:
    """Hugging Face style dicts (input, labels, an all-ones mask) on one stage held by 2 data-parallel copies: each
    copy reads its half of the global batch (the summed gradient is the whole batch's once), so the losses are the
    plain loop's over all 20 samples, 2 epochs of batch 10 (the spec's own loss is none: --loss gives it)."""
    env = _user_files(tmp_path)
    done = run_train(["--local", "2", "--schedule", "1f1b", "-p", "1", "-m", "1", "--replicas", "2", "-b", "10",
                      "--module", "umodel:build", "--data", "udata:hf", "--loss", "uloss:ce", "--epochs", "2",
                      "--dtype", "float64", "--seed", str(SEED), "--json"], env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    losses, _ = _reference(2, 10, 0.0)
    assert json.loads(done.stdout)["losses"] == pytest.approx(losses, rel=1e-10, abs=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--data", "udata:nothing", "--loss", "uloss:ce"], "--data udata:nothing returned nothing (None)"),
        (["--data", "udata:wide", "--loss", "uloss:ce"], "does not fit the model: RuntimeError: mat1 and mat2"),
        (["--data", "udata:pairs", "--loss", "uloss:per_sample"], "the loss must return a scalar floating-point tensor"),
        (["--data", "udata:pairs", "--loss", "uloss:ce", "--eval"], "--eval needs data with a held-out split; --data"),
    ],
)  # fmt: skip
def test_bad_data_or_loss_is_one_line_from_the_launcher(tmp_path: Path, args: list[str], message: str) -> None:
    """Exit 2, one line on stderr (the launcher's, before any process starts: no rank named), nothing on stdout."""
    env = _user_files(tmp_path)
    done = run_train(["--local", "2", "--schedule", "1f1b", "-p", "2", "-m", "2", "-b", "8", "--module", "umodel:build",
                      "--steps", "1", *args], env=env, timeout=120)  # fmt: skip
    lines = done.stderr.splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith("error: TrainConfigError: ") and message in lines[0] and "rank" not in lines[0], lines
    assert done.stdout == ""


@pytest.mark.slow
def test_a_profile_of_your_data_needs_it_again_and_trains_on_it_through_the_api(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # fmt: skip
    """profile_model(data=, loss=) measures your samples and records only that it did; `train --plan` without --data
    is refused by the launcher (one line, no rank); train_local(data=, loss=) runs the plan on 2 processes with the
    plain loop's losses (the first epoch's 2 batches of 8)."""
    import sys

    from pipeplan import api
    from pipeplan.core.plan import Plan, Stage
    from pipeplan.io.cluster_json import cluster_to_json
    from pipeplan.io.plan_json import write_plan
    from pipeplan.runtime.measurement.prediction import local_cluster

    env = _user_files(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    profile = api.profile_model("umodel:build", 4, data="udata:pairs", loss="uloss:ce", runs=1, warmup=0)
    assert profile.source is not None and profile.source.dataset == "data"
    api.save_profile(profile, str(tmp_path / "prof.json"))
    cluster = tmp_path / "cpus.json"
    obj = cluster_to_json(local_cluster(2, 1e-5, 1e9))
    for device in obj["devices"]:
        device["kind"] = "cpu"
    cluster.write_text(json.dumps(obj))
    plan = Plan((Stage(0, 1, (0,)), Stage(2, 4, (1,))), 1, 2, 4, "1f1b")
    write_plan(plan, tmp_path / "plan.json", str(tmp_path / "prof.json"), str(cluster))
    done = run_train(["--local", "2", "--plan", str(tmp_path / "plan.json"), "--module", "umodel:build", "--steps", "1"],
                     env=env, timeout=120)  # fmt: skip
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "was measured on your own samples (--data)" in done.stderr and "rank" not in done.stderr
    run = api.train_local(plan, str(tmp_path / "prof.json"), str(cluster), steps=2, seed=SEED, module="umodel:build",
                          data="udata:pairs", loss="uloss:ce")  # fmt: skip
    losses, _ = _reference(1, 8, 0.0)
    assert run.losses == pytest.approx(losses, rel=1e-5)
