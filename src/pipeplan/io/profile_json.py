"""pipeplan's JSON profile formats: `pipeplan.profile/1` (one batch size) and `/2` (several sizes, I/W, optimizer steps).

Version 2 stores every batch-dependent value (times, activation and saved
bytes, cut bytes) as an array with one entry per size of `batch_sizes`, and
adds the zero-bubble split of the backward, per-layer optimizer step times,
the CPU thread count of the measurement and the model's source. Version 1
files still read; a profile with nothing version 2 adds is written as
version 1, byte for byte as before.
"""

from __future__ import annotations

import json
import os
from typing import Any

from pipeplan.core.errors import PipeplanError, ProfileError
from pipeplan.core.limits import LAYERS, MAX_BYTES, MAX_MS, Limit
from pipeplan.core.profile import (
    LayerCurve,
    LayerProfile,
    ModelProfile,
    check_batch_sizes,
    field_limit,
)
from pipeplan.io.json_fields import Fields, check_number, load_json_file, short
from pipeplan.io.profile_fields import source_from_json, source_to_json, tp_from_json, tp_to_json
from pipeplan.io.profile_shared import KEY as SHARED_KEY
from pipeplan.io.profile_shared import groups_from_json, groups_to_json

PROFILE_FORMAT = "pipeplan.profile/1"
PROFILE_FORMAT_2 = "pipeplan.profile/2"
FORMATS = (PROFILE_FORMAT, PROFILE_FORMAT_2)

_TOP_KEYS = (
    "format", "name", "batch_size", "reference_device", "measured", "cut_bytes", "layers", "notes", SHARED_KEY, "master_copy",
    "main_grads",
)  # fmt: skip
_TOP_KEYS_2 = (*_TOP_KEYS, "batch_sizes", "threads", "source")
_LAYER_KEYS = (
    "name", "fwd_ms", "bwd_ms", "activation_bytes", "param_bytes", "saved_bytes", "flops", "bytes_moved", "inputs", "tp",
)  # fmt: skip
_LAYER_KEYS_2 = (*_LAYER_KEYS, "bwd_input_ms", "bwd_weight_ms", "optimizer_ms", "shared_bytes")
_MS = (MAX_MS,)
_BYTES = (MAX_BYTES,)


def needs_version_2(profile: ModelProfile) -> bool:
    """True when the profile holds anything version 1 cannot: several sizes, I/W, optimizer steps, shared bytes,
    threads, source, shared parameters."""
    layers = profile.layers
    return (
        bool(profile.shared_params)
        or profile.batch_sizes is not None
        or profile.threads is not None
        or profile.source is not None
        or any(layer.bwd_input_ms is not None or layer.optimizer_ms or layer.shared_bytes for layer in layers)
    )


def profile_to_json(profile: ModelProfile) -> dict[str, Any]:
    """The profile as a JSON-ready dict: version 1 when it fits, else version 2 (every field; unknowns null)."""
    if not needs_version_2(profile):
        return _to_json_1(profile)
    sizes = profile.sizes
    cut_curves = profile.cut_curves or tuple((c,) for c in profile.cut_bytes or ())
    out: dict[str, Any] = {
        "format": PROFILE_FORMAT_2,
        "name": profile.name,
        "batch_size": profile.batch_size,
        "batch_sizes": list(sizes),
        "reference_device": profile.reference_device,
        "measured": profile.measured,
        "threads": profile.threads,
        "source": None if profile.source is None else source_to_json(profile.source),
        "cut_bytes": [[_whole(c) for c in curve] for curve in cut_curves],
        "layers": [_layer_to_json_2(layer) for layer in profile.layers],
    }
    if profile.shared_params:
        out[SHARED_KEY] = groups_to_json(profile.shared_params)
    return _with_inputs(profile, out)


def _to_json_1(profile: ModelProfile) -> dict[str, Any]:
    """Version 1: one value per field, as pipeplan wrote profiles before they had several sizes."""
    out = {
        "format": PROFILE_FORMAT,
        "name": profile.name,
        "batch_size": profile.batch_size,
        "reference_device": profile.reference_device,
        "measured": profile.measured,
        "cut_bytes": [_whole(c) for c in profile.cut_bytes or ()],
        "layers": [
            {
                "name": layer.name,
                "fwd_ms": layer.fwd_ms,
                "bwd_ms": layer.bwd_ms,
                "activation_bytes": _whole(layer.activation_bytes),
                "param_bytes": _whole(layer.param_bytes),
                "saved_bytes": _whole(layer.saved_bytes if layer.saved_bytes is not None else layer.activation_bytes),
                "flops": None if layer.flops is None else _whole(layer.flops),
                "bytes_moved": None if layer.bytes_moved is None else _whole(layer.bytes_moved),
            }
            for layer in profile.layers
        ],
    }
    return _with_inputs(profile, out)


