"""Tests of api.distributed: docs/api.md's torchrun script on 2 gloo processes gives a plain torch loop's losses,
gradient norms and model, a state saved under one plan goes on under others, and a model the plan was not made for
is refused in one line before any process group is joined."""

from __future__ import annotations

import dataclasses
import json
import re
import runpy
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import torch
from torch import nn

from pipeplan import api
from pipeplan.core.errors import PlanError, TrainConfigError
from pipeplan.core.plan import Plan, Stage
from pipeplan.io.plan_json import write_plan
from pipeplan.models.specs import spec_from_module

pytestmark = pytest.mark.torch

ROOT = Path(__file__).resolve().parents[1]
TOLERANCE = 1e-9
PLANS = {
    "two-stages.json": Plan((Stage(0, 2, (0,)), Stage(3, 4, (1,))), 1, 4, 2, "1f1b"),
    "one-process.json": Plan((Stage(0, 4, (0,)),), 1, 2, 4, "gpipe"),
    "two-replicas.json": Plan((Stage(0, 4, (0, 1)),), 1, 2, 4, "1f1b"),
}
"""Three plans of the script's 5-layer model at a global batch of 8."""


def _script(folder: Path) -> Path:
    """docs/api.md's torchrun script, written into `folder`."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "api.md").read_text(), re.S)
    (text,) = [block for block in blocks if "pipeplan.distribute(" in block]
    path = folder / "train_pipeline.py"
    path.write_text(text)
    return path


def _plain(model: nn.Module, loader: Any, steps: int) -> list[dict[str, float]]:
    """The script's training as a plain torch loop in this process: its losses, gradient norms and rates."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    out: list[dict[str, float]] = []
    while len(out) < steps:
        for inputs, targets in loader:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(inputs), targets)
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            optimizer.step()
            scheduler.step()
            out.append({"loss": float(loss.detach()), "grad_norm": float(norm), "lr": scheduler.get_last_lr()[0]})
            if len(out) == steps:
                break
    return out


def _log(path: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _close(got: list[dict[str, float]], want: list[dict[str, float]]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert abs(g["loss"] - w["loss"]) <= TOLERANCE and abs(g["grad_norm"] - w["grad_norm"]) <= TOLERANCE
        assert g["lr"] == w["lr"]


@pytest.mark.slow
def test_the_documented_script_trains_as_a_plain_loop_under_every_plan(tmp_path: Path) -> None:
    """2 stages on 2 processes: the plain loop's losses and clipped norms (float64, 1e-9); its saved state is the
    plain model's and goes on, loaded on 1 process and on 2 data-parallel replicas, as the plain loop goes on."""
    from pipeplan.runtime.training.launch import launch_local, run_file

    script = _script(tmp_path)
    for name, plan in PLANS.items():
        write_plan(plan, tmp_path / name, "model", "local")
    code = run_file(str(script))
    assert launch_local(2, code, ["two-stages.json", "--steps", "6", "--log", "a.jsonl", "--save", "a.pt"],
                        cwd=str(tmp_path), timeout_s=240) == 0  # fmt: skip
    assert launch_local(1, code, ["one-process.json", "--steps", "3", "--log", "b.jsonl", "--load", "a.pt"],
                        cwd=str(tmp_path), timeout_s=240) == 0  # fmt: skip
    assert launch_local(2, code, ["two-replicas.json", "--steps", "3", "--log", "c.jsonl", "--load", "a.pt"],
                        cwd=str(tmp_path), timeout_s=240) == 0  # fmt: skip

    ns = runpy.run_path(str(script), run_name="reference")
    model = ns["build_model"]()
    first = _plain(model, ns["data_loader"](8), 6)
    assert any(step["grad_norm"] > 0.5 for step in first) and any(step["grad_norm"] < 0.5 for step in first)
    _close(_log(tmp_path / "a.jsonl"), first)
    saved = torch.load(tmp_path / "a.pt")
    assert list(saved) == list(model.state_dict())
    for key, value in model.state_dict().items():
        assert torch.allclose(saved[key], value, rtol=0, atol=TOLERANCE)
    then = _plain(model, ns["data_loader"](8), 3)
    _close(_log(tmp_path / "b.jsonl"), then)
    _close(_log(tmp_path / "c.jsonl"), then)


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3)).double()


