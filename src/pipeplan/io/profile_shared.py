"""The `shared_parameters` field of a profile file: each parameter several layers hold, with its layers and bytes.

    "shared_parameters": [{"name": "wte.weight", "layers": [0, 13], "param_bytes": 154389504}]

Optional in both profile formats (absent: nothing is shared); a profile that
has groups is written as version 2.
"""

from __future__ import annotations

import itertools
from typing import Any

from pipeplan.core.errors import ProfileError
from pipeplan.core.limits import MAX_BYTES
from pipeplan.core.shared_params import SharedGroup
from pipeplan.io.json_fields import Fields, short

KEY = "shared_parameters"
_GROUP_KEYS = ("name", "layers", "param_bytes")


def groups_to_json(groups: tuple[SharedGroup, ...]) -> list[dict[str, Any]]:
    """The groups as JSON objects, in the profile's order."""
    return [{"name": g.name, "layers": list(g.layers), "param_bytes": _whole(g.param_bytes)} for g in groups]


def groups_from_json(top: Fields, layers: int) -> tuple[SharedGroup, ...]:
    """The `shared_parameters` of a profile object with `layers` layers (() when absent), each checked: a non-empty
    name, at least 2 ascending layer indices in 0..layers-1, bytes >= 0.

    Raises:
        ProfileError: naming the file, the group's index, the field and the value.
    """
    if not top.has(KEY):
        return ()
    raw = top.raw(KEY)
    if not isinstance(raw, list):
        raise ProfileError(f"{top.where}: field {KEY!r} must be an array of {{name, layers, param_bytes}}, got {short(raw)}")
    out = []
    for i, item in enumerate(raw):
        fields = Fields(item, f"{top.where}: {KEY}[{i}]", ProfileError)
        fields.check_keys(_GROUP_KEYS)
        name = fields.string("name")
        held = fields.raw("layers")
        where = f"{fields.where} ({name}) field 'layers'"
        if not isinstance(held, list) or len(held) < 2:
            raise ProfileError(f"{where} must be an array of at least 2 layer indices, got {short(held)}")
        for u in held:
            if isinstance(u, bool) or not isinstance(u, int) or not 0 <= u < layers:
                raise ProfileError(f"{where} names layer {short(u)}, but the profile has layers 0..{layers - 1}")
        if any(a >= b for a, b in itertools.pairwise(held)):
            raise ProfileError(f"{where} must be ascending without repeats, got {short(held)}")
        nbytes = fields.number("param_bytes", limits=(MAX_BYTES,))
        out.append(SharedGroup(name, tuple(held), nbytes))
    return tuple(out)


def _whole(value: float) -> int | float:
    """Whole byte counts as JSON integers."""
    return int(value) if float(value).is_integer() and abs(value) < 2**53 else value
