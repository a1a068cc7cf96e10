"""Parameters that more than one layer uses: tied embeddings, shared blocks (the one place they are found).

A model's layers are its own module objects, so a parameter tied between two
layers (GPT-2's `lm_head.weight` is `wte.weight`) is the same `nn.Parameter`
object in both. `holdings` finds every tensor object (parameter, and with
`buffers` buffer) once, by identity, with the ascending layers that hold it;
`shared_parameters` keeps the parameters held by two or more layers (a
parameter used twice inside one layer is not shared between layers), and the
runtime's whole-model state (runtime.execution.whole_model) gives each tensor
to its first holder. Profiles count each one once, the planner
prices the gradient exchange between the stages holding copies, and the
runtime performs it (docs/architecture.md, "Shared parameters").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn


@dataclass(frozen=True, slots=True)
class SharedParameter:
    """One parameter held by several layers: its name in the first layer that holds it, the layers, its size."""

    name: str
    layers: tuple[int, ...]
    numel: int
    nbytes: int


@dataclass(slots=True)
class Holding:
    """One tensor object of the layers: the tensor, its path in its first holder, and the ascending layers holding it."""

    tensor: torch.Tensor
    path: str
    layers: list[int] = field(default_factory=list)


def holdings(layers: Sequence[nn.Module], buffers: bool = False) -> dict[int, Holding]:
    """Every parameter object (and with `buffers`, buffer object) of `layers`, keyed by id, once each, in the order of
    its first holder and its path there (a layer's parameters before its buffers)."""
    out: dict[int, Holding] = {}
    for index, layer in enumerate(layers):
        named = list(layer.named_parameters(remove_duplicate=True))
        if buffers:
            named += list(layer.named_buffers(remove_duplicate=True))
        for path, tensor in named:
            holding = out.setdefault(id(tensor), Holding(tensor, path))
            if not holding.layers or holding.layers[-1] != index:
                holding.layers.append(index)
    return out


def shared_parameters(layers: Sequence[nn.Module], names: Sequence[str]) -> tuple[SharedParameter, ...]:
    """Every parameter object that two or more of `layers` hold, in the order of its first holder and name there.

    `names[i]` names `layers[i]`; a shared parameter is named `<layer name>.<parameter path>` after its first holder.
    """
    out = []
    for h in holdings(layers).values():
        if len(h.layers) > 1:
            numel = h.tensor.numel()
            out.append(SharedParameter(f"{names[h.layers[0]]}.{h.path}", tuple(h.layers), numel, numel * h.tensor.element_size()))
    return tuple(out)