def _with_inputs(profile: ModelProfile, out: dict[str, Any]) -> dict[str, Any]:
    """`out` with each layer's `inputs` (the indices of the layers it consumes) when the profile is a DAG, its
    `tp` split when it has one (a layer without one is written as before), `master_copy` when it is true and
    `main_grads` when it is not "weights" (a profile without them is written as before)."""
    if profile.master_copy:
        out["master_copy"] = True
    if profile.main_grads != "weights":
        out["main_grads"] = profile.main_grads
    if profile.layer_inputs is not None:
        for layer, sources in zip(out["layers"], profile.layer_inputs, strict=True):
            layer["inputs"] = list(sources)
    for obj, layer in zip(out["layers"], profile.layers, strict=True):
        if layer.tp is not None:
            obj["tp"] = tp_to_json(layer.tp)
    return out


def _layer_to_json_2(layer: LayerProfile) -> dict[str, Any]:
    """One layer of a version 2 file: arrays over the batch sizes (a one-entry array without a curve)."""
    curve = layer.curve or LayerCurve(
        (layer.fwd_ms,),
        (layer.bwd_ms,),
        (layer.activation_bytes,),
        (layer.saved_bytes if layer.saved_bytes is not None else layer.activation_bytes,),
        None if layer.bwd_input_ms is None else (layer.bwd_input_ms,),
        None if layer.bwd_weight_ms is None else (layer.bwd_weight_ms,),
        (layer.shared_bytes,) if layer.shared_bytes else None,
    )
    shared = (
        {}
        if curve.shared_bytes is None or not any(curve.shared_bytes)
        else {"shared_bytes": [_whole(v) for v in curve.shared_bytes]}
    )
    return {
        "name": layer.name,
        "fwd_ms": list(curve.fwd_ms),
        "bwd_ms": list(curve.bwd_ms),
        "bwd_input_ms": None if curve.bwd_input_ms is None else list(curve.bwd_input_ms),
        "bwd_weight_ms": None if curve.bwd_weight_ms is None else list(curve.bwd_weight_ms),
        "activation_bytes": [_whole(v) for v in curve.activation_bytes],
        "saved_bytes": [_whole(v) for v in curve.saved_bytes],
        "param_bytes": _whole(layer.param_bytes),
        "optimizer_ms": dict(layer.optimizer_ms),
        "flops": None if layer.flops is None else _whole(layer.flops),
        "bytes_moved": None if layer.bytes_moved is None else _whole(layer.bytes_moved),
        **shared,
    }


def profile_from_json(obj: object, source: str = "<json>") -> ModelProfile:
    """Build a ModelProfile from a parsed `pipeplan.profile/1` or `/2` object.

    Version 1 — required: name, batch_size, layers (each with name, fwd_ms,
    bwd_ms, activation_bytes, param_bytes). Optional: format (must match when
    given), reference_device ("unknown"), measured (true), cut_bytes (each
    layer's activation_bytes), per layer saved_bytes (activation_bytes),
    flops, bytes_moved; notes (ignored). Version 2 (format required) adds
    batch_sizes (required) and makes fwd_ms, bwd_ms, activation_bytes,
    saved_bytes, bwd_input_ms, bwd_weight_ms and each cut an array with one
    value per batch size; per layer optimizer_ms ({name: ms}) and shared_bytes
    (an array; zeros when absent); threads and source ({module, options,
    dataset, dtype, precision}: dtype float32 and precision full when absent). Both: shared_parameters
    (io.profile_shared; none when absent); per layer tp ({kind, width, replicated_share}: how it splits over a
    tensor-parallel group, core.layer_profile.TensorSplit; absent or null: it cannot split); master_copy (false when
    absent: core.profile.ModelProfile.master_copy); main_grads ("weights" when absent, or "fp32": ModelProfile.main_grads).

    Raises:
        ProfileError: naming source, field and value.
    """
    top = Fields(obj, source, ProfileError)
    version = top.obj.get("format", PROFILE_FORMAT)
    if version not in FORMATS:
        raise ProfileError(f"{source}: field 'format' must be one of {', '.join(map(repr, FORMATS))}, got {short(version)}")
    if version == PROFILE_FORMAT_2:
        return _from_json_2(top)
    top.check_keys(_TOP_KEYS)
    name = top.string("name")
    raw_layers = _layers(top)
    layers = tuple(_layer_from_json(item, f"{source}: layers[{i}]") for i, item in enumerate(raw_layers))
    cut_bytes = None
    if top.has("cut_bytes"):
        raw_cuts = _cuts(top, len(layers))
        cut_bytes = tuple(
            check_number(c, f"{source}: cut_bytes[{i}]", ProfileError, limits=_BYTES) for i, c in enumerate(raw_cuts)
        )
    return _profile(
        source,
        name=name,
        batch_size=top.integer("batch_size", 1),
        layers=layers,
        reference_device=top.string("reference_device", default="unknown"),
        cut_bytes=cut_bytes,
        measured=top.boolean("measured", True),
        layer_inputs=_inputs(raw_layers, source),
        shared_params=groups_from_json(top, len(layers)),
        master_copy=top.boolean("master_copy", False),
        main_grads=top.string("main_grads", default="weights"),
    )


