"""Helpers shared by CLI commands: number lists, JSON output."""

from __future__ import annotations

import json
import math
import sys
from typing import Any

from pipeplan.core.errors import CostError


def parse_numbers(flag: str, text: str | None) -> list[float] | None:
    """Parse a flag value: one number or a comma-separated list, each finite and >= 0.

    Raises:
        CostError: naming the flag and the bad value.
    """
    if text is None:
        return None
    values = []
    for part in text.split(","):
        try:
            value = float(part)
        except ValueError:
            raise CostError(f"{flag} must be a number or a comma-separated list of numbers, got {text!r}") from None
        if math.isnan(value) or math.isinf(value) or value < 0:
            raise CostError(f"{flag} values must be finite and >= 0, got {part.strip()!r}")
        values.append(value)
    return values


def print_json(obj: Any) -> None:
    """Print obj as indented JSON with sorted keys on stdout."""
    json.dump(obj, sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")
