"""A small character-level GPT as a MODULE_SPEC (`charlm`): embedding, causal transformer blocks, head.

Made for the `pysource` dataset (models.zoo.text): (batch, seq_len) character
ids in, (batch, seq_len, vocab) logits out, cross-entropy of every next
character. Layers: `embed` (character and learned position embeddings),
`block0` .. `block{n-1}` (pre-norm nn.TransformerEncoderLayer under a causal
mask), `head` (LayerNorm and a projection to the vocabulary).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional

from pipeplan.core.checks import check_nonneg_float, check_positive_int
from pipeplan.core.errors import ProfileError
from pipeplan.models.model_spec import ModelSpec, seeded_randint
from pipeplan.models.zoo.text import VOCAB


class Embed(nn.Module):
    """Character ids (batch, seq) -> character + position embeddings (batch, seq, d_model)."""

    def __init__(self, vocab: int, seq_len: int, d_model: int) -> None:
        super().__init__()
        self.chars = nn.Embedding(vocab, d_model)
        self.positions = nn.Parameter(torch.zeros(seq_len, d_model))
        nn.init.normal_(self.positions, std=0.02)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.chars(ids) + self.positions[: ids.shape[1]]


class CausalBlock(nn.Module):
    """A pre-norm transformer encoder layer that sees only earlier positions."""

    def __init__(self, d_model: int, heads: int, ffn: int, dropout: float) -> None:
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(d_model, heads, ffn, dropout, batch_first=True, norm_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1], device=x.device, dtype=x.dtype)
        return self.layer(x, src_mask=mask, is_causal=True)


def next_char_cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of (batch, seq, vocab) logits against (batch, seq) next-character ids."""
    return functional.cross_entropy(logits.flatten(0, 1), target.flatten())


def charlm(
    d_model: int = 128, heads: int = 4, layers: int = 4, seq_len: int = 64, dropout: float = 0.0, seed: int = 0
) -> ModelSpec:
    """The `charlm` MODULE_SPEC (module docstring); sample inputs and targets are seeded random character ids."""
    for field, value in (("d_model", d_model), ("heads", heads), ("layers", layers), ("seq_len", seq_len)):
        check_positive_int(ProfileError, f"charlm option {field}", value)
    if d_model % heads:
        raise ProfileError(f"charlm option d_model ({d_model}) must be a multiple of heads ({heads})")
    check_nonneg_float(ProfileError, "charlm option dropout", dropout)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        blocks: list[nn.Module] = [Embed(VOCAB, seq_len, d_model)]
        blocks += [CausalBlock(d_model, heads, 4 * d_model, dropout) for _ in range(layers)]
        blocks.append(nn.Sequential(nn.LayerNorm(d_model), nn.Linear(d_model, VOCAB)))
    return ModelSpec(
        name=f"charlm-{layers}x{d_model}",
        layers=tuple(blocks),
        layer_names=("embed", *(f"block{i}" for i in range(layers)), "head"),
        sample_input=lambda b: seeded_randint(VOCAB, (b, seq_len), seed=1),
        sample_target=lambda b: seeded_randint(VOCAB, (b, seq_len), seed=2),
        loss_fn=next_char_cross_entropy,
    )