def test_a_model_the_plan_was_not_made_for_is_refused_before_the_group(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another layer count, or other layer names than the profile's, is one PlanError line; outside torchrun, a
    model that fits is refused by the launcher's variables (so the checks came first)."""
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    plan = Plan((Stage(0, 1, (0,)), Stage(2, 3, (1,))), 1, 2, 2, "1f1b")
    with pytest.raises(PlanError, match=r"^model Sequential has 3 layers \(0-linear, 1-tanh, 2-linear\) but the plan's "
                       r"stages cover 4: the plan was made for another model"):  # fmt: skip
        api.distribute(_model(), plan, nn.functional.cross_entropy)
    fits = Plan((Stage(0, 1, (0,)), Stage(2, 2, (1,))), 1, 2, 2, "1f1b")
    alexnet = api.load_profile("pipedream/alexnet")  # its first 3 layers: other names than the model's
    profile = dataclasses.replace(alexnet, name="three", layers=alexnet.layers[:3], cut_bytes=alexnet.cut_bytes[:2],
                                  layer_inputs=None)  # fmt: skip
    with pytest.raises(PlanError, match=r"^model Sequential layer 0 is '0-linear' but profile 'three' names it "
                       r"'node1:Input': the plan was made for another model"):  # fmt: skip
        api.distribute(_model(), fits, nn.functional.cross_entropy, profile=profile)
    with pytest.raises(TrainConfigError, match=r"^pipeplan.distribute must run under torchrun .*\(missing RANK"):
        api.distribute(_model(), fits, nn.functional.cross_entropy)


@pytest.mark.usefixtures("one_process")
def test_one_process_gives_the_plain_models_gradient_state_and_refusals() -> None:
    """On one process: the step's loss and clipped gradients are the plain model's; state_dict is its state_dict;
    a wrong batch, a bad max_norm and another model's state are one PlanError line each."""
    plan = Plan((Stage(0, 2, (0,)),), 1, 3, 2, "gpipe")
    model, reference = _model(), _model()
    pipe = api.distribute(model, plan, nn.functional.cross_entropy)
    assert (pipe.rank, pipe.world_size, pipe.stages, pipe.replica, pipe.is_first_stage, pipe.is_last_stage) == (
        0, 1, (0,), 0, True, True)  # fmt: skip
    inputs, targets = torch.randn(6, 4, dtype=torch.float64), torch.tensor([0, 1, 2, 0, 1, 2])
    loss = pipe.step(inputs, targets)
    norm = pipe.clip_grad_norm_(0.01)
    want = nn.functional.cross_entropy(reference(inputs), targets)
    want.backward()
    want_norm = torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.01)
    assert abs(loss - float(want.detach())) <= TOLERANCE and abs(norm - float(want_norm)) <= TOLERANCE
    for p, q in zip(pipe.parameters(), reference.parameters(), strict=True):
        assert p.grad is not None and q.grad is not None and torch.allclose(p.grad, q.grad, rtol=0, atol=TOLERANCE)
    state = pipe.state_dict()
    assert list(state) == list(reference.state_dict()) and all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    with pytest.raises(PlanError, match=r"^inputs must be a tensor of the plan's global batch \(6 samples\), got 5 samples$"):
        pipe.step(inputs[:5], targets[:5])
    with pytest.raises(PlanError, match=r"^max_norm must be a finite number >= 0, got nan$"):
        pipe.clip_grad_norm_(float("nan"))
    with pytest.raises(PlanError, match=r"^state holds 3 entries but the model's state_dict 4: missing '2.bias', "):
        pipe.load_state_dict({k: v for k, v in state.items() if k != "2.bias"})
    state["0.weight"] = torch.zeros(2, 2)
    with pytest.raises(PlanError, match=r"^state\['0.weight'\] is \(2, 2\) but the model's is \(8, 4\)"):
        pipe.load_state_dict(state)


class _Residual(nn.Module):
    """A graph (a skip connection around two linear layers), not a chain: distribute traces it as profile does."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inner, self.outer, self.head = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.outer(torch.tanh(self.inner(x)))) + x)

    def sample_input(self, batch_size: int) -> torch.Tensor:
        return torch.zeros(batch_size, 4, dtype=torch.float64)


@pytest.mark.usefixtures("one_process")
def test_a_traced_graph_runs_and_keeps_its_own_state_dict_keys() -> None:
    """A branching model's traced layers run the plan and give the plain module's loss; its state_dict keys are the
    module's own (`inner.weight`, ...), not the traced layers'."""
    model, reference = _Residual().double(), _Residual().double()
    layers = len(spec_from_module(model).layers)  # the traced nodes, the input among them
    pipe = api.distribute(model, Plan((Stage(0, layers - 1, (0,)),), 1, 2, 3, "1f1b"), nn.functional.cross_entropy)
    inputs, targets = torch.randn(6, 4, dtype=torch.float64), torch.tensor([0, 1, 2, 0, 1, 2])
    want = nn.functional.cross_entropy(reference(inputs), targets).detach()
    assert abs(pipe.step(inputs, targets) - float(want)) <= TOLERANCE
    assert list(pipe.state_dict()) == list(reference.state_dict())


def _next_token_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1))


@pytest.mark.usefixtures("one_process")
def test_a_stock_hugging_face_model_is_captured_on_its_own_sample() -> None:
    """An unmodified transformers GPT-2 (tied head, no sample_input method) is exported on the sample its config
    gives (16 tokens), as `pipeplan profile` captures it (before, distribute asked the model for a sample_input
    method): its step is the plain model's loss and its state_dict keys are the model's own. Samples of another
    length are refused in one line (the export computed its sizes from 16 tokens: 8-token batches gave 16 positions);
    a sample_input attribute of their shape captures it on them."""
    pytest.importorskip("transformers")
    from hf_tiny import build

    plan = Plan((Stage(0, 5, (0,)),), 1, 2, 2, "1f1b")
    model, reference = build("gpt2"), build("gpt2")
    pipe = api.distribute(model, plan, _next_token_loss)
    ids = torch.randint(0, 100, (4, 16), generator=torch.Generator().manual_seed(0))
    want = _next_token_loss(reference(ids).logits, ids).detach()
    assert abs(pipe.step(ids, ids) - float(want)) <= TOLERANCE
    assert list(pipe.state_dict()) == list(reference.state_dict())
    with pytest.raises(PlanError, match=r"^inputs have shape \(4, 8\) but the model was captured with torch.export on "
                       r"inputs of shape \(4, 16\) \(only the batch dimension may vary\)"):  # fmt: skip
        pipe.step(ids[:, :8], ids[:, :8])
    model = build("gpt2")
    model.sample_input = lambda batch_size: torch.zeros(batch_size, 8, dtype=torch.long)
    pipe = api.distribute(model, plan, _next_token_loss)
    want = _next_token_loss(build("gpt2")(ids[:, :8]).logits, ids[:, :8]).detach()
    assert abs(pipe.step(ids[:, :8], ids[:, :8]) - float(want)) <= TOLERANCE
