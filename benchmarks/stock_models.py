"""Shared by the stock-model benchmarks (runtime_vs_torch.py, bring_your_model.py): unmodified Hugging Face models.

Each factory is what a user writes in their own file: it returns the transformers model as it comes, built from a
small config (random weights, nothing downloaded), in float32 and in training mode. pipeplan captures it with
torch.export (models.traced.capture) and takes the sample data and loss from its config (models.zoo.stock). The MODULE_SPECs
are `stock_models:gpt2` and `stock_models:vit`, with benchmarks/ on the import path; their keyword arguments are
the `--opt` options.

Running this file does nothing (`make bench` runs every file here).
"""

from __future__ import annotations

from typing import Any


def gpt2(
    n_layer: int = 4, n_embd: int = 256, n_head: int = 4, vocab_size: int = 1000, n_positions: int = 64, dropout: float = 0.0
) -> Any:
    """A GPT2LMHeadModel (tied lm_head / wte, as GPT-2 is) of n_layer blocks; sequences of n_positions tokens."""
    import torch
    import transformers

    torch.manual_seed(0)
    ids = {"bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0}
    config = transformers.GPT2Config(
        n_layer=n_layer, n_embd=n_embd, n_head=n_head, vocab_size=vocab_size, n_positions=n_positions,
        resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout, **ids,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(config)


def vit(
    image_size: int = 32, patch_size: int = 4, hidden_size: int = 192, layers: int = 4, heads: int = 4, labels: int = 10
) -> Any:
    """A ViTForImageClassification on image_size x image_size RGB images ((image_size / patch_size)^2 patches)."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.ViTConfig(
        image_size=image_size, patch_size=patch_size, num_channels=3, hidden_size=hidden_size, num_hidden_layers=layers,
        num_attention_heads=heads, intermediate_size=4 * hidden_size, num_labels=labels, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    return transformers.ViTForImageClassification(config)
