"""Which measured layers split over a tensor-parallel group, marked as the runtime splits them (issue 34).

A layer is marked `TensorSplit("block", width)` (core.layer_profile) when `pipeplan train` splits it on a stage
with tp > 1: a zoo encoder layer (models.tp_block) and a captured Llama-style decoder layer
(models.traced.split_graph). `width` is what every tp must divide: the gcd of the block's attention heads, its
key/value heads (a captured block's) and its MLP hidden size, so the planner (planner.plan_space.tensor_degrees)
offers no degree the runtime refuses for these counts. A captured block is also run split, on its measured input,
for every tp up to MAX_CHECKED dividing that gcd (models.traced.split_graph.check_split_graph); where one fails, the
width is the largest degree that passed with all its divisors, and a block that passes none is not marked.

Note:
    Nothing is marked when the model's layers share a parameter (a tied embedding and head): the planner gives every
    stage one tp, and train refuses a tied weight on a stage with tp > 1 (runtime.execution.tp_layers), so a marked
    profile would yield plans train cannot run; the planner then keeps to tp 1. Other layers (embeddings, norms,
    heads, GPT-2's fused Conv1D attention, which the runtime does not split) are not marked: they run replicated.
    A marked block's whole_fwd and whole_bwd are left at 0 (its norms and residual adds priced as split too). A zoo
    encoder layer names its norm's parameter bytes (TensorSplit.norm_bytes: sequence parallelism all-reduces their
    gradients); a captured block names the bytes of its parameters no rank shards (its norms' weights), per norm.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import torch
from torch import fx, nn

from pipeplan.core.errors import PlanError
from pipeplan.core.layer_profile import TensorSplit
from pipeplan.models.parameter_sharing import shared_parameters
from pipeplan.models.tp_block import check_split, encoder_of
from pipeplan.models.traced.split_graph import GraphBlock, check_split_graph, graph_block
from pipeplan.sim.cost.sequence_traffic import SEQUENCE_NORMS

MAX_CHECKED = 8
"""The largest tp a captured block is run split at while profiling (each check runs the block tp + 1 times)."""


def layer_splits(
    layers: Sequence[nn.Module], names: Sequence[str], inputs: Sequence[torch.Tensor | tuple[torch.Tensor, ...]]
) -> tuple[TensorSplit | None, ...]:
    """Each layer's split (module docstring), None where it does not split; `inputs`: each layer's measured input."""
    if shared_parameters(layers, names):
        return (None,) * len(layers)
    checked: dict[str, int | None] = {}
    return tuple(_split(layer, name, x, checked) for layer, name, x in zip(layers, names, inputs, strict=True))


def _split(
    layer: nn.Module, name: str, x: torch.Tensor | tuple[torch.Tensor, ...], checked: dict[str, int | None]
) -> TensorSplit | None:
    """One layer's split; `checked`: graph code -> the width its check gave (blocks of the same code run once)."""
    found = encoder_of(layer)
    if found is not None:
        encoder = found[0]
        try:
            check_split(layer, name, 1, "profile")  # plain self-attention with biases, as SplitBlock needs
        except PlanError:
            return None
        norm = sum(p.numel() * p.element_size() for p in encoder.norm1.parameters())  # SP all-reduces its gradients
        return TensorSplit("block", math.gcd(encoder.self_attn.num_heads, encoder.linear1.out_features), norm_bytes=norm)
    block = graph_block(layer)
    if block is None:
        return None
    width = math.gcd(block.heads, block.kv_heads, block.hidden)
    sample = x[0] if isinstance(x, tuple) and len(x) == 1 else x
    norm = _summed_bytes(layer, block)
    if not isinstance(sample, torch.Tensor) or sample.is_meta:
        return TensorSplit("block", width, norm_bytes=norm)  # nothing runs on the meta device: train checks it later
    assert isinstance(layer, fx.GraphModule)
    key = f"{width}:{_code(layer)}"
    if key not in checked:
        checked[key] = _passing(layer, name, sample[:2], width)
    return None if checked[key] is None else TensorSplit("block", checked[key], norm_bytes=norm)


def _summed_bytes(layer: nn.Module, block: GraphBlock) -> float:
    """What sequence parallelism all-reduces per norm of a captured block: the bytes of its trainable parameters that
    no TP rank shards (split_graph's `sp_summed`: a Llama block's two RMSNorm weights), spread over the
    SEQUENCE_NORMS["block"] norms the cost model counts, so that the priced bytes are the summed ones."""
    sharded = {path for path, _ in block.split_tensors()}
    total = sum(p.numel() * p.element_size() for path, p in layer.named_parameters() if p.requires_grad and path not in sharded)
    return total / SEQUENCE_NORMS["block"]


def _code(layer: fx.GraphModule) -> str:
    """The layer's generated code with its inputs renamed: a model's blocks share it (their attribute paths are
    their own; only the input takes the name of the layer before's output)."""
    code = layer.code
    for i, node in enumerate(n for n in layer.graph.nodes if n.op == "placeholder"):
        code = re.sub(rf"\b{re.escape(node.name)}\b", f"input_{i}", code)
    return code


def _passing(layer: fx.GraphModule, name: str, sample: torch.Tensor, width: int) -> int | None:
    """The width to mark: `width` when the block runs split at every tp dividing it up to MAX_CHECKED, else the
    largest tp that passed with every divisor of it; None when none did."""
    passed = {1}
    for t in range(2, min(width, MAX_CHECKED) + 1):
        if width % t:
            continue
        try:
            check_split_graph(layer, name, t, "profile", sample)
        except PlanError:
            continue
        passed.add(t)
    tried = {t for t in range(1, min(width, MAX_CHECKED) + 1) if width % t == 0}
    if passed == tried:
        return width
    whole = [t for t in sorted(passed) if all(t % d or d in passed for d in range(1, t + 1))]
    return whole[-1] if whole[-1] > 1 else None
