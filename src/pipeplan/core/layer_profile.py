"""One layer's costs in a profile: at the profile's batch size (LayerProfile) and at each measured size (LayerCurve),
with the bounds a layer's values are held to."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from pipeplan.core.checks import check_nonneg_float
from pipeplan.core.errors import ProfileError
from pipeplan.core.limits import BLOCK_BYTES, BLOCK_MS, MAX_BYTES, MAX_FLOPS, MAX_MS, Limit

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


TP_KINDS: dict[str, tuple[int, int, str, float]] = {
    "block": (2, 2, "output", 10 / 34),
    "attention": (1, 1, "output", 5 / 13),
    "mlp": (1, 1, "output", 5 / 21),
    "vocab": (1, 0, "output", 0.0),
    "row": (1, 0, "output", 0.0),
    "column": (0, 1, "input", 0.0),
}
"""How each kind of tensor-parallel layer splits (Megatron-LM, Shoeybi et al. 2019; Korthikanti et al. 2022):
(all-reduces in the forward, all-reduces in the backward, whose bytes they carry: the layer's output activation or
its input, the default share of its saved bytes a group keeps whole without sequence parallelism).

- `block`: a transformer block (attention + MLP, each column- then row-parallel): 2 + 2 all-reduces of its output;
  of Korthikanti's 34 sbh saved bytes per block, 10 sbh (layer-norm inputs, dropout masks, the inputs of the QKV
  and first MLP linears) stay whole (the 5as/h score term left out: an upper bound on the whole share).
