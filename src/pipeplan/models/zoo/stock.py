"""Stock models as they come: their outputs read as one tensor, and Hugging Face models' own sample data and loss.

`output_tensor` reads a model's output as the one tensor pipeplan trains on:
a tensor as it is; a `ModelOutput`, a dict or a tuple gives its `logits`
field, else its first tensor. `call_model` runs a model on its first forward
argument (input_ids, pixel_values) with `use_cache=False` where the forward
takes it. `hf_defaults` gives a transformers model with no sample data of its
own a seeded sample input and target from its config and the loss the model
itself computes from `labels`:

  - causal LM (`*ForCausalLM`, `*LMHeadModel`): random ids in the vocabulary,
    the labels are the ids, the loss is cross-entropy of each position's
    logits against the next id (ignore_index -100), as HF shifts it;
  - masked LM (`*ForMaskedLM`): the labels are the ids, cross-entropy per
    position (ignore_index -100);
  - sequence / image classification: random labels in `num_labels`, the loss
    per `config.problem_type` (regression: MSE; multi-label: BCE with logits;
    else cross-entropy), as HF picks it when the type is unset.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional

from pipeplan.models.model_spec import LossFn, SampleFn, seeded_randint, seeded_randn

IGNORE_INDEX = -100
SEQUENCE_CAP = 128
"""At most this many tokens per sample input (a config's maximum position count can be in the thousands)."""
IMAGE_SIZE = 224
"""The image side when a vision config names none (HF ResNet's configs have no image_size)."""


def output_tensor(output: object) -> torch.Tensor:
    """The one tensor of a model's output: itself, else its `logits`, else its first tensor (module docstring).

    Raises:
        TypeError: the output holds no tensor.
    """
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, Mapping):
        if isinstance(output.get("logits"), torch.Tensor):
            return output["logits"]
        values = list(output.values())
    elif isinstance(output, (tuple, list)):
        values = list(output)
    else:
        raise TypeError(f"the model returned {type(output).__name__}, not a tensor, a dict, a tuple or a ModelOutput")
    for value in values:
        if isinstance(value, torch.Tensor):
            return value
    raise TypeError(f"the model's output ({type(output).__name__}) holds no tensor")


def call_model(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The model's output tensor on its first argument x, with use_cache=False where the forward takes it."""
    try:
        takes_cache = "use_cache" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        takes_cache = False
    return output_tensor(model(x, use_cache=False) if takes_cache else model(x))


def is_transformers_model(model: nn.Module) -> bool:
    """Whether model is a transformers PreTrainedModel (fx cannot trace them; they are exported)."""
    return any(c.__name__ == "PreTrainedModel" and c.__module__.startswith("transformers") for c in type(model).__mro__)


@dataclass(frozen=True)
class StockDefaults:
    """A stock model's seeded sample input and target, and its own loss on (logits, target)."""

    sample_input: SampleFn
    sample_target: SampleFn
    loss_fn: LossFn


def hf_defaults(model: nn.Module) -> StockDefaults | None:
    """A transformers model's sample input, target and loss from its config and class (module docstring); None for
    another model or a head this does not know."""
    config = getattr(model, "config", None)
    if config is None or not is_transformers_model(model):
        return None
    kind = type(model).__name__
    if kind.endswith(("ForCausalLM", "LMHeadModel", "ForMaskedLM")):
        vocab = int(config.vocab_size)
        positions = _positions(config)

        def ids(batch_size: int) -> torch.Tensor:
            return seeded_randint(vocab, (batch_size, positions))

        loss = causal_lm_loss if not kind.endswith("ForMaskedLM") else masked_lm_loss
        return StockDefaults(ids, ids, loss)
    if kind.endswith("ForImageClassification"):
        channels = int(getattr(config, "num_channels", 3))
        side = _image_size(config)

        def pixels(batch_size: int) -> torch.Tensor:
            return seeded_randn((batch_size, channels, side, side))

        return StockDefaults(pixels, _labels(config), classification_loss(config))
    if kind.endswith("ForSequenceClassification"):
        vocab, positions = int(config.vocab_size), _positions(config)
        return StockDefaults(lambda b: seeded_randint(vocab, (b, positions)), _labels(config), classification_loss(config))
    return None


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of each position's logits against the next label (ignore_index -100), HF's causal LM loss."""
    shifted = functional.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:]
    flat = logits.reshape(-1, logits.shape[-1])
    if flat.dtype in (torch.float16, torch.bfloat16):
        flat = flat.float()  # HF computes the loss in float32
    return functional.cross_entropy(flat, shifted.reshape(-1), ignore_index=IGNORE_INDEX)


def masked_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of every position's logits against its label (ignore_index -100), HF's masked LM loss."""
    return functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE_INDEX)


def classification_loss(config: object) -> LossFn:
    """HF's sequence / image classification loss for config's problem_type (unset: regression for one label,
    else single-label cross-entropy, since the sample labels are integers)."""
    labels = int(getattr(config, "num_labels", 2))
    problem = getattr(config, "problem_type", None) or ("regression" if labels == 1 else "single_label_classification")

    def loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if problem == "regression":
            return functional.mse_loss(logits.squeeze(-1) if labels == 1 else logits, target.to(logits.dtype))
        if problem == "multi_label_classification":
            return functional.binary_cross_entropy_with_logits(logits, target.to(logits.dtype))
        return functional.cross_entropy(logits.reshape(-1, labels), target.reshape(-1))

    return loss


def _labels(config: object) -> SampleFn:
    """Seeded targets for config's problem type: class ids, multi-hot rows or regression values."""
    labels = int(getattr(config, "num_labels", 2))
    problem = getattr(config, "problem_type", None) or ("regression" if labels == 1 else "single_label_classification")

    def target(batch_size: int) -> torch.Tensor:
        if problem == "regression":
            values = seeded_randn((batch_size, labels), seed=1)
            return values.squeeze(-1) if labels == 1 else values
        if problem == "multi_label_classification":
            return seeded_randint(2, (batch_size, labels), seed=1).float()
        return seeded_randint(labels, (batch_size,), seed=1)

    return target


def _positions(config: object) -> int:
    """Tokens per sample: the config's maximum position count, at most SEQUENCE_CAP."""
    for key in ("max_position_embeddings", "n_positions", "n_ctx"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return min(value, SEQUENCE_CAP)
    return SEQUENCE_CAP


def _image_size(config: object) -> int:
    """The image side of a vision config (IMAGE_SIZE when it names none)."""
    size = getattr(config, "image_size", None)
    if isinstance(size, (tuple, list)):
        size = size[0]
    return int(size) if isinstance(size, int) and size > 0 else IMAGE_SIZE