def _inputs(raw_layers: list[Any], source: str) -> tuple[tuple[int, ...], ...] | None:
    """Each layer's `inputs` (earlier layer indices), given for every layer or for none (None: a chain)."""
    given = [isinstance(item, dict) and "inputs" in item for item in raw_layers]
    if not any(given):
        return None
    if not all(given):
        i = given.index(False)
        raise ProfileError(f"{source}: layers[{i}] has no field 'inputs' but other layers do (give it for every layer or none)")
    out = []
    for i, item in enumerate(raw_layers):
        value = item["inputs"]
        if not isinstance(value, list) or any(isinstance(u, bool) or not isinstance(u, int) for u in value):
            raise ProfileError(f"{source}: layers[{i}] field 'inputs' must be a list of layer indices, got {short(value)}")
        out.append(tuple(value))
    return tuple(out)


def _layers(top: Fields) -> list[Any]:
    """The `layers` array, at least one and at most core.limits.LAYERS (checked before any layer is built)."""
    layers = top.array("layers", 1)
    LAYERS.check(ProfileError, f"{top.where}: field 'layers'", len(layers))
    return layers


def _cuts(top: Fields, layers: int) -> list[Any]:
    """The `cut_bytes` array, checked to hold one entry per cut between layers."""
    raw = top.array("cut_bytes")
    if len(raw) != layers - 1:
        raise ProfileError(
            f"{top.where}: field 'cut_bytes' must have {layers - 1} entries (one per cut between layers), got {len(raw)}"
        )
    return raw


def _profile(where: str, **fields: Any) -> ModelProfile:
    """ModelProfile(**fields); a core check failure names the file."""
    try:
        return ModelProfile(**fields)
    except ProfileError as exc:
        raise ProfileError(f"{where}: {exc}") from None


def _layer_from_json(obj: object, where: str) -> LayerProfile:
    """One layer object of version 1; `where` names the file and index."""
    fields = Fields(obj, where, ProfileError)
    fields.check_keys(_LAYER_KEYS)
    try:
        return LayerProfile(
            name=fields.string("name"),
            fwd_ms=fields.number("fwd_ms", limits=_MS),
            bwd_ms=fields.number("bwd_ms", limits=_MS),
            activation_bytes=fields.number("activation_bytes", limits=_BYTES),
            param_bytes=fields.number("param_bytes", limits=_BYTES),
            saved_bytes=fields.optional_number("saved_bytes", limits=_BYTES),
            flops=fields.optional_number("flops", limits=(field_limit("flops"),)),
            bytes_moved=fields.optional_number("bytes_moved", limits=_BYTES),
            tp=tp_from_json(fields),
        )
    except PipeplanError as exc:
        if isinstance(exc, ProfileError) and str(exc).startswith(where):
            raise
        raise ProfileError(f"{where}: {exc}") from None


def _from_json_2(top: Fields) -> ModelProfile:
    """A version 2 object (see profile_from_json)."""
    source = top.where
    top.check_keys(_TOP_KEYS_2)
    name = top.string("name")
    sizes = list(check_batch_sizes(top.array("batch_sizes", 1), f"{source}: batch_sizes"))
    batch_size = top.integer("batch_size", 1)
    if batch_size not in sizes:
        raise ProfileError(f"{source}: field 'batch_size' {batch_size} must be one of batch_sizes {sizes}")
    at = sizes.index(batch_size)
    raw_layers = _layers(top)
    layers = tuple(_layer_from_json_2(item, f"{source}: layers[{i}]", len(sizes), at) for i, item in enumerate(raw_layers))
    if top.has("cut_bytes"):
        raw_cuts = _cuts(top, len(layers))
        cut_curves = tuple(_numbers(c, f"{source}: cut_bytes[{i}]", len(sizes), _BYTES) for i, c in enumerate(raw_cuts))
    else:
        cut_curves = tuple(layer.curve.activation_bytes for layer in layers[:-1])  # type: ignore[union-attr]
    threads = top.integer("threads", 1) if top.has("threads") else None
    return _profile(
        source,
        name=name,
        batch_size=batch_size,
        layers=layers,
        reference_device=top.string("reference_device", default="unknown"),
        cut_bytes=tuple(curve[at] for curve in cut_curves),
        measured=top.boolean("measured", True),
        batch_sizes=tuple(sizes),
        cut_curves=cut_curves,
        threads=threads,
        source=source_from_json(top.raw("source"), f"{source}: source") if top.has("source") else None,
        layer_inputs=_inputs(raw_layers, source),
        shared_params=groups_from_json(top, len(layers)),
        master_copy=top.boolean("master_copy", False),
        main_grads=top.string("main_grads", default="weights"),
    )


