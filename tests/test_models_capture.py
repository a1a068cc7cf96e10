"""Capturing stock models with torch.export (models.traced.capture, models.traced.capture_spec): layers along the module
hierarchy that compute exactly what the model computes, tied weights kept as one object."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from torch import nn  # noqa: E402

from hf_tiny import KINDS, SOURCE, build  # noqa: E402
from pipeplan.core.errors import ProfileError  # noqa: E402
from pipeplan.models.parameter_sharing import shared_parameters  # noqa: E402
from pipeplan.models.specs import spec_from_module  # noqa: E402
from pipeplan.models.traced.capture_nodes import BatchExpression  # noqa: E402
from pipeplan.models.traced.graph import GraphNet  # noqa: E402
from pipeplan.models.zoo.stock import call_model  # noqa: E402
from runtime_cli import BOOT  # noqa: E402

pytestmark = pytest.mark.torch

NAMES = {
    "gpt2": ("transformer.wte", "transformer.drop", "transformer.h.0", "transformer.h.1",
             "transformer.ln_f", "lm_head"),
    "bert": ("bert.embeddings", "bert.encoder.layer.0", "bert.encoder.layer.1", "cls"),
    "llama": ("model.embed_tokens", "model.layers.0", "model.layers.1", "model.norm", "lm_head"),
    "vit": ("vit.embeddings", "vit.layers.0", "vit.layers.1", "vit.layernorm", "classifier"),
    "resnet": ("resnet.embedder", "resnet.encoder.stages.0.layers.0",
               "resnet.encoder.stages.1.layers.0", "resnet.pooler", "classifier.0", "classifier.1"),
}  # fmt: skip


def _float64_input(spec: object, batch: int) -> torch.Tensor:
    x = spec.sample_input(batch)  # type: ignore[attr-defined]
    return x.double() if x.is_floating_point() else x


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_captured_layers_give_the_models_logits_and_gradients(kind: str) -> None:
    """For two batch sizes the layers composed give the model's own logits (1e-12), and the default loss's
    backward the model's own parameter gradients (1e-10), every parameter reached."""
    model = build(kind)
    spec = spec_from_module(model, kind)
    net = GraphNet(spec.layers, spec.layer_inputs)
    params = dict(model.named_parameters())
    for batch in (2, 5):
        x, y = _float64_input(spec, batch), spec.sample_target(batch)
        torch.testing.assert_close(net(x), call_model(model, x), rtol=0, atol=1e-12)
        model.zero_grad(set_to_none=True)
        spec.loss_fn(call_model(model, x), y).backward()
        expected = {name: p.grad.clone() for name, p in params.items() if p.grad is not None}
        model.zero_grad(set_to_none=True)
        spec.loss_fn(net(x), y).backward()
        got = {name: p.grad for name, p in params.items() if p.grad is not None}
        assert got.keys() == expected.keys() and len(got) == len(params)
        for name, grad in got.items():
            torch.testing.assert_close(grad, expected[name], rtol=0, atol=1e-10, msg=name)


@pytest.mark.parametrize("kind", sorted(NAMES))
def test_layers_are_the_models_modules(kind: str) -> None:
    """One layer per block and per top-level leaf, named by its path; layer 0 reads the input (GPT-2: n + 4)."""
    spec = spec_from_module(build(kind), kind)
    assert spec.layer_names == NAMES[kind]


@pytest.mark.parametrize(("kind", "embedding", "head"), [("gpt2", 0, 5), ("bert", 0, 3)])
def test_a_tied_weight_is_one_object_held_by_two_layers(kind: str, embedding: int, head: int) -> None:
    """GPT-2's lm_head / BERT's decoder weight is the embedding's own Parameter, in both layers."""
    model = build(kind)
    spec = spec_from_module(model, kind)
    (shared,) = shared_parameters(spec.layers, spec.layer_names)
    assert shared.layers == (embedding, head)
    tied = model.get_input_embeddings().weight
    for index in shared.layers:
        assert any(p is tied for p in spec.layers[index].parameters())
    held = {id(p) for layer in spec.layers for p in layer.parameters()}
    assert held == {id(p) for p in model.parameters()}  # every parameter, and no copy


