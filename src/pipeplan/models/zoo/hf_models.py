"""GPT-2 and BERT built from their published configurations with random weights (transformers; nothing downloaded).

Each model is split into pipeline blocks: `embed` (token + position
embeddings), `block{i}` (one transformer layer each), and `head` (final
norm / transform and the vocabulary projection).

Note:
    The head has its own vocabulary weight rather than one tied to the input
    embedding: across pipeline stages a tied weight would need an extra
    all-reduce between the first and the last stage, which pipeplan does not
    model. Attention runs through torch's scaled_dot_product_attention (GPT-2
    causal, BERT bidirectional, no padding mask).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional

from pipeplan.core.errors import ProfileError
from pipeplan.models.model_spec import ModelSpec, seeded_randint

# Sizes from the GPT-2 paper (Radford et al. 2019, table 2) and the BERT paper (Devlin et al. 2019, section 3):
# name -> (layers, hidden, heads, positions, vocab)
CONFIGS: dict[str, tuple[int, int, int, int, int]] = {
    "gpt2-small": (12, 768, 12, 1024, 50257),
    "gpt2-medium": (24, 1024, 16, 1024, 50257),
    "gpt2-large": (36, 1280, 20, 1024, 50257),
    "gpt2-xl": (48, 1600, 25, 1024, 50257),
    "bert-base": (12, 768, 12, 512, 30522),
    "bert-large": (24, 1024, 16, 512, 30522),
}


class GPT2Embedding(nn.Module):
    """Token plus learned position embeddings, then dropout: (batch, seq) ids → (batch, seq, hidden)."""

    def __init__(self, vocab: int, positions: int, hidden: int, dropout: float) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, hidden)
        self.wpe = nn.Embedding(positions, hidden)
        self.drop = nn.Dropout(dropout)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Embed input_ids."""
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        return self.drop(self.wte(input_ids) + self.wpe(positions))


class LMHead(nn.Module):
    """A final module (norm or transform) then a bias-free projection to vocabulary logits."""

    def __init__(self, first: nn.Module, hidden: int, vocab: int) -> None:
        super().__init__()
        self.norm = first
        self.proj = nn.Linear(hidden, vocab, bias=False)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """(batch, seq, hidden) → (batch, seq, vocab) logits."""
        return self.proj(self.norm(hidden_states))


def build(name: str, seq_len: int = 0, layers: int = 0, dropout: float = -1.0, seed: int = 0) -> ModelSpec:
    """Build the named model; 0 / -1 options keep the model's own sequence length, depth and dropout (0.1).

    Raises:
        ProfileError: for an unknown name, a bad option, or when transformers is not installed.
    """
    if name not in CONFIGS:
        raise ProfileError(f"unknown transformers model {name!r}; known: {', '.join(CONFIGS)}")
    depth, hidden, heads, positions, vocab = CONFIGS[name]
    depth = depth if layers == 0 else layers
    seq = positions if seq_len == 0 else seq_len
    drop = 0.1 if dropout < 0 else dropout
    if depth < 1:
        raise ProfileError(f"{name} option layers must be >= 1, got {layers!r}")
    if not 1 <= seq <= positions:
        raise ProfileError(f"{name} option seq_len must be in 1..{positions}, got {seq_len!r}")
    if drop >= 1:
        raise ProfileError(f"{name} option dropout must be in [0, 1), got {dropout!r}")
    from pipeplan.models.zoo.vision_compat import prepare_torchvision

    prepare_torchvision()  # transformers imports torchvision when it is installed
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise ProfileError(f"built-in spec {name!r} needs the transformers package: pip install 'pipeplan[torch]'") from None
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if name.startswith("gpt2"):
            blocks, names = _gpt2(depth, hidden, heads, positions, vocab, drop)
        else:
            blocks, names = _bert(depth, hidden, heads, positions, vocab, drop)
    return ModelSpec(
        name=name if (layers == 0 and seq_len == 0) else f"{name}-{depth}l-s{seq}",
        layers=tuple(blocks),
        layer_names=tuple(names),
        sample_input=lambda b: seeded_randint(vocab, (b, seq), seed=1),
        sample_target=lambda b: seeded_randint(vocab, (b, seq), seed=2),
        loss_fn=token_cross_entropy,
    )


def token_cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of (batch, seq, vocab) logits against (batch, seq) token ids."""
    return functional.cross_entropy(logits.flatten(0, 1).float(), target.flatten())


def _gpt2(depth: int, hidden: int, heads: int, positions: int, vocab: int, drop: float) -> tuple[list[nn.Module], list[str]]:
    """GPT-2 blocks: embed, depth GPT2Block layers, head (ln_f + projection)."""
    from transformers import GPT2Config
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    config = GPT2Config(
        n_layer=depth,
        n_embd=hidden,
        n_head=heads,
        n_positions=positions,
        vocab_size=vocab,
        resid_pdrop=drop,
        embd_pdrop=drop,
        attn_pdrop=drop,
        attn_implementation="sdpa",
    )
    blocks: list[nn.Module] = [GPT2Embedding(vocab, positions, hidden, drop)]
    blocks += [GPT2Block(config, layer_idx=i) for i in range(depth)]
    blocks.append(LMHead(nn.LayerNorm(hidden, eps=config.layer_norm_epsilon), hidden, vocab))
    return blocks, ["embed", *(f"block{i}" for i in range(depth)), "head"]


def _bert(depth: int, hidden: int, heads: int, positions: int, vocab: int, drop: float) -> tuple[list[nn.Module], list[str]]:
    """BERT blocks: embed (BertEmbeddings), depth BertLayer layers, head (MLM transform + projection)."""
    from transformers import BertConfig
    from transformers.models.bert.modeling_bert import BertEmbeddings, BertLayer, BertPredictionHeadTransform

    config = BertConfig(
        num_hidden_layers=depth,
        hidden_size=hidden,
        num_attention_heads=heads,
        intermediate_size=4 * hidden,
        max_position_embeddings=positions,
        vocab_size=vocab,
        hidden_dropout_prob=drop,
        attention_probs_dropout_prob=drop,
        attn_implementation="sdpa",
    )
    blocks: list[nn.Module] = [BertEmbeddings(config)]
    blocks += [BertLayer(config, layer_idx=i) for i in range(depth)]
    blocks.append(LMHead(BertPredictionHeadTransform(config), hidden, vocab))
    return blocks, ["embed", *(f"block{i}" for i in range(depth)), "head"]
