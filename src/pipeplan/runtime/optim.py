"""The optimizers `pipeplan train` steps with, by name (runtime.options.OPTIMIZERS)."""

from __future__ import annotations

from collections.abc import Iterable

import torch

MOMENTUM = 0.9
"""SGD's momentum under `sgd_momentum` (as the profiler times it: profiler.curves.OPTIMIZERS)."""


def make_optimizer(name: str, params: Iterable[torch.Tensor], lr: float) -> torch.optim.Optimizer:
    """Adam, plain SGD or SGD with momentum over `params` at learning rate `lr` (names checked by runtime.options)."""
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    if name == "sgd_momentum":
        return torch.optim.SGD(params, lr=lr, momentum=MOMENTUM)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    raise ValueError(f"unknown optimizer {name!r}")


def warm_up(name: str) -> None:
    """Step a throwaway optimizer of kind `name` once: torch imports and sets up much of an optimizer's machinery
    on its first step (over half a second on a CPU), which an asynchronous pipeline would otherwise pay stage after
    stage, in turn, stalling the others."""
    scratch = torch.zeros(1, requires_grad=True)
    scratch.grad = torch.zeros(1)
    make_optimizer(name, [scratch], 0.0).step()