def test_an_untied_llama_shares_nothing() -> None:
    """tie_word_embeddings=False: the head's weight is its own."""
    spec = spec_from_module(build("llama", tied=False), "llama")
    assert shared_parameters(spec.layers, spec.layer_names) == ()


def test_dropout_follows_each_layers_mode() -> None:
    """Exported in training mode with dropout 0.5, the layers in eval mode give the model's eval logits exactly,
    and in training mode they drop (the export fixed the mode; the layers read their own `training`)."""
    model = build("gpt2", dropout=0.5)
    spec = spec_from_module(model, "gpt2")
    net = GraphNet(spec.layers, spec.layer_inputs)
    x = spec.sample_input(3)
    model.eval()
    net.eval()
    torch.testing.assert_close(net(x), call_model(model, x), rtol=0, atol=0)
    net.train()
    assert not torch.equal(net(x), call_model(model, x))


def test_cast_captures_again_in_the_new_dtype() -> None:
    """A float32 capture cast to float64 is exported again: its graph's own casts follow (logits to 1e-12)."""
    model = build("llama").float()
    spec = spec_from_module(model, "llama").cast(torch.float64)
    assert all(p.dtype == torch.float64 for layer in spec.layers for p in layer.parameters())
    x = spec.sample_input(3)
    torch.testing.assert_close(GraphNet(spec.layers, spec.layer_inputs)(x), call_model(model, x), rtol=0, atol=1e-12)


class _DataDependent(nn.Module):
    """A forward whose branch depends on the input's values: neither fx nor the export can capture it."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        return y if bool(y.sum() > 0) else -y

    def sample_input(self, batch_size: int) -> torch.Tensor:
        return torch.ones(batch_size, 4)


def test_a_model_nothing_captures_gets_one_line_with_the_way_out() -> None:
    """Each capture's reason and the way out (a chain), in one line."""
    with pytest.raises(ProfileError) as caught:
        spec_from_module(_DataDependent(), "dd")
    message = str(caught.value)
    assert "\n" not in message
    assert "cannot be traced with torch.fx" in message and "cannot be captured with torch.export" in message
    assert "return an nn.Sequential or give the model a pipeline_layers() method" in message


class _Branchy(nn.Module):
    """No chain, no fx (a data-dependent Python assert), no sample input."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] != 4:
            raise ValueError("4 features")
        return self.lin(x)[:, : int(x.shape[1])]


def test_an_export_needs_a_sample_input() -> None:
    """Without a sample input the export cannot run: the error says how to give one."""
    with pytest.raises(ProfileError, match=r"to capture it with torch.export give the module a sample_input"):
        spec_from_module(_Branchy(), "branchy")


CUTS = {
    "llama": (["model.embed_tokens", "model.layers.0"], ["model.layers.1", "model.norm", "lm_head"]),
    "vit": (["vit.embeddings", "vit.layers.0"], ["vit.layers.1", "vit.layernorm", "classifier"]),
}
OPTIONS = {"llama": ["--opt", "kind=llama", "--opt", "tied=false"], "vit": ["--opt", "kind=vit"]}


def _cli(args: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`pipeplan ARGS` in a fresh interpreter in `cwd`, with `cwd` (the user's folder) on the import path."""
    path = os.pathsep.join([str(cwd), os.environ.get("PYTHONPATH", "")])
    argv = [sys.executable, "-c", BOOT, *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=cwd, env={**os.environ, "PYTHONPATH": path})


