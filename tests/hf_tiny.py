"""Tiny Hugging Face models from small configs (random weights, nothing downloaded), shared by the capture tests.

`SOURCE` is the same factory as a user's file: `build(kind)` returns the stock
model, unmodified, in float64 with dropout 0 unless `dropout` is given.
"""

from __future__ import annotations

SOURCE = """
import torch
import transformers


def build(kind: str = "gpt2", dropout: float = 0.0, tied: bool = True, seed: int = 0):
    torch.manual_seed(seed)
    ids = dict(bos_token_id=0, eos_token_id=0, pad_token_id=0)
    if kind == "gpt2":
        config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=16,
                                         resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout, **ids)
        model = transformers.GPT2LMHeadModel(config)
    elif kind == "bert":
        config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                         intermediate_size=64, max_position_embeddings=16, hidden_dropout_prob=dropout,
                                         attention_probs_dropout_prob=dropout, pad_token_id=0)
        model = transformers.BertForMaskedLM(config)
    elif kind == "llama":
        config = transformers.LlamaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                          num_key_value_heads=1, intermediate_size=64, max_position_embeddings=16,
                                          tie_word_embeddings=tied, attention_dropout=dropout, **ids)
        model = transformers.LlamaForCausalLM(config)
    elif kind == "vit":
        config = transformers.ViTConfig(image_size=8, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
                                        num_attention_heads=2, intermediate_size=64, num_labels=5,
                                        hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
        model = transformers.ViTForImageClassification(config)
    elif kind == "resnet":
        config = transformers.ResNetConfig(num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1],
                                           layer_type="basic", num_labels=5)
        model = transformers.ResNetForImageClassification(config)
        model.config.image_size = 16  # HF ResNet configs name no image size; the default (224) is slow here
    else:
        raise ValueError(kind)
    return model.to(torch.float64)
"""

KINDS = ("gpt2", "bert", "llama", "vit", "resnet")


def build(kind: str, **options: object) -> object:
    """The stock model SOURCE builds."""
    scope: dict[str, object] = {}
    exec(compile(SOURCE, "hf_tiny_source", "exec"), scope)
    return scope["build"](kind, **options)  # type: ignore[operator]
