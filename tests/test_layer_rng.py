"""Randomness that does not depend on the plan (models.layer_rng): dropout on, float64, every split, schedule,
pipeline replica count and number of ranks gives the losses of a plain loop that seeds each layer call by the
documented formula (docs/architecture.md, "Randomness")."""

from __future__ import annotations

import hashlib
import json

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from pipeplan import api  # noqa: E402
from pipeplan.core.plan import Plan, Stage  # noqa: E402
from pipeplan.models.build import Model, build_model  # noqa: E402
from pipeplan.models.layer_rng import LayerSeeding, RngKey, layer_seed  # noqa: E402
from pipeplan.models.stage import StageModule  # noqa: E402
from pipeplan.models.traced.graph_stage import GraphStage  # noqa: E402
from pipeplan.models.zoo.datasets import batch_indices  # noqa: E402
from runtime_cli import run_train  # noqa: E402

pytestmark = pytest.mark.torch

OPTIONS = {"d_model": "8", "heads": "2", "layers": "3", "seq_len": "4", "ffn": "16", "dropout": "0.1"}
"""The built-in transformer, tiny, dropout on: 3 encoder blocks and a LayerNorm (4 layers)."""
SEED, BATCH, MICROBATCH, STEPS, LR = 3, 8, 4, 2, 0.1


def documented_seed(run_seed: int, step: int, first_sample: int, layer: int) -> int:
    """The seed of one layer call as docs/architecture.md states it (written out here, not imported)."""
    text = f"{run_seed}:{step}:{first_sample}:{layer}".encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "big") >> 1


def tiny_model() -> Model:
    return build_model("transformer", dict(OPTIONS), "sample", "float64", SEED)


def plain_losses(model: Model, seeded: bool = True) -> list[float]:
    """Plain torch: each step's global batch in microbatches of MICROBATCH, every layer called after
    torch.manual_seed(documented_seed(...)) (or, unseeded, drawing from the generator as it goes), SGD."""
    layers, data = model.layers, model.dataset
    optimizer = torch.optim.SGD([p for layer in layers for p in layer.parameters()], lr=LR)
    torch.manual_seed(12345)
    losses = []
    for step in range(STEPS):
        idx = batch_indices(len(data), BATCH, step, SEED)
        x, y = data.inputs[idx], data.targets[idx]
        total = 0.0
        for first in range(0, BATCH, MICROBATCH):
            h = x[first : first + MICROBATCH]
            for i, layer in enumerate(layers):
                if seeded:
                    torch.manual_seed(documented_seed(SEED, step, first, i))
                h = layer(h)
            loss = model.loss_fn(h, y[first : first + MICROBATCH]) * MICROBATCH / BATCH
            loss.backward()
            total += loss.item()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(total)
    return losses


def pipeline_losses(plan: Plan) -> list[float]:
    """The same training through pipeplan.pipeline() (one process, the plan's schedule)."""
    model = tiny_model()
    optimizer = torch.optim.SGD([p for layer in model.layers for p in layer.parameters()], lr=LR)
    pipe = api.pipeline(model.layers, plan, model.loss_fn, seed=SEED)
    losses = []
    for step in range(STEPS):
        idx = batch_indices(len(model.dataset), BATCH, step, SEED)
        losses.append(pipe.step(model.dataset.inputs[idx], model.dataset.targets[idx]))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return losses


PLANS = {
    "1f1b 2+2": Plan((Stage(0, 1, (0,)), Stage(2, 3, (1,))), 1, 2, MICROBATCH, "1f1b"),
    "gpipe 1+3": Plan((Stage(0, 0, (0,)), Stage(1, 3, (1,))), 1, 2, MICROBATCH, "gpipe"),
    "zb-h1 3+1": Plan((Stage(0, 2, (0,)), Stage(3, 3, (1,))), 1, 2, MICROBATCH, "zb-h1"),
    "interleaved 4 chunks": Plan(tuple(Stage(i, i, (i % 2,)) for i in range(4)), 1, 2, MICROBATCH, "interleaved-1f1b", chunks=2),
    "2 pipeline replicas": Plan((Stage(0, 1, (0, 2)), Stage(2, 3, (1, 3))), 2, 1, MICROBATCH, "1f1b"),
}


def test_the_seed_is_the_documented_formula() -> None:
    cases = [(0, 0, 0, 0), (3, 1, 4, 2), (2**40, 10**6, 12345, 999)]
    assert [layer_seed(*c) for c in cases] == [documented_seed(*c) for c in cases]
    assert all(0 <= layer_seed(*c) < 2**63 for c in cases)
    assert len({layer_seed(0, 0, first, layer) for first in range(50) for layer in range(50)}) == 2500


def test_seeding_restores_the_callers_generator() -> None:
    """Draws inside the block are the seeded ones; after it the caller's stream goes on as if none were drawn."""
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    with LayerSeeding(RngKey(1, 2, 3), torch.device("cpu")) as seeding:
        seeding.seed(4)
        inside = torch.rand(2)
    assert torch.equal(torch.rand(3), expected)
    torch.manual_seed(documented_seed(1, 2, 3, 4))
    assert torch.equal(torch.rand(2), inside)


@pytest.mark.parametrize("name", list(PLANS))
def test_pipeline_losses_equal_the_plain_seeded_loop(name: str) -> None:
    """pipeline() under every schedule, split and pipeline replica count: the plain loop's losses to 1e-9, with
    dropout on (and the plain loop without the per-layer seeds differs: the dropout masks matter here)."""
    expected = plain_losses(tiny_model())
    assert pipeline_losses(PLANS[name]) == pytest.approx(expected, abs=1e-9)
    assert plain_losses(tiny_model(), seeded=False) != pytest.approx(expected, abs=1e-6)


