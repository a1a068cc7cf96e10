"""A measured series as CSV (`time_s,value`): what `pipeplan trace replay` turns into a bandwidth trace.

Lines starting with `#` are comments (a series names its source there);
blank lines are skipped; a first row whose time is not a number is the
header. Every other row is two numbers: a time in seconds, strictly after the
previous row's, and a value >= 0 (a throughput in any unit: the replay
divides it by a nominal in the same unit).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from pipeplan.core.errors import CostError
from pipeplan.io.files import read_input_text


@dataclass(frozen=True, slots=True)
class Series:
    """Times (s, increasing), values (>= 0), the header's value column name and the file's comment lines."""

    times_s: tuple[float, ...]
    values: tuple[float, ...]
    value_name: str
    comments: tuple[str, ...]


def read_series(path: str | os.PathLike[str]) -> Series:
    """Read a `time_s,value` CSV.

    Raises:
        CostError: an unreadable file, a row that is not two numbers, a time not after the previous one
            (unsorted), a negative or non-finite value, or no rows; naming the file, line and value.
    """
    source = os.fspath(path)
    lines = read_input_text(source, "series", CostError).splitlines()
    times: list[float] = []
    values: list[float] = []
    comments: list[str] = []
    name = "value"
    header_allowed = True
    for number, line in enumerate(lines, start=1):
        text = line.strip()
        if not text:
            continue
        if text.startswith("#"):
            comments.append(text[1:].strip())
            continue
        where = f"{source}: line {number}"
        cells = [c.strip() for c in text.split(",")]
        if len(cells) != 2:
            raise CostError(f"{where}: expected two columns time_s,value, got {text!r}")
        try:
            t = float(cells[0])
        except ValueError:
            if header_allowed:
                header_allowed = False
                name = cells[1] or name
                continue
            raise CostError(f"{where}: time {cells[0]!r} is not a number") from None
        header_allowed = False
        try:
            value = float(cells[1])
        except ValueError:
            raise CostError(f"{where}: value {cells[1]!r} is not a number") from None
        if not math.isfinite(t):
            raise CostError(f"{where}: time must be a finite number, got {cells[0]!r}")
        if times and t <= times[-1]:
            raise CostError(f"{where}: time {t:g} s is not after the previous row's {times[-1]:g} s (rows must be sorted)")
        if not math.isfinite(value) or value < 0:
            raise CostError(f"{where}: value must be a finite number >= 0, got {cells[1]!r}")
        times.append(t)
        values.append(value)
    if not times:
        raise CostError(f"{source}: no rows of time_s,value")
    return Series(tuple(times), tuple(values), name, tuple(comments))
