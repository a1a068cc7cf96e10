"""Per-layer costs of a model: the planner's and simulator's view of a DNN.

A profile holds each layer's costs at its `batch_size` and, when it was
measured at several batch sizes, the same values at every size of
`batch_sizes` (a `LayerCurve` per layer). How times follow the microbatch
size between and beyond those sizes is the cost model's business
(`sim.layer_costs`), not the profile's.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from pipeplan.core.checks import check_nonneg_float, check_positive_int
from pipeplan.core.errors import ProfileError
from pipeplan.core.limits import BATCH, BATCH_SIZES, BLOCK_BYTES, BLOCK_MS, LAYERS, MAX_BYTES, MAX_FLOPS, MAX_MS, Limit

CURVE_FIELDS = ("fwd_ms", "bwd_ms", "activation_bytes", "saved_bytes", "bwd_input_ms", "bwd_weight_ms")
"""The per-layer values that depend on the batch size; a LayerCurve holds each at every measured size."""


def magnitude(field: str) -> Limit:
    """The bound of a layer value in a profile built in code (BLOCK_MS for times, `*_ms`; MAX_FLOPS for flops; else
    BLOCK_BYTES): loose enough for a block of merged layers, tight enough that sums stay finite. Readers of files
    hold each layer to MAX_MS and MAX_BYTES (field_limit)."""
    return BLOCK_MS if field.endswith("_ms") else MAX_FLOPS if field == "flops" else BLOCK_BYTES


def field_limit(field: str) -> Limit:
    """The bound of one layer's value as a file gives it: MAX_MS for times, MAX_FLOPS for flops, else MAX_BYTES."""
    return MAX_MS if field.endswith("_ms") else MAX_FLOPS if field == "flops" else MAX_BYTES


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
class LayerCurve:
    """One layer's values at each of its profile's `batch_sizes`, in the same order.

    `bwd_input_ms` / `bwd_weight_ms` (the zero-bubble split of the backward)
    are None when they were not measured; `shared_bytes` (LayerProfile) is
    None when nothing is shared (zeros).
    """

    fwd_ms: tuple[float, ...]
    bwd_ms: tuple[float, ...]
    activation_bytes: tuple[float, ...]
    saved_bytes: tuple[float, ...]
    bwd_input_ms: tuple[float, ...] | None = None
    bwd_weight_ms: tuple[float, ...] | None = None
    shared_bytes: tuple[float, ...] | None = None

    def check(self, layer: str, sizes: int) -> None:
        """Raise ProfileError unless every present field has `sizes` finite values >= 0 (naming layer, field, index)."""
        for field in (*CURVE_FIELDS, "shared_bytes"):
            values = getattr(self, field)
            if values is None and field in ("bwd_input_ms", "bwd_weight_ms", "shared_bytes"):
                continue
            if not isinstance(values, tuple) or len(values) != sizes:
                got = len(values) if isinstance(values, tuple) else repr(values)
                raise ProfileError(f"layer {layer!r} {field} must have {sizes} values (one per batch size), got {got}")
            for i, value in enumerate(values):
                check_nonneg_float(ProfileError, f"layer {layer!r} {field}[{i}]", value, magnitude(field))
        if (self.bwd_input_ms is None) != (self.bwd_weight_ms is None):
            raise ProfileError(f"layer {layer!r} needs both bwd_input_ms and bwd_weight_ms or neither")
        for i, (shared, saved) in enumerate(zip(self.shared_bytes or (), self.saved_bytes, strict=False)):
            if shared > saved:
                raise ProfileError(f"layer {layer!r} shared_bytes[{i}] ({shared:g}) exceeds saved_bytes[{i}] ({saved:g})")


@dataclass(frozen=True, slots=True)
class ProfileSource:
    """How a measured profile's model was built (`pipeplan profile`), so `pipeplan probe` can build it again."""

    module: str
    options: tuple[tuple[str, str], ...] = ()
    dataset: str = "auto"
    dtype: str = "float32"

    def __post_init__(self) -> None:
        for field in ("module", "dataset", "dtype"):
            value = getattr(self, field)
            if not isinstance(value, str) or not value:
                raise ProfileError(f"profile source {field} must be a non-empty string, got {value!r}")
        for pair in self.options:
            if not (isinstance(pair, tuple) and len(pair) == 2 and all(isinstance(v, str) for v in pair) and pair[0]):
                raise ProfileError(f"profile source options must be (name, value) strings, got {pair!r}")