def test_pipeline_leaves_the_callers_generator_as_it_was() -> None:
    torch.manual_seed(11)
    expected = torch.rand(4)
    torch.manual_seed(11)
    pipeline_losses(PLANS["1f1b 2+2"])
    assert torch.equal(torch.rand(4), expected)


def test_stages_on_their_own_processes_draw_alike_at_any_cut_only_with_a_key() -> None:
    """The seeding is what makes the cut not matter: each stage runs as on its own process (torch's generator
    seeded by its rank first, as `train` seeds each rank); the same layers cut 1+3 and 2+2 give the same output with
    a key, and different outputs without one."""
    model = tiny_model()
    x = model.dataset.inputs[:MICROBATCH]
    outputs = {}
    for cut in (1, 2):
        parts = [range(0, cut), range(cut, 4)]
        for keyed in (True, False):
            h = x
            for rank, ids in enumerate(parts):
                stage = StageModule(rank, [model.layers[i] for i in ids], rank == 0, False, False, ids)
                torch.manual_seed(SEED * 7919 + rank)
                h = stage.forward(0, h, None, None, 1.0, RngKey(SEED, 0, 0) if keyed else None).detach()
            outputs[(cut, keyed)] = h
    assert torch.allclose(outputs[(1, True)], outputs[(2, True)], rtol=0, atol=1e-12)
    assert not torch.allclose(outputs[(1, False)], outputs[(2, False)], rtol=0, atol=1e-6)


class _DropBranches(nn.Module):
    """A small graph with dropout on both branches of a diamond (torch.fx traces it into layers)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(5)
        self.a, self.b, self.c = nn.Linear(6, 6), nn.Linear(6, 6), nn.Linear(6, 6)
        self.drop1, self.drop2 = nn.Dropout(0.3), nn.Dropout(0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        return self.c(self.drop1(self.b(h)) + self.drop2(h))


@pytest.mark.parametrize("order", [[0, 1, 2, 3, 4, 5, 6], [0, 1, 4, 2, 3, 5, 6]])
def test_graph_stages_draw_what_the_plain_graph_draws_at_every_cut(order: list[int]) -> None:
    """GraphStage: a diamond with dropout on both branches, cut into two stages at every position of two layer
    orders, gives the loss of the plain graph walk that seeds each layer by its index in the model."""
    from pipeplan.models.traced.graph import LayerGraph, trace_layers

    layers, names, inputs = trace_layers(_DropBranches().double(), "drop-branches")
    assert len(layers) == 7 and inputs[5] == (3, 4)  # x, a, b, drop1, drop2, add, c
    x = torch.randn(4, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    weight = torch.randn(4, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    graph = LayerGraph.measure(layers, inputs, names, x)
    values: list[torch.Tensor] = []
    for i, layer in enumerate(layers):
        torch.manual_seed(documented_seed(SEED, 1, 8, i))
        values.append(layer(*(values[s] for s in inputs[i])) if inputs[i] else layer(x))
    expected = float((values[-1] * weight).sum().detach())
    key = RngKey(SEED, 1, 8)
    for cut in range(len(order) - 1):
        first = GraphStage(0, layers, graph, order, 0, cut, False, False)
        last = GraphStage(1, layers, graph, order, cut + 1, len(order) - 1, True, False)
        middle = first.forward(0, x, None, None, 1.0, key)
        loss = last.forward(0, middle.detach(), weight, lambda o, t: (o * t).sum(), 1.0, key)
        assert float(loss.detach()) == pytest.approx(expected, abs=1e-12), cut


@pytest.mark.slow
def test_train_local_losses_equal_the_plain_seeded_loop_on_any_plan() -> None:
    """`train --local` with dropout on, float64: 2 ranks 1F1B (layers 2+2, the adaptive runtime's kfkb at k=1),
    3 ranks ZB-H1 (2+1+1), 2 pipeline replicas of one stage under GPipe, and PipeMare's walk over every step at
    once (all synchronous: its rows are several steps' batches) all give the plain seeded loop's per-step losses
    to 1e-9."""
    common = ["--module", "transformer", *(f"--opt={k}={v}" for k, v in OPTIONS.items()), "--dtype", "float64",
              "-b", str(BATCH), "--steps", str(STEPS), "--optimizer", "sgd", "--lr", str(LR), "--seed", str(SEED),
              "--json", "-q"]  # fmt: skip
    runs = {
        "2 ranks 1f1b (kfkb k=1), adaptive": ["--local", "2", "--schedule", "kfkb", "--k", "1", "--adaptive", "-p", "2",
                                              "-m", "2"],
        "3 ranks zb-h1": ["--local", "3", "--schedule", "zb-h1", "-p", "3", "-m", "2"],
        "2 replicas gpipe": ["--local", "2", "--schedule", "gpipe", "-p", "1", "-m", "1"],
        "2 ranks pipemare, all synchronous": ["--local", "2", "--schedule", "pipemare", "-p", "2", "-m", "2",
                                              "--sync-warmup", str(STEPS)],
    }  # fmt: skip
    expected = plain_losses(tiny_model())
    for name, args in runs.items():
        done = run_train([*args, *common], timeout=600)
        assert done.returncode == 0, f"{name}: {done.stderr}"
        assert json.loads(done.stdout)["losses"] == pytest.approx(expected, abs=1e-9), name