def _write_plan(folder: Path, stages: tuple[list[str], list[str]]) -> Path:
    """A 1f1b plan of 4 microbatches of 8 over the two stages (layer names), stage s on CPU s."""
    cluster = {"format": "pipeplan.cluster/1", "name": "two-cpus", "devices": [{"kind": "cpu", "memory_gb": 4}] * 2,
               "bandwidth_gb_per_s": [[0, 1], [1, 0]], "latency_us": [[0, 10], [10, 0]]}  # fmt: skip
    (folder / "cluster.json").write_text(json.dumps(cluster))
    entries, first = [], 0
    for s, names in enumerate(stages):
        entries.append({"devices": [s], "first_layer": first, "last_layer": first + len(names) - 1, "layers": names})
        first += len(names)
    plan = {"format": "pipeplan.plan/1", "profile": "profile.json", "cluster": "cluster.json", "schedule": "1f1b",
            "pipeline_replicas": 1, "microbatches": 4, "microbatch_size": 8, "k": 1, "chunks": 1, "order": None,
            "stages": entries}  # fmt: skip
    (folder / "plan.json").write_text(json.dumps(plan))
    return folder / "plan.json"


def _one_process_losses(kind: str, steps: int, lr: float) -> list[float]:
    """The stock model trained by a plain torch loop on train's samples: 4 microbatches of 8 per step, Adam, float64;
    the loss written out here (next-token or class cross-entropy: HF's own, which computes it in float32)."""
    from pipeplan.models.zoo.datasets import batch_indices
    from pipeplan.models.zoo.stock import hf_defaults

    model = build(kind, tied=False) if kind == "llama" else build(kind)
    defaults = hf_defaults(model)
    assert defaults is not None
    inputs, targets = defaults.sample_input(1024), defaults.sample_target(1024)
    inputs = inputs.double() if inputs.is_floating_point() else inputs
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for step in range(steps):
        rows = batch_indices(len(inputs), 32, step, 0)
        x, y = inputs[rows], targets[rows]
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for lo in range(0, 32, 8):
            logits, labels = model(x[lo : lo + 8]).logits, y[lo : lo + 8]
            if kind == "llama":  # position t predicts token t + 1
                logits, labels = logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1)
            loss = torch.nn.functional.cross_entropy(logits, labels) * (8 / 32)
            loss.backward()
            total += float(loss.detach())
        optimizer.step()
        losses.append(total)
    return losses


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(CUTS))
def test_a_stock_model_profiles_and_trains_on_two_processes_as_on_one(kind: str, tmp_path: Path) -> None:
    """`pipeplan profile user_mod:build` of the unmodified HF model, then `train --local 2` of a plan cutting it in
    two stages, in float64: the losses of a plain torch loop of the model itself on the same samples."""
    (tmp_path / "user_mod.py").write_text(SOURCE)
    profiled = _cli(["profile", "user_mod:build", *OPTIONS[kind], "-b", "4", "--batch-sizes", "2,4", "-o",
                     "profile.json", "--runs", "1", "--warmup", "0", "-q"], tmp_path)  # fmt: skip
    assert profiled.returncode == 0, profiled.stderr
    layers = [row["name"] for row in json.loads((tmp_path / "profile.json").read_text())["layers"]]
    assert layers == [*CUTS[kind][0], *CUTS[kind][1]]
    plan = _write_plan(tmp_path, CUTS[kind])
    trained = _cli(["train", "--plan", str(plan), "--module", "user_mod:build", "--local", "2", "--steps", "3",
                    "--lr", "0.01", "--dtype", "float64", "--json"], tmp_path, timeout=600)  # fmt: skip
    assert trained.returncode == 0, trained.stderr
    losses = json.loads(trained.stdout)["losses"]
    assert losses == pytest.approx(_one_process_losses(kind, 3, 0.01), rel=1e-9, abs=1e-12)


