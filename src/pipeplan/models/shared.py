"""Parameters that more than one layer uses: tied embeddings, shared blocks (the one place they are found).

A model's layers are its own module objects, so a parameter tied between two
layers (GPT-2's `lm_head.weight` is `wte.weight`) is the same `nn.Parameter`
object in both. `shared_parameters` finds every such object once, by identity,
with the ascending layers that hold it; a parameter used twice inside one
layer is not shared between layers. Profiles count each one once, the planner
prices the gradient exchange between the stages holding copies, and the
runtime performs it (docs/architecture.md, "Shared parameters").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn


@dataclass(frozen=True, slots=True)
class SharedParameter:
    """One parameter held by several layers: its name in the first layer that holds it, the layers, its size."""

    name: str
    layers: tuple[int, ...]
    numel: int
    nbytes: int


def shared_parameters(layers: Sequence[nn.Module], names: Sequence[str]) -> tuple[SharedParameter, ...]:
    """Every parameter object that two or more of `layers` hold, in the order of its first holder and name there.

    `names[i]` names `layers[i]`; a shared parameter is named `<layer name>.<parameter path>` after its first holder.
    """
    holders: dict[int, list[int]] = {}
    first: dict[int, tuple[str, nn.Parameter]] = {}
    for index, layer in enumerate(layers):
        for path, param in layer.named_parameters(remove_duplicate=True):
            key = id(param)
            if key not in holders:
                holders[key] = []
                first[key] = (f"{names[index]}.{path}", param)
            if not holders[key] or holders[key][-1] != index:
                holders[key].append(index)
    out = []
    for key, where in holders.items():
        if len(where) > 1:
            name, param = first[key]
            out.append(SharedParameter(name, tuple(where), param.numel(), param.numel() * param.element_size()))
    return tuple(out)
