"""The profiler records shared parameters (tied weights) and counts each once (torch, CPU only)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from pipeplan.core.profile import SharedGroup  # noqa: E402
from pipeplan.models.specs import spec_from_module  # noqa: E402
from pipeplan.profiler import profile_module  # noqa: E402
from pipeplan.profiler.curves import profile_batch_sizes  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_torch_thread")]

VOCAB, WIDTH, SEQ = 50, 16, 4
F32 = 4


class TiedLM(nn.Module):
    """Embedding, one block, a head whose weight is the embedding's (as GPT-2's lm_head and wte)."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, WIDTH)
        self.block = nn.Linear(WIDTH, WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.embedding.weight

    def pipeline_layers(self) -> list[tuple[str, nn.Module]]:
        return [("embedding", self.embedding), ("block", self.block), ("head", self.head)]

    def sample_input(self, batch: int) -> torch.Tensor:
        return torch.randint(0, VOCAB, (batch, SEQ), generator=torch.Generator().manual_seed(0))


def test_a_tied_head_is_one_group_and_the_model_counts_its_weight_once() -> None:
    """50 x 16 fp32 weight held by layers 0 and 2: one group of 3,200 bytes; the total is torch's own parameter count
    of the model (each Parameter once), not the layers' sum (which counts the weight twice)."""
    model = TiedLM()
    profile = profile_module(model, model.sample_input, 2, runs=1, warmup=0)
    weight = VOCAB * WIDTH * F32
    assert profile.shared_params == (SharedGroup("embedding.weight", (0, 2), float(weight)),)
    assert [layer.param_bytes for layer in profile.layers] == [weight, (WIDTH * WIDTH + WIDTH) * F32, weight]
    assert profile.total_param_bytes == sum(p.numel() * p.element_size() for p in model.parameters())
    assert sum(layer.param_bytes for layer in profile.layers) - profile.total_param_bytes == weight


def test_the_curves_profile_keeps_the_group() -> None:
    """Measured at two batch sizes (what `pipeplan profile` runs), the profile keeps the same group."""
    model = TiedLM()
    profile = profile_batch_sizes(spec_from_module(model, "tied"), (1, 2), runs=1, warmup=0)
    assert profile.shared_params == (SharedGroup("embedding.weight", (0, 2), float(VOCAB * WIDTH * F32)),)


def test_an_untied_model_has_no_groups() -> None:
    """The same model with its own head weight: no group, the total is the layers' sum."""
    model = TiedLM()
    model.head.weight = nn.Parameter(model.embedding.weight.detach().clone())
    profile = profile_module(model, model.sample_input, 2, runs=1, warmup=0)
    assert profile.shared_params == ()
    assert profile.total_param_bytes == sum(layer.param_bytes for layer in profile.layers)
