"""Shared parameters in the runtime: a tied embedding/head split over stages trains exactly the one-process model.

The user's model is a file in tmp_path (embedding, two blocks, a head whose weight is the embedding's), trained with
`pipeplan train --local N` in float64 on plans that put the tied pair on different stages; every run's losses equal
a plain torch loop over the user's own module, and every process's copy of the tied weight is equal at the end.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from pipeplan.core.plan import Plan, Stage  # noqa: E402
from pipeplan.presets.resolve import load_schedule  # noqa: E402
from pipeplan.runtime.execution.optim import distinct  # noqa: E402
from pipeplan.runtime.execution.shared_grads import (  # noqa: E402
    check_asynchronous_sharing,
    shared_copies,
    stage_of_layers,
)
from pipeplan.runtime.placement import Topology  # noqa: E402
from pipeplan.runtime.rank_errors import TrainConfigError  # noqa: E402
from pipeplan.schedules.plan_schedule import plan_schedule  # noqa: E402
from runtime_cli import run_train  # noqa: E402

pytestmark = pytest.mark.torch

SRC = str(Path(__file__).resolve().parents[1] / "src")
TIED_MODEL = '''
import torch
from torch import nn
from torch.nn import functional as F

VOCAB, WIDTH, SEQ = 11, 6, 4


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        return x + torch.tanh(self.fc(x))


class TiedLM(nn.Module):
    """embedding -> block -> block -> head, the head's weight the embedding's (one nn.Parameter)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.embed.weight

    def pipeline_layers(self):
        return [("embed", self.embed), ("block0", self.blocks[0]), ("block1", self.blocks[1]), ("head", self.head)]

    def forward(self, x):
        return self.head(self.blocks[1](self.blocks[0](self.embed(x))))

    def sample_input(self, n):
        return torch.randint(0, VOCAB, (n, SEQ), generator=torch.Generator().manual_seed(1))

    def sample_target(self, n):
        return torch.randint(0, VOCAB, (n, SEQ), generator=torch.Generator().manual_seed(2))

    @staticmethod
    def loss_fn(output, target):
        return F.cross_entropy(output.reshape(-1, VOCAB), target.reshape(-1))


def build() -> TiedLM:
    return TiedLM()
