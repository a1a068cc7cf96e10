"""The one JSON printer of every `--json` output: sorted keys, indented, or compact for large matrices."""

from __future__ import annotations

import json
import sys
from typing import Any


def print_json(obj: Any, compact: bool = False) -> None:
    """Print obj as JSON with sorted keys on stdout: indented by 2, or (`compact`) with arrays of numbers and flat
    objects on one line each.

    Note:
        A 1024-GPU cluster's matrices have a million entries; one number per
        line (plain indent=2) would print two million lines: `show --json` prints compact.
    """
    if compact:
        sys.stdout.write(_compact(obj, 0))
    else:
        json.dump(obj, sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")


def _compact(obj: Any, level: int) -> str:
    """JSON text: containers of scalars inline, others one item per line."""
    pad, inner = "  " * level, "  " * (level + 1)
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        if all(not isinstance(v, (dict, list)) for v in obj.values()):
            return json.dumps(obj, sort_keys=True)
        items = [f"{inner}{json.dumps(k)}: {_compact(obj[k], level + 1)}" for k in sorted(obj)]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, list):
        if not obj:
            return "[]"
        if all(not isinstance(v, (dict, list)) for v in obj):
            return json.dumps(obj)
        return "[\n" + ",\n".join(inner + _compact(v, level + 1) for v in obj) + "\n" + pad + "]"
    return json.dumps(obj)
