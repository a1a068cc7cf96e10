"""Typed field access for JSON readers: every failure names the source, the field and the value."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from pipeplan.core.errors import PipeplanError
from pipeplan.core.limits import Limit
from pipeplan.io.files import read_input_text
from pipeplan.io.json_parse import parse_json


def load_json_file(path: str | os.PathLike[str], error: type[PipeplanError], what: str = "file") -> Any:
    """Read a JSON file: the one reader of every pipeplan JSON format (profile, cluster, plan, schedule, bandwidth trace,
    checkpoint index).

    The file must be a regular file within core.limits.FILE_BYTES (io.files), and its JSON within the limits of
    io.json_parse (nesting, integer digits, finite numbers, unique keys).

    Raises:
        error: naming the path and what is wrong: what stands there, its size, the line and column (and field) of bad JSON.
    """
    source = os.fspath(path)
    return parse_json(read_input_text(source, what, error), source, error)


class Fields:
    """Reads typed values out of one JSON object; `where` is e.g. `file.json: layers[3]`."""

    def __init__(self, obj: object, where: str, error: type[PipeplanError]) -> None:
        if not isinstance(obj, dict):
            raise error(f"{where} must be a JSON object, got {short(obj)}")
        self.obj: dict[str, Any] = obj
        self.where = where
        self.error = error

    def check_keys(self, allowed: tuple[str, ...]) -> None:
        """Reject keys outside allowed (a misspelt optional field would otherwise be ignored)."""
        for key in sorted(self.obj):
            if key not in allowed:
                raise self.error(f"{self.where}: unknown field {key!r}; known fields: {', '.join(allowed)}")

    def has(self, key: str) -> bool:
        """Whether key is present and not null."""
        return self.obj.get(key) is not None

    def raw(self, key: str) -> Any:
        """The value of a required key of any type."""
        if key not in self.obj:
            raise self.error(f"{self.where}: missing field {key!r}")
        return self.obj[key]

    def string(self, key: str, default: str | None = None) -> str:
        """A non-empty string."""
        if default is not None and key not in self.obj:
            return default
        value = self.raw(key)
        if not isinstance(value, str) or not value:
            raise self.error(f"{self.where}: field {key!r} must be a non-empty string, got {short(value)}")
        return value

    def boolean(self, key: str, default: bool) -> bool:
        """A true/false value."""
        value = self.obj.get(key, default)
        if not isinstance(value, bool):
            raise self.error(f"{self.where}: field {key!r} must be true or false, got {short(value)}")
        return value

    def integer(self, key: str, minimum: int, default: int | None = None) -> int:
        """An integer >= minimum."""
        if default is not None and key not in self.obj:
            return default
        value = self.raw(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.error(f"{self.where}: field {key!r} must be an integer >= {minimum}, got {short(value)}")
        return value

    def number(self, key: str, positive: bool = False, default: float | None = None, limits: tuple[Limit, ...] = ()) -> float:
        """A finite number >= 0 (> 0 when positive) within `limits` (a lower limit spares 0)."""
        if default is not None and key not in self.obj:
            return default
        return check_number(self.raw(key), f"{self.where}: field {key!r}", self.error, positive, limits)

    def optional_number(self, key: str, positive: bool = False, limits: tuple[Limit, ...] = ()) -> float | None:
        """A finite number >= 0 within `limits`, or None when absent or null."""
        if not self.has(key):
            return None
        return self.number(key, positive, limits=limits)

    def array(self, key: str, min_length: int = 0) -> list[Any]:
        """A JSON array of at least min_length items."""
        value = self.raw(key)
        if not isinstance(value, list) or len(value) < min_length:
            raise self.error(f"{self.where}: field {key!r} must be an array of at least {min_length} items, got {short(value)}")
        return value


def check_number(
    value: object, field: str, error: type[PipeplanError], positive: bool = False, limits: tuple[Limit, ...] = ()
) -> float:
    """value as float when it is a finite number >= 0 (> 0 when positive) within `limits` (a lower limit spares 0:
    "none"), else error naming field and value."""
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and 0 <= value <= sys.float_info.max
    if ok and positive and value == 0:
        ok = False
    if not ok:
        bound = "> 0" if positive else ">= 0"
        raise error(f"{field} must be a finite number {bound}, got {short(value)}")
    for limit in limits:
        if value or not limit.least:
            limit.check(error, field, value)  # type: ignore[arg-type]
    return float(value)  # type: ignore[arg-type]


def short(value: object) -> str:
    """repr of a JSON value, cut to 60 characters."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
