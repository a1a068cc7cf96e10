"""The optimizers `pipeplan train` steps with, by name (runtime.options.OPTIMIZERS)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypeVar

import torch

T = TypeVar("T", bound=torch.Tensor)

MOMENTUM = 0.9
"""SGD's momentum under `sgd_momentum` (as the profiler times it: profiler.curves.OPTIMIZERS)."""


@dataclass(frozen=True, slots=True)
class RateSchedule:
    """The base learning rate α_k of step k (0-based) of a run of `total` steps (`kind` in options.LR_SCHEDULES).

    constant: α_k = lr. cosine: α_k = lr (1 + cos(π k / total)) / 2, from lr at the first step towards 0 at the
    end (the annealing both synchronous and asynchronous runs train under; PipeMare's rescheduling divides it).
    """

    lr: float
    kind: str = "constant"
    total: int = 1

    def at(self, step: int) -> float:
        """α_k at step `step`; past the run's end, the last step's rate."""
        if self.kind == "constant":
            return self.lr
        if self.kind == "cosine":
            k = min(max(step, 0), self.total - 1)
            return self.lr * 0.5 * (1.0 + math.cos(math.pi * k / self.total))
        raise ValueError(f"unknown learning-rate schedule {self.kind!r}")

    def apply(self, optimizer: torch.optim.Optimizer, step: int) -> None:
        """Set every parameter group of `optimizer` to the rate of step `step`."""
        set_rate(optimizer, self.at(step))


def set_rate(optimizer: torch.optim.Optimizer, rate: float) -> None:
    """Set every parameter group of `optimizer` to learning rate `rate`."""
    for group in optimizer.param_groups:
        group["lr"] = rate


def distinct(params: Iterable[T]) -> list[T]:
    """Each parameter once, in first-seen order, by identity: a tied weight that two stages of one process hold is
    one tensor, stepped once (an optimizer given it twice would step it twice)."""
    seen: set[int] = set()
    out = []
    for p in params:
        if id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


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
