"""The nested objects of pipeplan's profile format (io.profile_json): a version 2 file's model source, and a layer's
"tp" object (how it splits over a tensor-parallel group)."""

from __future__ import annotations

from typing import Any

from pipeplan.core.errors import ProfileError
from pipeplan.core.limits import MAX_BYTES, MAX_MS
from pipeplan.core.profile import ProfileSource, SplitTiming, TensorSplit
from pipeplan.io.json_fields import Fields, check_number, short

_TP_KEYS = ("kind", "width", "replicated_share", "whole_fwd", "whole_bwd", "recomputed", "timed", "norm_bytes")
_TIMED_KEYS = ("tp", "fwd_ms", "bwd_ms")
_SOURCE_KEYS = ("module", "options", "dataset", "dtype", "precision")


def tp_to_json(split: TensorSplit) -> dict[str, Any]:
    """A layer's "tp" object: kind and width, and replicated_share, whole_fwd, whole_bwd, recomputed, timed and norm_bytes when
    they are not their defaults (a split without them is written as before). `timed`: a list of {tp, fwd_ms, bwd_ms},
    each time an array with one value per batch size of the profile (one in a version 1 file)."""
    out: dict[str, Any] = {"kind": split.kind, "width": split.width}
    if split.replicated_share is not None:
        out["replicated_share"] = split.replicated_share
    if split.whole_fwd:
        out["whole_fwd"] = split.whole_fwd
    if split.whole_bwd:
        out["whole_bwd"] = split.whole_bwd
    if split.recomputed:
        out["recomputed"] = True
    if split.timed:
        out["timed"] = [{"tp": x.tp, "fwd_ms": list(x.fwd_ms), "bwd_ms": list(x.bwd_ms)} for x in split.timed]
    if split.norm_bytes:
        out["norm_bytes"] = int(split.norm_bytes) if split.norm_bytes.is_integer() else split.norm_bytes
    return out


def tp_from_json(fields: Fields) -> TensorSplit | None:
    """A layer's "tp" object (absent or null: None, the layer cannot split)."""
    if fields.obj.get("tp") is None:
        return None
    tp = Fields(fields.raw("tp"), f"{fields.where}: tp", ProfileError)
    tp.check_keys(_TP_KEYS)
    share = tp.optional_number("replicated_share")
    whole_fwd, whole_bwd = tp.number("whole_fwd", default=0.0), tp.number("whole_bwd", default=0.0)
    recomputed = tp.boolean("recomputed", False)
    timed = _timed(tp) if tp.has("timed") else ()
    norm_bytes = tp.number("norm_bytes", default=0.0, limits=(MAX_BYTES,))
    try:
        return TensorSplit(tp.string("kind"), tp.integer("width", 1), share, whole_fwd, whole_bwd, recomputed, timed, norm_bytes)
    except ProfileError as exc:
        raise ProfileError(f"{fields.where}: {exc}") from None


def _timed(tp: Fields) -> tuple[SplitTiming, ...]:
    """The "timed" list of a "tp" object: {tp, fwd_ms, bwd_ms} per degree (io.profile_fields.tp_to_json)."""
    out = []
    for i, item in enumerate(tp.array("timed")):
        entry = Fields(item, f"{tp.where}: timed[{i}]", ProfileError)
        entry.check_keys(_TIMED_KEYS)
        times = {
            key: tuple(
                check_number(v, f"{entry.where}: {key}[{j}]", ProfileError, limits=(MAX_MS,))
                for j, v in enumerate(entry.array(key, 1))
            )
            for key in ("fwd_ms", "bwd_ms")
        }
        try:
            out.append(SplitTiming(entry.integer("tp", 2), times["fwd_ms"], times["bwd_ms"]))
        except ProfileError as exc:
            raise ProfileError(f"{entry.where}: {exc}") from None
    return tuple(out)


def source_to_json(source: ProfileSource) -> dict[str, Any]:
    """The model source of a version 2 file: module, options, dataset, dtype, precision."""
    return {
        "module": source.module,
        "options": dict(source.options),
        "dataset": source.dataset,
        "dtype": source.dtype,
        "precision": source.precision,
    }


def source_from_json(obj: object, where: str) -> ProfileSource:
    """The model source of a version 2 file."""
    fields = Fields(obj, where, ProfileError)
    fields.check_keys(_SOURCE_KEYS)
    options = Fields(fields.obj.get("options") or {}, f"{where}: options", ProfileError).obj
    pairs = []
    for key in sorted(options):
        if not isinstance(options[key], str):
            raise ProfileError(f"{where}: options[{key!r}] must be a string, got {short(options[key])}")
        pairs.append((key, options[key]))
    try:
        return ProfileSource(
            module=fields.string("module"),
            options=tuple(pairs),
            dataset=fields.string("dataset", default="auto"),
            dtype=fields.string("dtype", default="float32"),
            precision=fields.string("precision", default="full"),
        )
    except ProfileError as exc:
        raise ProfileError(f"{where}: {exc}") from None
