"""The profiler's timing rounds: every layer as a one-layer runtime stage in chain order, and the whole chain.

See profiler/measure.py's module docstring (step 3) for the method.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import torch
from torch import nn

from pipeplan.core.units import s_to_ms
from pipeplan.models.stage import LossFn, StageModule
from pipeplan.models.traced.graph import run_layers

Loss = tuple[LossFn, torch.Tensor]
"""A loss function and the batch of targets it is given with the last layer's output."""


class ChainTimer:
    """Times every layer as a one-layer runtime stage, in chain order (profiler/measure.py's module docstring, step 3)."""

    def __init__(
        self,
        layers: Sequence[nn.Module],
        x0: torch.Tensor,
        last_grad: torch.Tensor,
        sync: Callable[[], None],
        split: bool,
        loss: Loss | None = None,
    ) -> None:
        # with a loss the last layer's stage computes it, as a training run's last stage does: its F and B include it
        self.x0, self.sync, self.loss = x0, sync, loss
        self.last_grad = None if loss is not None else last_grad
        last = len(layers) - 1
        ends = loss is not None
        self.stages = [StageModule(i, [layer], i == 0, ends and i == last, False) for i, layer in enumerate(layers)]
        self.split_stages = (
            [StageModule(i, [layer], i == 0, ends and i == last, True) for i, layer in enumerate(layers)] if split else []
        )
        self.samples: dict[str, list[list[float]]] = {op: [[] for _ in layers] for op in "FBIW"}
        self.last = last

    def close(self) -> None:
        """Remove the split stages' hooks from the layers."""
        for stage in self.split_stages:
            stage.close()

    def _forward(self, stages: list[StageModule], keep: bool) -> None:
        x = self.x0.clone()  # a first layer may change its input in place: every round gets the same one
        for i, stage in enumerate(stages):
            self.sync()
            t0 = time.perf_counter()
            target, loss_fn = (self.loss[1], self.loss[0]) if self.loss is not None and i == self.last else (None, None)
            x = stage.forward(0, x, target, loss_fn, 1.0)
            self.sync()
            if keep:
                self.samples["F"][i].append(s_to_ms(time.perf_counter() - t0))

    def _backward(self, op: str, keep: bool) -> None:
        grad: torch.Tensor | None = self.last_grad
        stages = self.stages if op == "B" else self.split_stages
        for i in range(self.last, -1, -1):
            self.sync()
            t0 = time.perf_counter()
            if op == "B":
                grad = stages[i].backward(0, grad)
            elif op == "I":
                grad = stages[i].backward_input(0, grad)
            else:
                stages[i].backward_weight(0)
            self.sync()
            if keep:
                self.samples[op][i].append(s_to_ms(time.perf_counter() - t0))

    def round(self, keep: bool) -> None:
        """One timing round: F then B over the chain; with split also F, every I, then every W."""
        self._forward(self.stages, keep)
        self._backward("B", keep)
        if self.split_stages:
            self._forward(self.split_stages, False)
            self._backward("I", keep)
            self._backward("W", keep)


def time_step(
    forward: Callable[[], torch.Tensor], x: torch.Tensor, grad: torch.Tensor | None, sync: Callable[[], None]
) -> tuple[float, float]:
    """Milliseconds of forward() and of the backward of its output with grad (None: a scalar loss)."""
    sync()
    t0 = time.perf_counter()
    out = forward()
    sync()
    t1 = time.perf_counter()
    if out.requires_grad:
        torch.autograd.backward(out, grad)
        sync()
    t2 = time.perf_counter()
    x.grad = None
    return s_to_ms(t1 - t0), s_to_ms(t2 - t1)


def run_chain(
    layers: Sequence[nn.Module], x: torch.Tensor, loss: Loss | None = None, inputs: Sequence[Sequence[int]] | None = None
) -> torch.Tensor:
    """Compose layers on x (a graph's by their `inputs`, models.traced.graph), then the loss when given."""
    x = run_layers(layers, inputs, x)[-1]
    return x if loss is None else loss[0](x, loss[1])


def median(samples: list[float]) -> float:
    """Median of samples; 0.0 when there are none (timing skipped)."""
    return statistics.median(samples) if samples else 0.0
