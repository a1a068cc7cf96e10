"""Stock models' outputs read as one tensor, and Hugging Face models' sample data and loss (models.zoo.stock)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from torch import nn  # noqa: E402

from hf_tiny import build  # noqa: E402
from pipeplan.models.zoo.stock import call_model, hf_defaults, output_tensor  # noqa: E402

pytestmark = pytest.mark.torch


def test_an_output_is_read_as_its_logits_else_its_first_tensor() -> None:
    """A tensor as it is; a ModelOutput or dict by `logits`; else (a dict, a tuple) the first tensor in it."""
    a, b = torch.ones(2), torch.zeros(2)
    from transformers.modeling_outputs import CausalLMOutput

    assert output_tensor(a) is a
    assert output_tensor(CausalLMOutput(loss=b, logits=a)) is a
    assert output_tensor({"hidden": b, "logits": a}) is a
    assert output_tensor({"n": 3, "hidden": b}) is b
    assert output_tensor((None, b, a)) is b
    with pytest.raises(TypeError, match="holds no tensor"):
        output_tensor((1, 2))
    with pytest.raises(TypeError, match="not a tensor, a dict"):
        output_tensor(3)


def test_call_model_turns_the_cache_off_where_the_forward_takes_it() -> None:
    """GPT-2's forward takes use_cache: its logits, with no cache built; a plain module is called as it is."""
    model = build("gpt2")
    x = torch.randint(0, 100, (2, 5))
    assert call_model(model, x).shape == (2, 5, 100)
    lin = nn.Linear(3, 2)
    assert call_model(lin, torch.ones(4, 3)).shape == (4, 2)


def _float32(kind: str) -> nn.Module:
    return build(kind).float()


@pytest.mark.parametrize("kind", ["gpt2", "llama", "bert", "vit", "resnet"])
def test_the_default_loss_is_the_models_own(kind: str) -> None:
    """The loss on (logits, sample target) equals the model's own `labels=` loss (float32: HF computes in float32)."""
    model = _float32(kind)
    defaults = hf_defaults(model)
    assert defaults is not None
    x, y = defaults.sample_input(3), defaults.sample_target(3)
    out = model(x, labels=y)
    torch.testing.assert_close(defaults.loss_fn(out.logits, y), out.loss, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(("labels", "problem"), [(1, None), (3, "multi_label_classification"), (3, None)])
def test_a_sequence_classifier_gets_the_loss_of_its_problem_type(labels: int, problem: str | None) -> None:
    """Regression (one label), multi-label and single-label: the model's own loss on the sample targets."""
    config = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=8, num_labels=labels,
                                     problem_type=problem, pad_token_id=0)  # fmt: skip
    model = transformers.BertForSequenceClassification(config)
    defaults = hf_defaults(model)
    assert defaults is not None
    x, y = defaults.sample_input(4), defaults.sample_target(4)
    assert x.shape == (4, 8)
    out = model(x, labels=y)
    torch.testing.assert_close(defaults.loss_fn(out.logits, y), out.loss, rtol=1e-6, atol=1e-6)


def test_sample_inputs_come_from_the_config_and_are_seeded() -> None:
    """Ids in the vocabulary over the positions; pixels of the image size (a config naming none: 224); the same
    tensors every call."""
    gpt2 = hf_defaults(build("gpt2"))
    assert gpt2 is not None
    ids = gpt2.sample_input(3)
    assert ids.shape == (3, 16) and int(ids.min()) >= 0 and int(ids.max()) < 100
    assert torch.equal(ids, gpt2.sample_input(3)) and torch.equal(gpt2.sample_target(3), ids)
    vit = hf_defaults(build("vit"))
    assert vit is not None and vit.sample_input(2).shape == (2, 3, 8, 8) and vit.sample_target(2).shape == (2,)
    config = transformers.ResNetConfig(num_channels=1, embedding_size=4, hidden_sizes=[4], depths=[1], num_labels=2)
    resnet = hf_defaults(transformers.ResNetForImageClassification(config))
    assert resnet is not None and resnet.sample_input(1).shape == (1, 1, 224, 224)


def test_other_models_get_no_defaults() -> None:
    """A plain module, or a transformers model whose head this does not know (a bare encoder), gets none."""
    assert hf_defaults(nn.Linear(2, 2)) is None
    assert hf_defaults(build("gpt2").transformer) is None