class _Fold(nn.Module):
    """Folds the sequence into the batch and back: sizes the export writes as 3 * batch."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x.reshape(x.shape[0] * x.shape[1], 4)).reshape(x.shape[0], x.shape[1], 4)


class _Folded(nn.Module):
    """Blocks that fold sizes, behind a shape check fx cannot trace."""

    def __init__(self) -> None:
        super().__init__()
        self.stack = nn.ModuleList([_Fold(), _Fold()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] != 3:
            raise ValueError("3 positions")
        return self.stack[1](self.stack[0](x) + 1).sum(dim=1)

    def sample_input(self, batch_size: int) -> torch.Tensor:
        return torch.randn(batch_size, 3, 4)


def test_sizes_made_from_the_batch_follow_each_microbatch() -> None:
    """A size the export writes as 3 * batch is evaluated from each call's batch: batches 1, 2 and 7 run exactly."""
    net = _Folded()
    spec = spec_from_module(net, "folded")
    assert spec.layer_names == ("stack.0", "stack.1", "sum_1")  # the add joins its one reader; the sum is the output
    assert any(isinstance(m, BatchExpression) for layer in spec.layers for m in layer.modules())
    whole = GraphNet(spec.layers, spec.layer_inputs)
    for batch in (1, 2, 7):
        x = torch.randn(batch, 3, 4)
        torch.testing.assert_close(whole(x), net(x), rtol=0, atol=0)


class _Pair(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x * 2, x * 3


class _TwoOut(nn.Module):
    """A block that passes two tensors to two later layers."""

    def __init__(self) -> None:
        super().__init__()
        self.stack = nn.ModuleList([_Pair(), nn.Linear(4, 4), nn.Linear(4, 4)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] != 4:
            raise ValueError("4 features")
        a, b = self.stack[0](x)
        return self.stack[1](a) + self.stack[2](b)

    def sample_input(self, batch_size: int) -> torch.Tensor:
        return torch.randn(batch_size, 4)


def test_a_module_that_passes_two_tensors_on_is_refused_with_the_way_out() -> None:
    """Each layer passes one tensor: a block whose two outputs go to two layers is named, with the way out."""
    with pytest.raises(ProfileError, match=r"layer 'stack.0' passes 2 values \(mul, mul_1\) to other layers.*pipeline_layers"):
        spec_from_module(_TwoOut(), "two")


def test_batch_norm_follows_each_layers_mode() -> None:
    """ResNet's batch norms in eval mode use and keep their running statistics (no step counted), as the model's
    own do; in training mode they update them as the model does."""
    model = build("resnet")
    spec = spec_from_module(model, "resnet")
    net = GraphNet(spec.layers, spec.layer_inputs)
    norm = model.resnet.embedder.embedder.normalization
    x = spec.sample_input(4).double()
    net.train()
    net(x)
    assert int(norm.num_batches_tracked) == 1
    before = norm.running_mean.clone()
    model.eval()
    net.eval()
    torch.testing.assert_close(net(x), call_model(model, x), rtol=0, atol=1e-12)
    assert int(norm.num_batches_tracked) == 1 and torch.equal(norm.running_mean, before)


class _PadMask(nn.Module):
    """Embeds its ids and masks the padding read from the same ids in a later block: the ids feed two layers."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.stack = nn.ModuleList([nn.Linear(4, 4)])

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if ids.dim() != 2:
            raise ValueError("ids")
        return self.stack[0](self.embed(ids)) * (ids != 0).unsqueeze(-1)

    def sample_input(self, batch_size: int) -> torch.Tensor:
        return torch.arange(batch_size * 3).reshape(batch_size, 3) % 10


def test_integer_ids_read_by_two_layers_are_refused_at_capture() -> None:
    """Ids would have to cross a cut to reach the second reader: refused when captured, naming both layers."""
    with pytest.raises(ProfileError, match=r"reads its torch.int64 input in 2 layers \(embed, mul\): only floating"):
        spec_from_module(_PadMask(), "pad")
