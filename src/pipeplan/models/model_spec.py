"""ModelSpec: a model as an ordered chain of blocks with sample inputs, targets and loss; seeded sample tensors.

A ModelSpec is what the profiler measures and what the runtime splits into
stages (models.specs resolves a MODULE_SPEC name into one; the built-in
factories build them).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch
from torch import nn

from pipeplan.core.errors import ProfileError

SampleFn = Callable[[int], torch.Tensor]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class ModelSpec:
    """A model as an ordered chain of blocks, with a way to make a batch of inputs (and targets) for it.

    `layer_names[i]` names `layers[i]` in profiles. `sample_target` and
    `loss_fn` are None when the spec defines no training loss. `layer_inputs`
    (None: a chain) makes it a graph (models.traced.graph): layer i is called with
    the outputs of the layers `layer_inputs[i]` (earlier ones, ascending), a
    layer with none with the model's input; the last layer is the output.
    `recapture(dtype)` (a model captured with torch.export, models.traced.capture)
    converts the model and captures it again: an export fixes the dtypes its
    graph casts to, so `cast` re-exports rather than converting the layers.
    """

    name: str
    layers: tuple[nn.Module, ...]
    layer_names: tuple[str, ...]
    sample_input: SampleFn
    sample_target: SampleFn | None = None
    loss_fn: LossFn | None = None
    layer_inputs: tuple[tuple[int, ...], ...] | None = None
    recapture: Callable[[torch.dtype], tuple[nn.Module, ...]] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ProfileError(f"model spec name must be a non-empty string, got {self.name!r}")
        layers = tuple(self.layers)
        if not layers:
            raise ProfileError(f"model spec {self.name!r} has no layers")
        for i, layer in enumerate(layers):
            if not isinstance(layer, nn.Module):
                raise ProfileError(f"model spec {self.name!r} layers[{i}] must be an nn.Module, got {type(layer).__name__}")
        names = tuple(self.layer_names)
        if len(names) != len(layers):
            raise ProfileError(f"model spec {self.name!r} has {len(layers)} layers but {len(names)} layer_names")
        if len(set(names)) != len(names) or not all(isinstance(n, str) and n for n in names):
            raise ProfileError(f"model spec {self.name!r} layer_names must be distinct non-empty strings, got {names!r}")
        object.__setattr__(self, "layers", layers)
        object.__setattr__(self, "layer_names", names)
        if self.layer_inputs is not None:
            self._check_inputs()

    def _check_inputs(self) -> None:
        """layer_inputs: one ascending tuple of earlier layer indices per layer."""
        inputs = self.layer_inputs
        if not isinstance(inputs, tuple) or len(inputs) != len(self.layers):
            raise ProfileError(f"model spec {self.name!r} layer_inputs must have one entry per layer ({len(self.layers)})")
        for i, sources in enumerate(inputs):
            if not isinstance(sources, tuple) or list(sources) != sorted(set(sources)) or any(not 0 <= s < i for s in sources):
                raise ProfileError(
                    f"model spec {self.name!r} layer {self.layer_names[i]!r} inputs must be earlier layers, ascending, "
                    f"got {sources!r}"
                )

    def sequential(self) -> nn.Module:
        """The whole model as one module sharing this spec's layer objects (an unpipelined reference)."""
        if self.layer_inputs is None:
            return nn.Sequential(*self.layers)
        from pipeplan.models.traced.graph import GraphNet

        return GraphNet(self.layers, self.layer_inputs)

    def cast(self, dtype: torch.dtype) -> ModelSpec:
        """Convert the layers' floating-point parameters and buffers to dtype in place; floating sample inputs follow.

        Integer inputs (token ids) and targets are left as they are. A captured model (`recapture`) is converted
        and captured again in dtype: new layer objects with the same names and inputs.
        """
        layers = self.layers
        if self.recapture is not None and any(
            p.is_floating_point() and p.dtype != dtype for layer in layers for p in layer.parameters()
        ):
            layers = self.recapture(dtype)
        for layer in layers:
            layer.to(dtype)
        base = self.sample_input

        def sample_input(batch_size: int) -> torch.Tensor:
            x = base(batch_size)
            return x.to(dtype) if x.is_floating_point() else x

        return replace(self, layers=layers, sample_input=sample_input)


def seeded_randn(shape: Sequence[int], seed: int = 0) -> torch.Tensor:
    """A standard normal float32 tensor of shape, the same every call (its own generator)."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def seeded_randint(high: int, shape: Sequence[int], seed: int = 0) -> torch.Tensor:
    """Integers in [0, high) of shape, the same every call (its own generator)."""
    return torch.randint(0, high, tuple(shape), generator=torch.Generator().manual_seed(seed))