def _layer_from_json_2(obj: object, where: str, sizes: int, at: int) -> LayerProfile:
    """One layer object of version 2: arrays over the batch sizes; `at` is batch_size's index."""
    fields = Fields(obj, where, ProfileError)
    fields.check_keys(_LAYER_KEYS_2)

    def curve(key: str, required: bool = True) -> tuple[float, ...] | None:
        if not required and not fields.has(key):
            return None
        return _numbers(fields.raw(key), f"{where}: field {key!r}", sizes, (field_limit(key),))

    activation = curve("activation_bytes")
    assert activation is not None
    layer_curve = LayerCurve(
        fwd_ms=curve("fwd_ms"),  # type: ignore[arg-type]
        bwd_ms=curve("bwd_ms"),  # type: ignore[arg-type]
        activation_bytes=activation,
        saved_bytes=curve("saved_bytes", required=False) or activation,
        bwd_input_ms=curve("bwd_input_ms", required=False),
        bwd_weight_ms=curve("bwd_weight_ms", required=False),
        shared_bytes=curve("shared_bytes", required=False),
    )
    steps: list[tuple[str, float]] = []
    if fields.has("optimizer_ms"):
        table = Fields(fields.raw("optimizer_ms"), f"{where}: optimizer_ms", ProfileError)
        steps = [(key, table.number(key, limits=_MS)) for key in sorted(table.obj)]
    try:
        return LayerProfile(
            name=fields.string("name"),
            fwd_ms=layer_curve.fwd_ms[at],
            bwd_ms=layer_curve.bwd_ms[at],
            activation_bytes=layer_curve.activation_bytes[at],
            param_bytes=fields.number("param_bytes", limits=_BYTES),
            saved_bytes=layer_curve.saved_bytes[at],
            flops=fields.optional_number("flops", limits=(field_limit("flops"),)),
            bytes_moved=fields.optional_number("bytes_moved", limits=_BYTES),
            bwd_input_ms=None if layer_curve.bwd_input_ms is None else layer_curve.bwd_input_ms[at],
            bwd_weight_ms=None if layer_curve.bwd_weight_ms is None else layer_curve.bwd_weight_ms[at],
            optimizer_ms=tuple(steps),
            curve=layer_curve,
            shared_bytes=0.0 if layer_curve.shared_bytes is None else layer_curve.shared_bytes[at],
            tp=tp_from_json(fields),
        )
    except PipeplanError as exc:
        if isinstance(exc, ProfileError) and str(exc).startswith(where):
            raise
        raise ProfileError(f"{where}: {exc}") from None


def _numbers(value: object, where: str, count: int, limits: tuple[Limit, ...]) -> tuple[float, ...]:
    """An array of `count` finite numbers >= 0 within limits (one per batch size), else a ProfileError naming where and
    the value."""
    if not isinstance(value, list) or len(value) != count:
        raise ProfileError(f"{where} must be an array of {count} numbers (one per batch size), got {short(value)}")
    return tuple(check_number(v, f"{where}[{i}]", ProfileError, limits=limits) for i, v in enumerate(value))


def read_profile_json(path: str | os.PathLike[str]) -> ModelProfile:
    """Read a `pipeplan.profile/1` or `/2` file.

    Raises:
        ProfileError: unreadable file, invalid JSON, or a bad field (named with its value).
    """
    source = os.fspath(path)
    return profile_from_json(load_json_file(source, ProfileError, "profile"), source)


def profile_dumps(profile: ModelProfile) -> str:
    """The profile file's text: indented JSON with sorted keys and a final newline (same profile, same bytes)."""
    return json.dumps(profile_to_json(profile), indent=2, sort_keys=True) + "\n"


def write_profile_json(profile: ModelProfile, path: str | os.PathLike[str]) -> None:
    """Write the profile (profile_dumps) to a temporary file beside `path`, then rename it: never half-written."""
    from pipeplan.io.atomic import write_text_atomic
    from pipeplan.io.file_kinds import PROFILE

    write_text_atomic(path, profile_dumps(profile), PROFILE)


def _whole(value: float) -> int | float:
    """Whole byte counts as JSON integers (readable, exact); fractions (scaled profiles) stay floats."""
    return int(value) if float(value).is_integer() and abs(value) < 2**53 else value
