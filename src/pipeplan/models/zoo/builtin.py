"""Built-in MODULE_SPECs that need only torch: a plain MLP stack and a torch transformer-encoder stack (and, from
their own modules, charlm and the branching rescnn).

Weights are drawn from a fixed seed inside `torch.random.fork_rng`, so every
process that builds a spec gets the same model and the caller's RNG is left
untouched (the runtime builds stages on every rank from the same spec).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional

from pipeplan.core.checks import check_nonneg_float, check_positive_int
from pipeplan.core.errors import ProfileError
from pipeplan.models.model_spec import ModelSpec, seeded_randn
from pipeplan.models.zoo.charlm import charlm
from pipeplan.models.zoo.rescnn import rescnn


def mlp(hidden: int = 1024, blocks: int = 8, in_features: int = 0, seed: int = 0) -> ModelSpec:
    """`blocks` blocks of Linear(hidden, hidden) → ReLU on a (batch, in_features) input; MSE loss on a (batch, hidden) target.

    `in_features` 0 means hidden. Block i is named `block{i}`.
    """
    check_positive_int(ProfileError, "mlp option hidden", hidden)
    check_positive_int(ProfileError, "mlp option blocks", blocks)
    width_in = hidden if in_features == 0 else check_positive_int(ProfileError, "mlp option in_features", in_features)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        layers = tuple(nn.Sequential(nn.Linear(width_in if i == 0 else hidden, hidden), nn.ReLU()) for i in range(blocks))
    return ModelSpec(
        name=f"mlp-{blocks}x{hidden}",
        layers=layers,
        layer_names=tuple(f"block{i}" for i in range(blocks)),
        sample_input=lambda b: seeded_randn((b, width_in), seed=1),
        sample_target=lambda b: seeded_randn((b, hidden), seed=2),
        loss_fn=functional.mse_loss,
    )


def transformer(
    d_model: int = 512,
    heads: int = 8,
    layers: int = 6,
    seq_len: int = 128,
    ffn: int = 0,
    dropout: float = 0.1,
    seed: int = 0,
) -> ModelSpec:
    """`layers` pre-norm nn.TransformerEncoderLayer blocks then a final LayerNorm, on (batch, seq_len, d_model) floats.

    `ffn` 0 means 4·d_model. MSE loss on a (batch, seq_len, d_model) target.
    """
    for field, value in (("d_model", d_model), ("heads", heads), ("layers", layers), ("seq_len", seq_len)):
        check_positive_int(ProfileError, f"transformer option {field}", value)
    if d_model % heads:
        raise ProfileError(f"transformer option d_model ({d_model}) must be a multiple of heads ({heads})")
    check_nonneg_float(ProfileError, "transformer option dropout", dropout)
    width = 4 * d_model if ffn == 0 else check_positive_int(ProfileError, "transformer option ffn", ffn)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        blocks: list[nn.Module] = [
            nn.TransformerEncoderLayer(d_model, heads, width, dropout, batch_first=True, norm_first=True) for _ in range(layers)
        ]
        blocks.append(nn.LayerNorm(d_model))
    return ModelSpec(
        name=f"transformer-{layers}x{d_model}",
        layers=tuple(blocks),
        layer_names=(*(f"block{i}" for i in range(layers)), "norm"),
        sample_input=lambda b: seeded_randn((b, seq_len, d_model), seed=1),
        sample_target=lambda b: seeded_randn((b, seq_len, d_model), seed=2),
        loss_fn=functional.mse_loss,
    )


def _hf(name: str) -> Callable[..., ModelSpec]:
    """A factory for a transformers-based spec that imports transformers only when called."""

    def factory(seq_len: int = 0, layers: int = 0, dropout: float = -1.0, seed: int = 0) -> ModelSpec:
        from pipeplan.models.zoo import hf_models

        return hf_models.build(name, seq_len=seq_len, layers=layers, dropout=dropout, seed=seed)

    factory.__doc__ = (
        f"{name} with random weights from its configuration (options: seq_len, layers, dropout, seed; 0/-1 = the model's own)."
    )
    return factory


BUILTIN_SPECS: dict[str, Callable[..., ModelSpec]] = {
    "mlp": mlp,
    "transformer": transformer,
    **{name: _hf(name) for name in ("gpt2-small", "gpt2-medium", "gpt2-large", "gpt2-xl", "bert-base", "bert-large")},
    "charlm": charlm,
    "rescnn": rescnn,
}
"""Every built-in MODULE_SPEC name and its factory."""