'''
SEED, STEPS, LR, BATCH = 5, 6, 0.05, 8


def _tied_layers() -> list[torch.nn.Module]:
    """Four layers, the first and last holding one weight (as a tied embedding and head do)."""
    embed, head = torch.nn.Embedding(5, 3), torch.nn.Linear(3, 5, bias=False)
    head.weight = embed.weight
    return [embed, torch.nn.Linear(3, 3), torch.nn.Linear(3, 3), head]


def _plan(stages: list[tuple[int, int, tuple[int, ...]]], schedule: str = "1f1b") -> Plan:
    return Plan(tuple(Stage(a, b, d) for a, b, d in stages), 1, 2, 2, schedule)


def test_a_tied_pair_on_two_stages_is_exchanged_over_every_copy_of_both() -> None:
    """Stage 0 on two replicas, stage 1 on one: the tied weight's copies are on processes 0, 1 and 2, split."""
    plan = _plan([(0, 1, (0, 1)), (2, 3, (2,))])
    ((copies, param),) = shared_copies(_tied_layers(), Topology(plan, plan_schedule(plan), 3), ["e", "b0", "b1", "h"])
    assert (copies.name, copies.layers, copies.layer_names) == ("e.weight", (0, 3), ("e", "h"))
    assert (copies.stages, copies.ranks, copies.processes, copies.nbytes) == ((0, 1), (0, 1), (0, 1, 2), 5 * 3 * 4)
    assert copies.split and param.shape == (5, 3)
    assert copies.describe() == (
        "e.weight is held by layers 0 (e), 3 (h) on stages 0, 1: its gradient (60 bytes) is all-reduced over the 3 "
        "processes holding a copy [0, 1, 2] every iteration"
    )
    assert copies.to_json()["processes"] == [0, 1, 2]


def test_a_tied_pair_on_one_rank_is_not_split() -> None:
    """Interleaved chunks that put both holders on rank 0 (stages 0 and 2): one process holds the weight, no split."""
    embed, head = torch.nn.Embedding(5, 5), torch.nn.Linear(5, 5, bias=False)
    head.weight = embed.weight
    layers = [embed, torch.nn.Linear(5, 5), head, torch.nn.Linear(5, 5), torch.nn.Linear(5, 5)]
    plan = Plan((Stage(0, 0, (0,)), Stage(1, 1, (1,)), Stage(2, 3, (0,)), Stage(4, 4, (1,))), 1, 2, 2,
                "interleaved-1f1b", chunks=2)  # fmt: skip
    ((copies, _),) = shared_copies(layers, Topology(plan, load_schedule("interleaved-1f1b", 2, 2, chunks=2), 2))
    assert copies.stages == (0, 2) and copies.ranks == (0,) and copies.processes == (0,)
    assert not copies.split


def test_stage_of_layers_follows_a_graph_plans_layer_order() -> None:
    """A plan whose layer order is 2, 0, 1, 3 cut after two positions: layers 2 and 0 on stage 0, 1 and 3 on stage 1."""
    plan = Plan((Stage(0, 1, (0,)), Stage(2, 3, (1,))), 1, 2, 2, "1f1b", layer_order=(2, 0, 1, 3))
    assert stage_of_layers(plan, 4) == [0, 1, 0, 1]


def test_an_asynchronous_plan_that_splits_a_tied_pair_is_refused_naming_it() -> None:
    """pipemare steps each stage on its own: a tied weight on two stages is refused, one held by one stage is not."""
    layers = _tied_layers()
    names = ["embed", "b0", "b1", "head"]
    with pytest.raises(TrainConfigError, match=r"--schedule pipemare cannot split shared parameter embed\.weight \(held by "
                       r"layers embed, head\) over stages \[0, 1\]: .* run a synchronous --schedule"):  # fmt: skip
        check_asynchronous_sharing(layers, names, _plan([(0, 1, (0,)), (2, 3, (1,))], "list"), "pipemare")
    check_asynchronous_sharing(layers, names, _plan([(0, 3, (0,))], "list"), "pipemare")


def test_distinct_keeps_each_parameter_once_in_first_seen_order() -> None:
    """A weight two stages hold is given to the optimizer once (twice, it would be stepped twice)."""
    a, b = torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))
    assert [id(p) for p in distinct([a, b, a, b, a])] == [id(a), id(b)]


# ---- end to end: pipeplan train --local N on the user's tied model ----


def _reference(folder: Path, steps: int = STEPS) -> tuple[list[float], torch.Tensor]:
    """A plain torch loop over the user's own module: Adam on the mean loss of each global batch, float64."""
    import importlib.util

    from pipeplan.models.zoo.datasets import batch_indices

    spec = importlib.util.spec_from_file_location("tied_reference", folder / "tiedlm.py")
    assert spec is not None and spec.loader is not None
    user = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(user)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)  # as pipeplan builds a factory without a seed option
        model = user.build().double()
    inputs, targets = model.sample_input(1024), model.sample_target(1024)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    losses = []
    for step in range(steps):
        idx = batch_indices(1024, BATCH, step, SEED)
        optimizer.zero_grad()
        loss = model.loss_fn(model(inputs[idx]), targets[idx])
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses, model.embed.weight.detach()


def _run(folder: Path, args: list[str], steps: int = STEPS) -> subprocess.CompletedProcess[str]:
    """`pipeplan train ARGS` on the user's model in `folder`: float64, Adam, the reference's seed, rate and batch."""
    env = {"PYTHONPATH": os.pathsep.join([str(folder), SRC])}
    common = ["--module", "tiedlm:build", "--dtype", "float64", "--seed", str(SEED), "--lr", str(LR), "--steps", str(steps),
              "--batch-size", str(BATCH), "--no-predict"]  # fmt: skip
    done = run_train([*common, *args], env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    return done


def _train(folder: Path, args: list[str], steps: int = STEPS) -> dict[str, Any]:
    """The --json report of `_run`."""
    return json.loads(_run(folder, [*args, "--json"], steps).stdout)


def _tied_copies(root: Path, step: int) -> list[torch.Tensor]:
    """Every process's copy of the tied weight in the checkpoint of `step`: the embedding's and the head's."""
    copies = []
    for path in sorted((root / f"step-{step:06d}").glob("rank-*.pt")):
        for state in torch.load(path)["stages"].values():
            copies += [t for key, t in state.items() if key.endswith("weight") and t.shape == (11, 6)]
    return copies


@pytest.fixture
def user_model(tmp_path: Path) -> Path:
    (tmp_path / "tiedlm.py").write_text(TIED_MODEL)
    return tmp_path


CASES = {
    "1f1b on 2, emulated network": ["--local", "2", "--schedule", "1f1b", "-p", "2", "-m", "2", "--emulate-gb-per-s", "1"],
    "gpipe on 2": ["--local", "2", "--schedule", "gpipe", "-p", "2", "-m", "4"],
    "1f1b, 3 stages on 3": ["--local", "3", "--schedule", "1f1b", "-p", "3", "-m", "2"],
    "gpipe, stage 0 on 2 replicas, on 3": ["--local", "3", "--schedule", "gpipe", "-p", "2", "-m", "2", "--replicas", "2,1"],
    "zb-h1 on 2 (split backward)": ["--local", "2", "--schedule", "zb-h1", "-p", "2", "-m", "2"],
    "2 pipelines of 2 stages on 4": ["--local", "4", "--schedule", "1f1b", "-p", "2", "-m", "2"],
    "adaptive kfkb on 2": ["--local", "2", "--schedule", "kfkb", "-p", "2", "-m", "4", "--k", "2", "--adaptive"],
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_a_split_tied_pair_trains_the_one_process_model(case: str, user_model: Path) -> None:
    """Every schedule and placement: losses equal a plain torch loop to 1e-9, every copy of the tied weight is equal
    (and equal to the loop's) at the end, and the report names the split pair once."""
    root = user_model / "ckpt"
    out = _train(user_model, [*CASES[case], "--checkpoint-dir", str(root), "--checkpoint-every", str(STEPS)])
    losses, weight = _reference(user_model)
    assert out["losses"] == pytest.approx(losses, rel=0, abs=1e-9)
    copies = _tied_copies(root, STEPS)
    assert len(copies) >= 2
    for copy in copies:
        assert torch.equal(copy, copies[0])
        torch.testing.assert_close(copy, weight, rtol=0, atol=1e-9)
    ((shared,),) = (out["shared_parameters"],)
    assert shared["name"] == "embed.weight" and shared["layer_names"] == ["embed", "head"]
    assert shared["stages"][0] == 0 and len(shared["stages"]) == 2 and shared["bytes_per_iteration"] == 11 * 6 * 8


@pytest.mark.slow
def test_a_resumed_run_keeps_the_copies_equal_and_the_losses_exact(user_model: Path) -> None:
    """Checkpointed at step 3 (its text report saying once which layers and stages share the weight) and resumed to
    step 6: the resumed steps' losses are the uninterrupted loop's and the copies stay equal."""
    root = user_model / "ckpt"
    args = ["--local", "2", "--schedule", "1f1b", "-p", "2", "-m", "2", "--checkpoint-dir", str(root), "--checkpoint-every",
            "3"]  # fmt: skip
    first = _run(user_model, [*args, "-q"], steps=3)
    assert [line for line in first.stdout.splitlines() if line.startswith("shared:")] == [
        "shared:    embed.weight is held by layers 0 (embed), 3 (head) on stages 0, 1: its gradient (528 bytes) is "
        "all-reduced over the 2 processes holding a copy [0, 1] every iteration"
    ]
    resumed = _train(user_model, [*args, "--resume"])
    assert resumed["start_step"] == 3
    losses, weight = _reference(user_model)
    assert resumed["losses"] == pytest.approx(losses[3:], rel=0, abs=1e-9)
    copies = _tied_copies(root, STEPS)
    assert len(copies) == 2 and torch.equal(copies[0], copies[1])
    torch.testing.assert_close(copies[0], weight, rtol=0, atol=1e-9)


@pytest.mark.slow
def test_pipemare_refuses_a_split_tied_pair_before_any_process_starts(user_model: Path) -> None:
    """--schedule pipemare on the tied model: exit 2, one line from the launcher naming the parameter."""
    env = {"PYTHONPATH": os.pathsep.join([str(user_model), SRC])}
    done = run_train(["--local", "2", "--module", "tiedlm:build", "--schedule", "pipemare", "-p", "2", "-m", "2",
                      "--steps", "2", "--batch-size", "8"], env=env, timeout=120)  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "rank " not in lines[0]
    assert lines[0].startswith("error: TrainConfigError: --schedule pipemare cannot split shared parameter embed.weight")
