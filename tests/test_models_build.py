"""models.build: a user's factory without a seed option builds the same initial model in every process."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from pipeplan.models.build import build_model  # noqa: E402

pytestmark = pytest.mark.torch

UNSEEDED = """
from torch import nn


def build(in_features: int = 64) -> nn.Sequential:
    return nn.Sequential(nn.Linear(in_features, 8), nn.ReLU(), nn.Linear(8, 10))
"""


@pytest.fixture
def unseeded_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A module whose factory takes no seed and draws its weights from torch's global generator."""
    name = f"unseeded_{tmp_path.name}".replace("-", "_")
    (tmp_path / f"{name}.py").write_text(UNSEEDED)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield f"{name}:build"
    sys.modules.pop(name, None)


def _weights(module: str, seed: int) -> list[torch.Tensor]:
    model = build_model(module, {}, "digits", seed=seed)
    return [p.detach().clone() for layer in model.layers for p in layer.parameters()]


def test_an_unseeded_factory_builds_the_same_model_whatever_the_global_generator_holds(unseeded_module: str) -> None:
    """Two builds with the same seed after different global draws are equal to the bit (each process of a job
    builds the model itself); another seed gives other weights; the caller's generator is left as it was."""
    torch.manual_seed(123)
    first = _weights(unseeded_module, seed=5)
    torch.manual_seed(456)
    state = torch.get_rng_state()
    second = _weights(unseeded_module, seed=5)
    assert torch.equal(torch.get_rng_state(), state)
    other = _weights(unseeded_module, seed=6)
    assert len(first) == len(second) == 6
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(first, other, strict=True))
