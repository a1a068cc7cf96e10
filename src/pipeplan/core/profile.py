"""Per-layer costs of a model: the planner's and simulator's view of a DNN."""

from __future__ import annotations

from dataclasses import dataclass

from pipeplan.core.checks import check_nonneg_float, check_positive_int
from pipeplan.core.errors import ProfileError


@dataclass(frozen=True, slots=True)
class LayerProfile:
    """Costs of one layer for one batch of `ModelProfile.batch_size` samples on the reference device.

    `activation_bytes` is the layer's output; `saved_bytes` what autograd keeps
    for backward (None: same as activation_bytes). `flops` and `bytes_moved`
    (one batch, forward + backward) are optional counts a profiler may record
    for roofline projection onto another GPU; None when unknown.
    """

    name: str
    fwd_ms: float
    bwd_ms: float
    activation_bytes: float
    param_bytes: float
    saved_bytes: float | None = None
    flops: float | None = None
    bytes_moved: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ProfileError(f"layer name must be a non-empty string, got {self.name!r}")
        for field in ("fwd_ms", "bwd_ms", "activation_bytes", "param_bytes"):
            object.__setattr__(
                self, field, check_nonneg_float(ProfileError, f"layer {self.name!r} {field}", getattr(self, field))
            )
        saved = self.activation_bytes if self.saved_bytes is None else self.saved_bytes
        object.__setattr__(self, "saved_bytes", check_nonneg_float(ProfileError, f"layer {self.name!r} saved_bytes", saved))
        for field in ("flops", "bytes_moved"):
            value = getattr(self, field)
            if value is not None:
                object.__setattr__(self, field, check_nonneg_float(ProfileError, f"layer {self.name!r} {field}", value))


@dataclass(frozen=True, slots=True)
class ModelProfile:
    """A model as a chain of layers; `cut_bytes[i]` crosses a cut between layer i and i+1.

    `cut_bytes` has len(layers) - 1 entries (None: each layer's activation_bytes).
    `measured` is False when times were projected onto the reference device.
    """

    name: str
    batch_size: int
    layers: tuple[LayerProfile, ...]
    reference_device: str = "unknown"
    cut_bytes: tuple[float, ...] | None = None
    measured: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ProfileError(f"profile name must be a non-empty string, got {self.name!r}")
        check_positive_int(ProfileError, f"profile {self.name!r} batch_size", self.batch_size)
        if not isinstance(self.layers, tuple) or not self.layers:
            raise ProfileError(f"profile {self.name!r} must have at least one layer, got {len(self.layers or ())}")
        if not all(isinstance(layer, LayerProfile) for layer in self.layers):
            raise ProfileError(f"profile {self.name!r} layers must be LayerProfile values")
        cuts = self.cut_bytes
        if cuts is None:
            cuts = tuple(layer.activation_bytes for layer in self.layers[:-1])
        if len(cuts) != len(self.layers) - 1:
            raise ProfileError(
                f"profile {self.name!r} cut_bytes must have {len(self.layers) - 1} entries "
                f"(one per cut between layers), got {len(cuts)}"
            )
        cuts = tuple(check_nonneg_float(ProfileError, f"profile {self.name!r} cut_bytes[{i}]", c) for i, c in enumerate(cuts))
        object.__setattr__(self, "cut_bytes", cuts)

    @property
    def num_layers(self) -> int:
        """Number of layers in the chain."""
        return len(self.layers)

    @property
    def total_fwd_ms(self) -> float:
        """Sum of forward times of all layers for one profile batch."""
        return sum(layer.fwd_ms for layer in self.layers)

    @property
    def total_bwd_ms(self) -> float:
        """Sum of backward times of all layers for one profile batch."""
        return sum(layer.bwd_ms for layer in self.layers)

    @property
    def total_param_bytes(self) -> float:
        """Sum of parameter bytes of all layers."""
        return sum(layer.param_bytes for layer in self.layers)
