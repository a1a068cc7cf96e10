"""Plain one-process torch loops: the references train's multi-process runs are compared with."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any


def charlm_losses(
    options: dict[str, Any], optimizer: Callable[[Iterable[Any]], Any], steps: int = 3, batch: int = 8
) -> list[float]:
    """The losses of `steps` steps of charlm (`options`, float64, seed 0) as one nn.Sequential of its layers, stepped
    by `optimizer` (built over its parameters), each step on the `batch` samples train's batch order gives it."""
    from torch import nn

    from pipeplan.models.build import build_model
    from pipeplan.models.zoo.datasets import batch_indices

    model = build_model("charlm", dict(options), "auto", "float64", seed=0)
    whole = nn.Sequential(*model.layers)
    step_with = optimizer(whole.parameters())
    losses = []
    for step in range(steps):
        idx = batch_indices(len(model.dataset), batch, step, 0)
        step_with.zero_grad()
        loss = model.loss_fn(whole(model.dataset.inputs[idx]), model.dataset.targets[idx])
        loss.backward()
        step_with.step()
        losses.append(float(loss.detach()))
    return losses
