"""Tests of profiler.charlm: the character-level GPT spec."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pipeplan.core.errors import ProfileError  # noqa: E402
from pipeplan.models.build import build_model  # noqa: E402
from pipeplan.models.zoo.charlm import charlm, next_char_cross_entropy  # noqa: E402

pytestmark = pytest.mark.torch  # every test here needs torch (make test-fast leaves them out)


def run(spec: object, ids: torch.Tensor) -> torch.Tensor:
    x = ids
    for layer in spec.layers:  # type: ignore[attr-defined]
        x = layer(x)
    return x


def test_layers_shapes_and_names() -> None:
    """embed, one block per layer, head; (b, seq) ids in, (b, seq, 128) logits out."""
    spec = charlm(d_model=32, heads=2, layers=3, seq_len=16)
    assert spec.layer_names == ("embed", "block0", "block1", "block2", "head")
    assert run(spec, spec.sample_input(5)).shape == (5, 16, 128)


def test_a_position_sees_only_earlier_characters() -> None:
    """Changing the last character leaves every earlier position's logits as they were (the causal mask)."""
    spec = charlm(d_model=32, heads=2, layers=2, seq_len=12)
    for layer in spec.layers:
        layer.eval()
    ids = spec.sample_input(2)
    changed = ids.clone()
    changed[:, -1] = (changed[:, -1] + 1) % 128
    with torch.no_grad():
        a, b = run(spec, ids), run(spec, changed)
    assert torch.allclose(a[:, :-1], b[:, :-1], atol=1e-6) and not torch.allclose(a[:, -1], b[:, -1])


def test_loss_is_the_mean_cross_entropy_of_every_position() -> None:
    """Uniform logits over 128 characters: ln 128 at every position."""
    logits = torch.zeros(2, 5, 128)
    assert float(next_char_cross_entropy(logits, torch.zeros(2, 5, dtype=torch.int64))) == pytest.approx(
        torch.log(torch.tensor(128.0)).item()
    )


def test_pysource_is_charlms_default_data_with_a_held_out_split() -> None:
    """`auto` data for charlm is pysource: windows of its seq_len, a test split, 128 classes."""
    model = build_model("charlm", {"seq_len": 24, "layers": 1, "d_model": 16, "heads": 2}, "auto")
    data = model.dataset
    assert data.name == "pysource" and data.classes == 128 and data.inputs.shape[1] == 24
    assert data.test_inputs is not None and len(data.test_inputs) > 0


def test_bad_options_are_named() -> None:
    with pytest.raises(ProfileError, match=r"charlm option d_model \(30\) must be a multiple of heads \(4\)"):
        charlm(d_model=30, heads=4)
