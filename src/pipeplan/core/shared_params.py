"""Parameters held by several layers of a profile (tied embeddings, shared blocks): one group per parameter.

Each layer's `param_bytes` counts every parameter the layer holds, a shared
one included, so a group's bytes are in the `param_bytes` of each of its
layers. A device holds one copy of a parameter however many of its layers
hold it: a set of layers holds the sum of their `param_bytes` less
`overlap_bytes` (each group's bytes once per member beyond the first). When a
group's layers are on different stages, each of those stages holds a copy
and the copies' gradients are summed every iteration (sim.cost.shared).
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from pipeplan.core.checks import check_nonneg_float
from pipeplan.core.errors import ProfileError
from pipeplan.core.limits import BLOCK_BYTES


@dataclass(frozen=True, slots=True)
class SharedGroup:
    """One parameter that the layers `layers` (ascending indices, at least two) all hold; `param_bytes` its size."""

    name: str
    layers: tuple[int, ...]
    param_bytes: float

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ProfileError(f"shared parameter name must be a non-empty string, got {self.name!r}")
        where = f"shared parameter {self.name!r}"
        if not isinstance(self.layers, tuple) or len(self.layers) < 2:
            raise ProfileError(f"{where} layers must list at least 2 layer indices, got {_listed(self.layers)}")
        for u in self.layers:
            if isinstance(u, bool) or not isinstance(u, int) or u < 0:
                raise ProfileError(f"{where} layers must be layer indices >= 0, got {u!r}")
        if any(a >= b for a, b in itertools.pairwise(self.layers)):
            raise ProfileError(f"{where} layers must be ascending without repeats, got {list(self.layers)}")
        nbytes = check_nonneg_float(ProfileError, f"{where} param_bytes", self.param_bytes, BLOCK_BYTES)
        object.__setattr__(self, "param_bytes", nbytes)


def _listed(value: object) -> str:
    return repr(list(value)) if isinstance(value, (tuple, list)) else repr(value)


def check_groups(groups: object, layers: Sequence[tuple[str, float]], where: str) -> tuple[SharedGroup, ...]:
    """`groups` as a tuple when each is a SharedGroup whose layers exist, names are unique and every layer holds at
    least the groups it is in (`layers`: each layer's (name, param_bytes)); else a ProfileError naming `where`."""
    if not isinstance(groups, tuple) or not all(isinstance(g, SharedGroup) for g in groups):
        raise ProfileError(f"{where} shared_params must be a tuple of SharedGroup values, got {groups!r}")
    names = [g.name for g in groups]
    if len(set(names)) != len(names):
        twice = next(n for n in names if names.count(n) > 1)
        raise ProfileError(f"{where} shared_params names {twice!r} twice (one group per parameter)")
    held = [0.0] * len(layers)
    for g in groups:
        if g.layers[-1] >= len(layers):
            raise ProfileError(
                f"{where} shared parameter {g.name!r} names layer {g.layers[-1]}, but the profile has layers 0..{len(layers) - 1}"
            )
        for u in g.layers:
            held[u] += g.param_bytes
    for (name, param_bytes), shared in zip(layers, held, strict=True):
        if shared > param_bytes * (1 + 1e-12):
            raise ProfileError(
                f"{where} layer {name!r} holds shared parameters of {shared:.0f} bytes but its param_bytes is "
                f"{param_bytes:.0f} (a layer's param_bytes counts every parameter it holds)"
            )
    return groups


def overlap_bytes(groups: Sequence[SharedGroup], layers: Collection[int]) -> float:
    """Bytes that `layers` (a set of layer indices) would count more than once: per group, its bytes times the
    number of its members in the set beyond the first."""
    extra = 0.0
    for g in groups:
        count = sum(1 for u in g.layers if u in layers)
        if count > 1:
            extra += (count - 1) * g.param_bytes
    return extra


def span_overlap_bytes(groups: Sequence[SharedGroup], first: int, last: int) -> float:
    """overlap_bytes of the contiguous layers first..last."""
    extra = 0.0
    for g in groups:
        count = sum(1 for u in g.layers if first <= u <= last)
        if count > 1:
            extra += (count - 1) * g.param_bytes
    return extra


def first_holder_params(param_bytes: Sequence[float], groups: Sequence[SharedGroup]) -> list[float]:
    """Each layer's param_bytes with every group's bytes taken from all its members but the first: the sum over any
    set of layers is at most what that set holds (a lower bound per layer, for planners' bounds)."""
    out = [float(p) for p in param_bytes]
    for g in groups:
        for u in g.layers[1:]:
            out[u] = max(0.0, out[u] - g.param_bytes)
    return out


def holding_stages(group: SharedGroup, stage_of_layer: Sequence[int]) -> tuple[int, ...]:
    """The stages (ascending) that hold a copy of `group`, given each layer's stage."""
    return tuple(sorted({stage_of_layer[u] for u in group.layers}))
