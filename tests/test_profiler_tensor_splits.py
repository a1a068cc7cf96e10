"""profiler.tensor_splits: the profiler marks the blocks the runtime splits (zoo encoder layers, a captured Llama
decoder layer) with kind "block" and the gcd of what a tp must divide, nothing else, nothing in a model with a tied
weight; and a profile so marked plans tensor-parallel stages that `train` runs (its checks pass, no refusal)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from cli_runner import run  # noqa: E402
from pipeplan.core.layer_profile import TensorSplit  # noqa: E402
from pipeplan.models.traced import split_graph  # noqa: E402
from pipeplan.profiler.measure import measure_layers  # noqa: E402
from pipeplan.profiler.tensor_splits import layer_splits  # noqa: E402

pytestmark = pytest.mark.torch

LLAMA = """
import torch
import transformers


def llama():
    config = transformers.LlamaConfig(vocab_size=96, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=24, max_position_embeddings=8,
                                      tie_word_embeddings=False, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    return transformers.LlamaForCausalLM(config)
"""
"""A Llama of 4 heads, 2 key/value heads and 24 hidden units: a tp must divide gcd(4, 2, 24) = 2."""


def _splits(layers: list[nn.Module], x: torch.Tensor) -> tuple[TensorSplit | None, ...]:
    """layer_splits of a chain of layers on input x (each layer's input the previous one's output)."""
    inputs = []
    with torch.no_grad():
        for layer in layers:
            inputs.append(x)
            x = layer(x)
    return layer_splits(layers, [str(i) for i in range(len(layers))], inputs)


def test_zoo_encoder_layers_are_blocks_of_the_gcd_of_heads_and_hidden_and_nothing_else_is() -> None:
    """An embedding, two encoder layers (6 heads, 64 hidden units: t | 2) and a head: the layers are block 2, the
    others None; an encoder layer of 4 heads and 32 hidden units is block 4. Each names its norms' bytes: a weight and
    a bias of 24 float32 values (what sequence parallelism all-reduces)."""
    embed, head = nn.Embedding(10, 24), nn.Linear(24, 10)
    blocks = [nn.TransformerEncoderLayer(24, 6, 64, dropout=0.0, batch_first=True) for _ in range(2)]
    ids = torch.randint(0, 10, (2, 5))
    norm = 2 * 24 * 4
    block2 = TensorSplit("block", 2, norm_bytes=norm)
    assert _splits([embed, *blocks, head], ids) == (None, block2, block2, None)
    four = nn.TransformerEncoderLayer(24, 4, 32, dropout=0.0, batch_first=True)
    assert _splits([four], torch.randn(2, 5, 24)) == (TensorSplit("block", 4, norm_bytes=norm),)


def test_a_model_with_a_tied_weight_marks_nothing() -> None:
    """An embedding and a head sharing one weight around a block: no layer is marked (train refuses a tied weight
    on a tp stage, and the planner gives every stage one tp)."""
    embed, head = nn.Embedding(10, 16), nn.Linear(16, 10, bias=False)
    head.weight = embed.weight
    block = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True)
    assert _splits([embed, block, head], torch.randint(0, 10, (2, 5))) == (None, None, None)


@pytest.fixture
def user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The user's folder, importable, holding my_llama.py and a cluster of 4 CPUs on one server."""
    (tmp_path / "my_llama.py").write_text(LLAMA)
    cluster = {"format": "pipeplan.cluster/1", "name": "cpus-4", "devices": [{"kind": "cpu", "memory_gb": 4}] * 4,
               "bandwidth_gb_per_s": [[0 if i == j else 1 for j in range(4)] for i in range(4)],
               "latency_us": [[0 if i == j else 10 for j in range(4)] for i in range(4)]}  # fmt: skip
    (tmp_path / "cpus-4.json").write_text(json.dumps(cluster))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.slow
def test_a_captured_llama_is_marked_and_not_when_its_split_does_not_follow(user: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The captured Llama's decoder layers are block 2 (gcd of 4 heads, 2 key/value heads, 24 hidden units), its
    embedding, norm and head None; each block's norm_bytes is one RMSNorm weight (16 float64 elements: the two norms'
    weights are the only parameters no TP rank shards, which sequence parallelism all-reduces); with the head-count
    rewrite broken its blocks fail the split check and are not
    marked."""
    from pipeplan.models.build import build_model

    built = build_model("my_llama:llama", {}, "auto", "float64", 0)
    spec = built.chain_spec()
    marks = [layer.tp for layer in measure_layers(spec, None, 2, runs=0, whole=False).to_profile("llama").layers]
    assert marks == [None, TensorSplit("block", 2, norm_bytes=16 * 8), TensorSplit("block", 2, norm_bytes=16 * 8), None, None]
    monkeypatch.setattr(split_graph, "_local_sizes", lambda sizes, block, tp: sizes)
    marks = [layer.tp for layer in measure_layers(spec, None, 2, runs=0, whole=False).to_profile("llama").layers]
    assert marks == [None] * 5


@pytest.mark.slow
@pytest.mark.parametrize(("module", "options"), [("charlm", ["--opt", "d_model=16", "--opt", "heads=4"]),
                                                 ("my_llama:llama", [])])  # fmt: skip
def test_a_marked_profile_plans_tensor_parallel_stages_train_runs(
    user: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], module: str, options: list[str]
) -> None:
    """profile (float64) -> plan on 4 CPUs of one server at tp 2 (forced: the measured times decide whether tp wins),
    its ZeRO stage the planner's -> train --plan: the plan has tp 2 stages (its stages, cuts, schedule and sharding
    the planner's), and train's every check passes (exit 0, its launcher called with 4 processes)."""
    from pipeplan.runtime.training import launch

    code, _, err = run(monkeypatch, capsys, "profile", module, *options, "-b", "4", "--batch-sizes", "2,4", "--runs", "1",
                       "--warmup", "0", "--dtype", "float64", "-o", "profile.json", "-q")  # fmt: skip
    assert code == 0, err
    code, _, err = run(monkeypatch, capsys, "plan", "--profile", "profile.json", "--cluster", "cpus-4.json",
                       "--global-batch", "8", "--tensor-parallel", "2", "--out", "plan.json")  # fmt: skip
    assert code == 0, err
    plan = json.loads((user / "plan.json").read_text())
    assert max(stage.get("tp", 1) for stage in plan["stages"]) == 2, plan
    started: list[int] = []
    monkeypatch.setattr(launch, "launch_local", lambda nprocs, *args, **kwargs: started.append(nprocs) or 0)
    code, _, err = run(monkeypatch, capsys, "train", "--local", "4", "--plan", "plan.json", "--module", module, *options,
                       "--dtype", "float64", "--steps", "1", "--no-predict")  # fmt: skip
    assert (code, started) == (0, [4]), err
