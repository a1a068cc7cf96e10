"""profiler.norms: BatchNorm measured at batch sizes that give it one value per channel (batch 1 of the curve)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from pipeplan.core.errors import ProfileError  # noqa: E402
from pipeplan.models.model_spec import ModelSpec  # noqa: E402
from pipeplan.profiler.curves import profile_batch_sizes  # noqa: E402
from pipeplan.profiler.norms import one_value_per_channel, single_value_norms  # noqa: E402

pytestmark = pytest.mark.torch


def _cnn() -> list[nn.Module]:
    """A classifier whose BatchNorm1d sees one value per channel at batch 1, its BatchNorm2d a 1x1 map there too."""
    return [nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU()),
            nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.BatchNorm2d(4), nn.Flatten()),
            nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 3))]  # fmt: skip


def test_one_value_per_channel_is_batch_times_spatial_size_one() -> None:
    assert one_value_per_channel(torch.zeros(1, 4)) and one_value_per_channel(torch.zeros(1, 4, 1, 1))
    assert not one_value_per_channel(torch.zeros(2, 4)) and not one_value_per_channel(torch.zeros(1, 4, 2, 1))


def test_every_batch_size_of_the_curve_profiles_batchnorm() -> None:
    """Batch 1 (which training mode refuses: "Expected more than 1 value per channel") is measured too, and the
    running statistics and training mode are as they were after the profile's own rounds at sizes 2 and 4 alone."""
    torch.manual_seed(0)
    layers = _cnn()
    with pytest.raises(ValueError, match="Expected more than 1 value per channel"):
        nn.Sequential(*layers)(torch.randn(1, 1, 5, 5))
    spec = ModelSpec("cnn", tuple(layers), ("a", "b", "c"), sample_input=lambda b: torch.randn(b, 1, 5, 5))
    profile = profile_batch_sizes(spec, (1, 2, 4), runs=1, warmup=0)
    assert profile.batch_sizes == (1, 2, 4)
    assert all(layer.curve is not None and len(layer.curve.fwd_ms) == 3 for layer in profile.layers)
    assert all(m.training for layer in layers for m in layer.modules())


def test_a_single_value_call_uses_the_running_statistics_and_leaves_them() -> None:
    """Inside, batch 1 gives evaluation mode's output exactly; batch 2 normalises by its own statistics and updates
    the running ones; on leaving the hooks are gone (batch 1 raises again)."""
    norm = nn.BatchNorm1d(3)
    with torch.no_grad():
        norm.running_mean.copy_(torch.tensor([1.0, 2.0, 3.0]))
        norm.running_var.copy_(torch.tensor([4.0, 1.0, 0.25]))
    x = torch.tensor([[3.0, 3.0, 3.0]])
    with single_value_norms([norm]):
        out = norm(x)
        assert norm.training
        assert torch.allclose(out, (x - norm.running_mean) / torch.sqrt(norm.running_var + norm.eps))
        assert torch.equal(norm.running_mean, torch.tensor([1.0, 2.0, 3.0]))
        norm(torch.tensor([[0.0, 0.0, 0.0], [2.0, 2.0, 2.0]]))
        assert not torch.equal(norm.running_mean, torch.tensor([1.0, 2.0, 3.0]))
    with pytest.raises(ValueError, match="Expected more than 1 value per channel"):
        norm(x)


def test_batchnorm_without_running_statistics_is_one_line() -> None:
    norm = nn.BatchNorm1d(3, track_running_stats=False)
    with single_value_norms([norm]), pytest.raises(ProfileError, match=r"without running statistics.*--batch-sizes"):
        norm(torch.ones(1, 3))
