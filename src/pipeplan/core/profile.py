"""Per-layer costs of a model: the planner's and simulator's view of a DNN.

A profile holds each layer's costs at its `batch_size` and, when it was
measured at several batch sizes, the same values at every size of
`batch_sizes` (a `LayerCurve` per layer). How times follow the microbatch
size between and beyond those sizes is the cost model's business
(`sim.cost.layers`), not the profile's. One layer's values are
core.layer_profile's (LayerProfile, LayerCurve: importable from here too).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from pipeplan.core.checks import check_nonneg_float, check_positive_int
from pipeplan.core.errors import ProfileError
from pipeplan.core.layer_profile import CURVE_FIELDS, LayerCurve, LayerProfile, SplitTiming, TensorSplit, field_limit
from pipeplan.core.limits import BATCH, BATCH_SIZES, BLOCK_BYTES, LAYERS
from pipeplan.core.shared_params import SharedGroup, check_groups, overlap_bytes

MAIN_GRADS = ("weights", "fp32", "fp32_copy")
"""ModelProfile.main_grads: the gradients in the working weights' dtype, in fp32 beside 16-bit weights, or 16-bit
with an fp32 copy for the update."""

__all__ = [
    "CURVE_FIELDS", "MAIN_GRADS", "LayerCurve", "LayerProfile", "ModelProfile", "ProfileSource", "SharedGroup",
    "SplitTiming", "TensorSplit",
    "check_batch_sizes", "field_limit", "live_cuts",
]  # fmt: skip


def check_batch_sizes(sizes: object, where: str) -> tuple[int, ...]:
    """`sizes` as a tuple when they are integers >= 1 that strictly increase, else a ProfileError naming `where`."""
    if not isinstance(sizes, (tuple, list)) or not sizes:
        raise ProfileError(f"{where} must be a non-empty list of integers >= 1, got {sizes!r}")
    BATCH_SIZES.check(ProfileError, where, len(sizes))
    for i, b in enumerate(sizes):
        check_positive_int(ProfileError, f"{where}[{i}]", b)
        BATCH.check(ProfileError, f"{where}[{i}]", b)
    if any(b >= c for b, c in itertools.pairwise(sizes)):
        raise ProfileError(f"{where} must be strictly increasing (no repeats), got {list(sizes)}")
    return tuple(sizes)


def live_cuts(values: Sequence[float], inputs: Sequence[Sequence[int]]) -> tuple[float, ...]:
    """Per boundary k (after position k, k < n - 1): the sum of `values` of the live set, layers at positions <= k with a
    consumer after k. Positions are indices here (`inputs` in that order); the rule of core.dag."""
    n = len(values)
    last = [-1] * n
    for v, sources in enumerate(inputs):
        for u in sources:
            last[u] = max(last[u], v)
    delta = [0.0] * (n + 1)
    for u in range(n):
        if last[u] > u:
            delta[u] += values[u]
            delta[last[u]] -= values[u]
    cuts: list[float] = []
    running = 0.0
    for k in range(n - 1):
        running += delta[k]
        cuts.append(max(running, 0.0))  # float sums of exact byte counts; never below 0
    return tuple(cuts)


@dataclass(frozen=True, slots=True)
class ProfileSource:
    """How a measured profile's model was built (`pipeplan profile`), so `pipeplan probe` can build it again, and the
    numbers it was measured in: `dtype` of the weights and `precision` of the compute (core.precision)."""

    module: str
    options: tuple[tuple[str, str], ...] = ()
    dataset: str = "auto"
    dtype: str = "float32"
    precision: str = "full"

    def __post_init__(self) -> None:
        for field in ("module", "dataset", "dtype", "precision"):
            value = getattr(self, field)
            if not isinstance(value, str) or not value:
                raise ProfileError(f"profile source {field} must be a non-empty string, got {value!r}")
        for pair in self.options:
            if not (isinstance(pair, tuple) and len(pair) == 2 and all(isinstance(v, str) for v in pair) and pair[0]):
                raise ProfileError(f"profile source options must be (name, value) strings, got {pair!r}")


@dataclass(frozen=True, slots=True)
class ModelProfile:
    """A model as a chain of layers; `cut_bytes[i]` crosses a cut between layer i and i+1.

    `cut_bytes` has len(layers) - 1 entries (None: each layer's activation_bytes; for a DAG the live sets of
    `layer_inputs`).
    `measured` is False when times were projected onto the reference device.
    `batch_sizes` lists every size the layers were measured at, strictly
    increasing and including `batch_size` (None: `batch_size` only); each
    layer then has a `curve` and `cut_curves[i]` gives cut i at every size.
    `threads` is the CPU thread count the times were measured with (None:
    not recorded); `source` how the model was built (None: unknown).
    `layer_inputs[i]` lists the layers whose outputs layer i consumes, each
    an earlier index, ascending (layers are stored in a topological order of
    the model's DAG); None means a chain (layer i consumes layer i - 1), and
    inputs that describe exactly a chain are stored as None. The cut bytes
    of a DAG are those of its live sets (core.dag).
    `shared_params` lists the parameters several layers hold (core.shared_params): each
    layer's param_bytes counts them, and a set of layers holds each once.
    `master_copy` says how the parameters are held. False: the weights are the master copy, as the runtime trains
    them (float32 or float64 weights and gradients). True: mixed precision as ZeRO and Megatron-LM hold it, a
    16-bit working copy of the weights and of their gradients on the device and a 32-bit master copy of the
    weights with the optimizer's state; `param_bytes` then counts the master copy (4 bytes per parameter), so a
    device holds per parameter byte 1/2 (16-bit weights) + 1/2 (16-bit gradients) + 1 (master) + the optimizer's
    state, the same 2 + optimizer factor as without, and ZeRO shards the master copy with the optimizer's state
    (sim.cost.holding.Holding.sharded).
    `main_grads` says which gradients the update reads (MAIN_GRADS): "weights" (the default), gradients in the
    working weights' dtype (16-bit under master_copy: ZeRO's layout); under master_copy also "fp32", gradients
    accumulated and reduced in 32 bits beside the 16-bit weights (Megatron-LM's main grads under bf16: 18 bytes per
    parameter with Adam, and the data-parallel exchange moves 4 bytes per parameter, not 2), or "fp32_copy", 16-bit
    gradients reduced in 16 bits and copied to fp32 for the update, a copy sharded with the optimizer's state
    (Megatron-LM under fp16: 20 bytes per parameter). sim.cost.holding prices each.
    """

    name: str
    batch_size: int
    layers: tuple[LayerProfile, ...]
    reference_device: str = "unknown"
    cut_bytes: tuple[float, ...] | None = None
    measured: bool = True
    batch_sizes: tuple[int, ...] | None = None
    cut_curves: tuple[tuple[float, ...], ...] | None = None
    threads: int | None = None
    source: ProfileSource | None = None
    layer_inputs: tuple[tuple[int, ...], ...] | None = None
    shared_params: tuple[SharedGroup, ...] = ()
    master_copy: bool = False
    main_grads: str = "weights"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ProfileError(f"profile name must be a non-empty string, got {self.name!r}")
        check_positive_int(ProfileError, f"profile {self.name!r} batch_size", self.batch_size)
        BATCH.check(ProfileError, f"profile {self.name!r} batch_size", self.batch_size)
        if not isinstance(self.layers, tuple) or not self.layers:
            raise ProfileError(f"profile {self.name!r} must have at least one layer, got {len(self.layers or ())}")
        LAYERS.check(ProfileError, f"profile {self.name!r}", len(self.layers))
        if not all(isinstance(layer, LayerProfile) for layer in self.layers):
            raise ProfileError(f"profile {self.name!r} layers must be LayerProfile values")
        self._check_inputs()
        cuts = self.cut_bytes
        if cuts is None and self.layer_inputs is not None:
            cuts = live_cuts([layer.activation_bytes for layer in self.layers], self.layer_inputs)
        elif cuts is None:
            cuts = tuple(layer.activation_bytes for layer in self.layers[:-1])
        if len(cuts) != len(self.layers) - 1:
            raise ProfileError(
                f"profile {self.name!r} cut_bytes must have {len(self.layers) - 1} entries "
                f"(one per cut between layers), got {len(cuts)}"
            )
        cuts = tuple(
            check_nonneg_float(ProfileError, f"profile {self.name!r} cut_bytes[{i}]", c, BLOCK_BYTES) for i, c in enumerate(cuts)
        )
        object.__setattr__(self, "cut_bytes", cuts)
        if self.threads is not None:
            check_positive_int(ProfileError, f"profile {self.name!r} threads", self.threads)
        if self.source is not None and not isinstance(self.source, ProfileSource):
            raise ProfileError(f"profile {self.name!r} source must be a ProfileSource, got {type(self.source).__name__}")
        self._check_curves()
        for layer in self.layers:
            for timing in () if layer.tp is None else layer.tp.timed:
                if len(timing.fwd_ms) != len(self.sizes):
                    raise ProfileError(
                        f"profile {self.name!r} layer {layer.name!r} tp timed at tp {timing.tp} has "
                        f"{len(timing.fwd_ms)} values, not one per batch size ({len(self.sizes)})"
                    )
        check_groups(self.shared_params, [(x.name, x.param_bytes) for x in self.layers], f"profile {self.name!r}")
        if not isinstance(self.master_copy, bool):
            raise ProfileError(f"profile {self.name!r} master_copy must be true or false, got {self.master_copy!r}")
        if self.main_grads not in MAIN_GRADS:
            raise ProfileError(
                f"profile {self.name!r} main_grads must be one of {', '.join(map(repr, MAIN_GRADS))}, got {self.main_grads!r}"
            )
        if self.main_grads != "weights" and not self.master_copy:
            raise ProfileError(
                f"profile {self.name!r} main_grads {self.main_grads!r} needs master_copy true (without a master copy "
                "the gradients have the weights' dtype)"
            )

    def _check_inputs(self) -> None:
        """layer_inputs: one ascending tuple of earlier layer indices per layer; a chain's stored as None."""
        inputs = self.layer_inputs
        if inputs is None:
            return
        if not isinstance(inputs, tuple) or len(inputs) != len(self.layers):
            got = len(inputs) if isinstance(inputs, (tuple, list)) else repr(inputs)
            raise ProfileError(
                f"profile {self.name!r} layer_inputs must have {len(self.layers)} entries (one per layer), got {got}"
            )
        for i, sources in enumerate(inputs):
            where = f"profile {self.name!r} layer {i} ({self.layers[i].name})"
            if not isinstance(sources, tuple):
                raise ProfileError(f"{where} inputs must be a tuple of layer indices, got {sources!r}")
            for u in sources:
                if isinstance(u, bool) or not isinstance(u, int) or not 0 <= u < i:
                    raise ProfileError(
                        f"{where} names input {u!r}, not an earlier layer 0..{i - 1} (layers are stored in a "
                        "topological order: every input comes before its consumer)"
                    )
            if any(a >= b for a, b in itertools.pairwise(sources)):
                raise ProfileError(f"{where} inputs must be ascending without repeats, got {list(sources)}")
        if all(sources == ((i - 1,) if i else ()) for i, sources in enumerate(inputs)):
            object.__setattr__(self, "layer_inputs", None)

    def _check_curves(self) -> None:
        """batch_sizes strictly increasing and holding batch_size; every layer's curve (and cut) agrees with it."""
        sizes = self.batch_sizes
        if sizes is None:
            if any(layer.curve is not None for layer in self.layers) or self.cut_curves is not None:
                raise ProfileError(f"profile {self.name!r} has per-size curves but no batch_sizes")
            return
        where = f"profile {self.name!r} batch_sizes"
        if not isinstance(sizes, tuple):
            raise ProfileError(f"{where} must be a non-empty list of integers >= 1, got {sizes!r}")
        check_batch_sizes(sizes, where)
        if self.batch_size not in sizes:
            raise ProfileError(f"{where} {list(sizes)} must include the profile's batch_size {self.batch_size}")
        at = sizes.index(self.batch_size)
        for layer in self.layers:
            if layer.curve is None:
                raise ProfileError(f"profile {self.name!r} layer {layer.name!r} has no curve for batch_sizes {list(sizes)}")
            layer.curve.check(layer.name, len(sizes))
            for field in CURVE_FIELDS:
                values = getattr(layer.curve, field)
                scalar = getattr(layer, field)
                if values is None:
                    if scalar is not None and field in ("bwd_input_ms", "bwd_weight_ms"):
                        raise ProfileError(f"profile {self.name!r} layer {layer.name!r} has {field} but no curve of it")
                    continue
                if scalar != values[at]:
                    raise ProfileError(
                        f"profile {self.name!r} layer {layer.name!r} {field} is {scalar!r} but its curve gives "
                        f"{values[at]!r} at batch_size {self.batch_size}"
                    )
            shared = layer.curve.shared_bytes[at] if layer.curve.shared_bytes is not None else 0.0
            if layer.shared_bytes != shared:
                raise ProfileError(
                    f"profile {self.name!r} layer {layer.name!r} shared_bytes is {layer.shared_bytes!r} but its curve "
                    f"gives {shared!r} at batch_size {self.batch_size}"
                )
        curves = self.cut_curves
        if curves is None or len(curves) != len(self.layers) - 1:
            got = "none" if curves is None else len(curves)
            raise ProfileError(f"profile {self.name!r} cut_curves must have {len(self.layers) - 1} entries, got {got}")
        for i, (curve, cut) in enumerate(zip(curves, self.cut_bytes or (), strict=True)):
            if not isinstance(curve, tuple) or len(curve) != len(sizes):
                raise ProfileError(f"profile {self.name!r} cut_curves[{i}] must have {len(sizes)} values (one per batch size)")
            for j, value in enumerate(curve):
                check_nonneg_float(ProfileError, f"profile {self.name!r} cut_curves[{i}][{j}]", value, BLOCK_BYTES)
            if curve[at] != cut:
                raise ProfileError(f"profile {self.name!r} cut_bytes[{i}] is {cut!r} but cut_curves[{i}] gives {curve[at]!r}")

    @property
    def sizes(self) -> tuple[int, ...]:
        """The batch sizes the layers were measured at (just `batch_size` for a one-size profile)."""
        return self.batch_sizes or (self.batch_size,)

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
        """Parameter bytes of the model: every layer's, each shared parameter counted once."""
        total = sum(layer.param_bytes for layer in self.layers)
        if self.shared_params:
            total -= overlap_bytes(self.shared_params, range(len(self.layers)))
        return total

    def held_param_bytes(self, layers: Sequence[int]) -> float:
        """Parameter bytes a device holding `layers` (distinct indices, in order) keeps: each shared parameter once."""
        total = sum(self.layers[i].param_bytes for i in layers)
        if self.shared_params:
            total -= overlap_bytes(self.shared_params, set(layers))
        return total

    @property
    def numerics(self) -> tuple[str, str]:
        """(dtype, precision) the profile was measured in (core.precision); float32, full when it records none."""
        from pipeplan.core.precision import source_numerics

        if self.source is None:
            return source_numerics(None, None)
        return source_numerics(self.source.dtype, self.source.precision)