@dataclass(frozen=True, slots=True)
class LayerProfile:
    """Costs of one layer for one batch of `ModelProfile.batch_size` samples on the reference device.

    `activation_bytes` is the layer's output; `saved_bytes` what autograd keeps
    for backward (None: same as activation_bytes). `flops` and `bytes_moved`
    (one batch, forward + backward) are optional counts a profiler may record
    for roofline projection onto another GPU; None when unknown.
    `bwd_input_ms` and `bwd_weight_ms` split the backward as a zero-bubble
    schedule runs it (I and W; None when not measured). `optimizer_ms` maps
    an optimizer name (`adam`, `sgd`, `sgd_momentum`) to the time of one step
    over the layer's parameters; it does not depend on the batch size.
    `shared_bytes` is the part of `saved_bytes` that is the layer's input when
    the layer before saves that same tensor as its output (a ReLU's output that
    the next Linear saves as its input): one storage, held once when both
    layers are on one stage, so a stage holds the sum of its layers' saved
    bytes less the shared bytes of every layer but its first.
    `curve` holds the batch-dependent values at every size of the profile's
    `batch_sizes` (None: measured at `batch_size` only).
    """

    name: str
    fwd_ms: float
    bwd_ms: float
    activation_bytes: float
    param_bytes: float
    saved_bytes: float | None = None
    flops: float | None = None
    bytes_moved: float | None = None
    bwd_input_ms: float | None = None
    bwd_weight_ms: float | None = None
    optimizer_ms: tuple[tuple[str, float], ...] = ()
    curve: LayerCurve | None = None
    shared_bytes: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ProfileError(f"layer name must be a non-empty string, got {self.name!r}")
        for field in ("fwd_ms", "bwd_ms", "activation_bytes", "param_bytes"):
            value = check_nonneg_float(ProfileError, f"layer {self.name!r} {field}", getattr(self, field), magnitude(field))
            object.__setattr__(self, field, value)
        saved = self.activation_bytes if self.saved_bytes is None else self.saved_bytes
        saved = check_nonneg_float(ProfileError, f"layer {self.name!r} saved_bytes", saved, BLOCK_BYTES)
        object.__setattr__(self, "saved_bytes", saved)
        shared = check_nonneg_float(ProfileError, f"layer {self.name!r} shared_bytes", self.shared_bytes, BLOCK_BYTES)
        if shared > saved:
            raise ProfileError(f"layer {self.name!r} shared_bytes ({shared:g}) exceeds its saved_bytes ({saved:g})")
        object.__setattr__(self, "shared_bytes", shared)
        for field in ("flops", "bytes_moved", "bwd_input_ms", "bwd_weight_ms"):
            value = getattr(self, field)
            if value is not None:
                checked = check_nonneg_float(ProfileError, f"layer {self.name!r} {field}", value, magnitude(field))
                object.__setattr__(self, field, checked)
        if (self.bwd_input_ms is None) != (self.bwd_weight_ms is None):
            raise ProfileError(f"layer {self.name!r} needs both bwd_input_ms and bwd_weight_ms or neither")
        steps = []
        for pair in self.optimizer_ms:
            if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str) and pair[0]):
                raise ProfileError(f"layer {self.name!r} optimizer_ms must hold (optimizer name, ms) pairs, got {pair!r}")
            ms = check_nonneg_float(ProfileError, f"layer {self.name!r} optimizer_ms[{pair[0]!r}]", pair[1], BLOCK_MS)
            steps.append((pair[0], ms))
        if len({name for name, _ in steps}) != len(steps):
            raise ProfileError(f"layer {self.name!r} optimizer_ms names an optimizer twice: {[n for n, _ in steps]}")
        object.__setattr__(self, "optimizer_ms", tuple(sorted(steps)))
        if self.curve is not None and not isinstance(self.curve, LayerCurve):
            raise ProfileError(f"layer {self.name!r} curve must be a LayerCurve, got {type(self.curve).__name__}")

    def optimizer_step_ms(self, optimizer: str) -> float | None:
        """The measured time of one `optimizer` step over this layer's parameters, or None when not measured."""
        return dict(self.optimizer_ms).get(optimizer)


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
        """Sum of parameter bytes of all layers."""
        return sum(layer.param_bytes for layer in self.layers)
