"""pipeplan's JSON profile format, `pipeplan.profile/1`: a ModelProfile written field by field."""

from __future__ import annotations

import json
import os
from typing import Any

from pipeplan.core.errors import PipeplanError, ProfileError
from pipeplan.core.profile import LayerProfile, ModelProfile
from pipeplan.io.json_fields import Fields, check_number, load_json_file

PROFILE_FORMAT = "pipeplan.profile/1"

_TOP_KEYS = ("format", "name", "batch_size", "reference_device", "measured", "cut_bytes", "layers", "notes")
_LAYER_KEYS = ("name", "fwd_ms", "bwd_ms", "activation_bytes", "param_bytes", "saved_bytes", "flops", "bytes_moved")


def profile_to_json(profile: ModelProfile) -> dict[str, Any]:
    """The profile as a JSON-ready dict (every field; optional layer counts are null when unknown)."""
    return {
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


def profile_from_json(obj: object, source: str = "<json>") -> ModelProfile:
    """Build a ModelProfile from a parsed `pipeplan.profile/1` object.

    Required: name, batch_size, layers (each with name, fwd_ms, bwd_ms,
    activation_bytes, param_bytes). Optional: format (must match when given),
    reference_device ("unknown"), measured (true), cut_bytes (each layer's
    activation_bytes), per layer saved_bytes (activation_bytes), flops,
    bytes_moved; notes (ignored).

    Raises:
        ProfileError: naming source, field and value.
    """
    top = Fields(obj, source, ProfileError)
    top.check_keys(_TOP_KEYS)
    if "format" in top.obj and top.obj["format"] != PROFILE_FORMAT:
        raise ProfileError(f"{source}: field 'format' must be {PROFILE_FORMAT!r}, got {top.obj['format']!r}")
    name = top.string("name")
    layers = tuple(_layer_from_json(item, f"{source}: layers[{i}]") for i, item in enumerate(top.array("layers", 1)))
    cut_bytes = None
    if top.has("cut_bytes"):
        raw_cuts = top.array("cut_bytes")
        if len(raw_cuts) != len(layers) - 1:
            raise ProfileError(
                f"{source}: field 'cut_bytes' must have {len(layers) - 1} entries (one per cut between layers), "
                f"got {len(raw_cuts)}"
            )
        cut_bytes = tuple(check_number(c, f"{source}: cut_bytes[{i}]", ProfileError) for i, c in enumerate(raw_cuts))
    try:
        return ModelProfile(
            name=name,
            batch_size=top.integer("batch_size", 1),
            layers=layers,
            reference_device=top.string("reference_device", default="unknown"),
            cut_bytes=cut_bytes,
            measured=top.boolean("measured", True),
        )
    except ProfileError as exc:
        raise ProfileError(f"{source}: {exc}") from None


def _layer_from_json(obj: object, where: str) -> LayerProfile:
    """One layer object; `where` names the file and index."""
    fields = Fields(obj, where, ProfileError)
    fields.check_keys(_LAYER_KEYS)
    try:
        return LayerProfile(
            name=fields.string("name"),
            fwd_ms=fields.number("fwd_ms"),
            bwd_ms=fields.number("bwd_ms"),
            activation_bytes=fields.number("activation_bytes"),
            param_bytes=fields.number("param_bytes"),
            saved_bytes=fields.optional_number("saved_bytes"),
            flops=fields.optional_number("flops"),
            bytes_moved=fields.optional_number("bytes_moved"),
        )
    except PipeplanError as exc:
        if isinstance(exc, ProfileError) and str(exc).startswith(where):
            raise
        raise ProfileError(f"{where}: {exc}") from None


def read_profile_json(path: str | os.PathLike[str]) -> ModelProfile:
    """Read a `pipeplan.profile/1` file.

    Raises:
        ProfileError: unreadable file, invalid JSON, or a bad field (named with its value).
    """
    source = os.fspath(path)
    return profile_from_json(load_json_file(source, ProfileError), source)


def write_profile_json(profile: ModelProfile, path: str | os.PathLike[str]) -> None:
    """Write the profile as indented JSON with sorted keys (same profile, same bytes)."""
    text = json.dumps(profile_to_json(profile), indent=2, sort_keys=True)
    with open(os.fspath(path), "w", encoding="utf-8") as handle:
        handle.write(text + "\n")


def _whole(value: float) -> int | float:
    """Whole byte counts as JSON integers (readable, exact); fractions (scaled profiles) stay floats."""
    return int(value) if float(value).is_integer() and abs(value) < 2**53 else value