- `attention` (13 sbh, 5 whole) and `mlp` (21 sbh, 5 whole): each half of a block with its layer norm.
- `vocab`: a vocab-parallel embedding: the forward all-reduces its output.
- `row` / `column`: a row-parallel linear (its forward all-reduces its output) and a column-parallel one (its
  backward all-reduces its input's gradient; its output stays split, for a `row` layer or a parallel loss after it).
"""


@dataclass(frozen=True, slots=True)
class SplitTiming:
    """A split layer's measured time on one device of a tensor-parallel group of `tp`, as the runtime runs it (its
    sharded modules and their dispatch; the group's collectives are priced apart): `fwd_ms` and `bwd_ms` at each of
    the profile's batch sizes, in order (profiler.split_timing)."""

    tp: int
    fwd_ms: tuple[float, ...]
    bwd_ms: tuple[float, ...]

    def __post_init__(self) -> None:
        if isinstance(self.tp, bool) or not isinstance(self.tp, int) or self.tp < 2:
            raise ProfileError(f"tp timed tp must be an integer >= 2 (a group's size), got {self.tp!r}")
        for field in ("fwd_ms", "bwd_ms"):
            values = getattr(self, field)
            if not isinstance(values, tuple) or not values:
                raise ProfileError(f"tp timed {field} at tp {self.tp} must be a non-empty list of ms, got {values!r}")
            checked = tuple(
                check_nonneg_float(ProfileError, f"tp timed {field}[{i}] at tp {self.tp}", v, BLOCK_MS)
                for i, v in enumerate(values)
            )
            object.__setattr__(self, field, checked)
        if len(self.fwd_ms) != len(self.bwd_ms):
            raise ProfileError(f"tp timed at tp {self.tp} has {len(self.fwd_ms)} fwd_ms but {len(self.bwd_ms)} bwd_ms values")


@dataclass(frozen=True, slots=True)
class TensorSplit:
    """How a layer splits over a tensor-parallel group: its `kind` (a key of TP_KINDS) and `width`, the count the
    split divides (attention heads for block/attention, the MLP's hidden size for mlp, the vocabulary for vocab, the
    split features for row/column): a group of t devices needs t | width. `replicated_share`: the share of the
    layer's saved bytes each device keeps whole without sequence parallelism (None: the kind's default).

    `whole_fwd` / `whole_bwd`: the share of the layer's forward / backward time that every device of the group runs
    whole without sequence parallelism (Megatron-LM's layer norms, dropouts and residual adds on the s x b x h
    tensors, which the split leaves replicated; with sequence parallelism they split along the sequence), 0 by
    default: all of it divides by t. `recomputed`: the layer's backward reruns its forward (full activation
    recomputation), so the forward's collectives run once more in the backward. `timed`: the layer's measured time
    on one device of a group at each tp it was run split at (SplitTiming, ascending tp, each dividing `width`; the
    cost model uses it in place of the shares above: sim.cost.tensor_parallel), empty when not measured.
    `norm_bytes`: the parameter bytes (the profile's param_bytes unit) of each of the layer's norms whose weight
    gradients sequence parallelism all-reduces over the group per microbatch (sim.cost.sequence_traffic.SEQUENCE_NORMS:
    a block has two, its attention or MLP one); 0 (the default): unknown, those all-reduces priced at their latency."""

    kind: str
    width: int
    replicated_share: float | None = None
    whole_fwd: float = 0.0
    whole_bwd: float = 0.0
    recomputed: bool = False
    timed: tuple[SplitTiming, ...] = ()
    norm_bytes: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in TP_KINDS:
            raise ProfileError(f"tp kind must be one of {', '.join(TP_KINDS)}, got {self.kind!r}")
        if isinstance(self.width, bool) or not isinstance(self.width, int) or self.width < 1:
            raise ProfileError(f"tp width must be an integer >= 1 (what the split divides), got {self.width!r}")
        share = self.replicated_share
        if share is not None:
            if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0.0 <= share <= 1.0:
                raise ProfileError(f"tp replicated_share must be a fraction in 0..1, got {share!r}")
            object.__setattr__(self, "replicated_share", float(share))
        for field in ("whole_fwd", "whole_bwd"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
                raise ProfileError(f"tp {field} must be a fraction in 0..1, got {value!r}")
            object.__setattr__(self, field, float(value))
        if not isinstance(self.recomputed, bool):
            raise ProfileError(f"tp recomputed must be true or false, got {self.recomputed!r}")
        object.__setattr__(self, "norm_bytes", check_nonneg_float(ProfileError, "tp norm_bytes", self.norm_bytes, MAX_BYTES))
        self._check_timed()

    def _check_timed(self) -> None:
        """`timed`: SplitTiming values at ascending degrees that divide the width, all at the same number of sizes."""
        if not isinstance(self.timed, tuple) or not all(isinstance(x, SplitTiming) for x in self.timed):
            raise ProfileError(f"tp timed must be a tuple of SplitTiming values, got {self.timed!r}")
        degrees = [x.tp for x in self.timed]
        if any(a >= b for a, b in itertools.pairwise(degrees)):
            raise ProfileError(f"tp timed degrees must be ascending without repeats, got {degrees}")
        for x in self.timed:
            if self.width % x.tp:
                raise ProfileError(f"tp timed names tp {x.tp}, which does not divide the split's width {self.width}")
        if len({len(x.fwd_ms) for x in self.timed}) > 1:
            counts = [len(x.fwd_ms) for x in self.timed]
            raise ProfileError(f"tp timed entries must each have one value per batch size, got {counts} values")

    def timing(self, t: int) -> SplitTiming | None:
        """The layer's measured times at tp `t`, None when it was not run split at t."""
        return next((x for x in self.timed if x.tp == t), None)

    @property
    def whole_share(self) -> float:
        """The share of the saved bytes kept whole without sequence parallelism: given, else the kind's."""
        return TP_KINDS[self.kind][3] if self.replicated_share is None else self.replicated_share


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
    `tp` says how the layer splits over a tensor-parallel group (TensorSplit); None: it cannot split, and a
    tensor-parallel stage runs it whole on every device of the group (replicated).
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
    tp: TensorSplit | None = None

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
        if self.tp is not None and not isinstance(self.tp, TensorSplit):
            raise ProfileError(f"layer {self.name!r} tp must be a TensorSplit or None, got {type(self.tp).__name__}")

    def optimizer_step_ms(self, optimizer: str) -> float | None:
        """The measured time of one `optimizer` step over this layer's parameters, or None when not measured."""
        return dict(self.optimizer_ms).get(optimizer)
