"""BatchNorm where a batch gives it one value per channel: measured with its running statistics.

A BatchNorm layer in training mode normalises each channel by the batch's own mean and variance, which one value per
channel does not define (batch 1 of a BatchNorm1d, or of a BatchNorm2d over a 1x1 map): torch raises "Expected more
than 1 value per channel when training". The profiler measures every size of its curve, batch 1 included, so at
such a call alone the layer runs as in evaluation mode (the running mean and variance it holds): the same
elementwise normalisation, affine transform and output, without the per-channel reduction over the batch and the
update of the running statistics, both of a size proportional to the values, here one per channel. Its running
statistics are left as they were. A training run of such a microbatch would raise as torch does (it is not the
model the user wrote): docs/troubleshooting.md says so.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from pipeplan.core.errors import ProfileError


def one_value_per_channel(x: torch.Tensor) -> bool:
    """True when a BatchNorm input has one value per channel (batch size times the spatial sizes is 1)."""
    return x.dim() >= 2 and x.shape[0] * math.prod(x.shape[2:]) == 1


@contextlib.contextmanager
def single_value_norms(layers: Sequence[nn.Module]) -> Iterator[None]:
    """While inside, every BatchNorm of `layers` in training mode runs a call that has one value per channel as in
    evaluation mode (module docstring); other calls as they are. Hooks removed on leaving.

    Raises:
        ProfileError: such a call of a BatchNorm without running statistics (track_running_stats=False), which
            has nothing to normalise by.
    """
    handles = []

    def before(module: nn.Module, args: tuple[object, ...]) -> None:
        x = args[0] if args else None
        if not module.training or not isinstance(x, torch.Tensor) or not one_value_per_channel(x):
            return
        if module.running_mean is None:
            raise ProfileError(
                f"{type(module).__name__} without running statistics (track_running_stats=False) gets one value per "
                f"channel at input shape {tuple(x.shape)}, which training cannot normalise: profile batch sizes >= 2 "
                "(--batch-sizes)"
            )
        module.train(False)
        module._pipeplan_single = True  # type: ignore[assignment]

    def after(module: nn.Module, args: tuple[object, ...], output: object) -> None:
        if getattr(module, "_pipeplan_single", False):
            del module._pipeplan_single
            module.train(True)

    norms: dict[int, nn.Module] = {}
    for layer in layers:
        for module in layer.modules():
            if isinstance(module, _BatchNorm) and id(module) not in norms:
                norms[id(module)] = module
                handles += [module.register_forward_pre_hook(before), module.register_forward_hook(after)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        for module in norms.values():  # a call that raised between the two hooks
            after(module, (), None)
