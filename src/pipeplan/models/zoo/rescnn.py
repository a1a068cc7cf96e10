"""A small residual CNN as a MODULE_SPEC (`rescnn`): a branching model, traced into one layer per graph node.

(batch, in_features) inputs are square images of one channel (digits: 8 x 8).
Layers, as torch.fx names them: the input `x`, `unflatten`, `stem` and its
`relu`, then per residual block `blocks_{i}_conv1` → relu → `blocks_{i}_conv2`
on one branch and `blocks_{i}_skip` (a 1 x 1 convolution) on the other, joined
by an `add` and a relu; `mean` pools to (batch, channels). Each block is a
diamond, so stages may cut across its two branches (antichain cuts).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional

from pipeplan.core.checks import check_positive_int
from pipeplan.core.errors import ProfileError
from pipeplan.models.model_spec import ModelSpec, seeded_randn
from pipeplan.models.traced.graph import trace_layers


class ResidualBlock(nn.Module):
    """relu(conv2(relu(conv1(x))) + skip(x)): two branches joined by an add."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)
        self.skip = nn.Conv2d(channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.conv1(x))
        return torch.relu(self.conv2(h) + self.skip(x))


class ResCNN(nn.Module):
    """Stem convolution, residual blocks, global mean pool: (batch, side * side) -> (batch, channels)."""

    def __init__(self, side: int, channels: int, blocks: int) -> None:
        super().__init__()
        self.side = side
        self.stem = nn.Conv2d(1, channels, 3, padding=1)
        self.blocks = nn.ModuleList(ResidualBlock(channels) for _ in range(blocks))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.stem(torch.unflatten(x, 1, (1, self.side, self.side))))
        for block in self.blocks:
            x = block(x)
        return x.mean(dim=(2, 3))


def rescnn(channels: int = 16, blocks: int = 2, in_features: int = 64, seed: int = 0) -> ModelSpec:
    """The `rescnn` MODULE_SPEC (module docstring); MSE loss on a (batch, channels) target with its sample data."""
    check_positive_int(ProfileError, "rescnn option channels", channels)
    check_positive_int(ProfileError, "rescnn option blocks", blocks)
    check_positive_int(ProfileError, "rescnn option in_features", in_features)
    side = math.isqrt(in_features)
    if side * side != in_features:
        raise ProfileError(f"rescnn option in_features must be a square number of pixels (64 = 8 x 8), got {in_features}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = ResCNN(side, channels, blocks)
    layers, names, inputs = trace_layers(net, "rescnn")
    return ModelSpec(
        name=f"rescnn-{blocks}x{channels}",
        layers=layers,
        layer_names=names,
        sample_input=lambda b: seeded_randn((b, in_features), seed=1),
        sample_target=lambda b: seeded_randn((b, channels), seed=2),
        loss_fn=functional.mse_loss,
        layer_inputs=inputs,
    )
