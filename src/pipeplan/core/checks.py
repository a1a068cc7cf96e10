"""Argument checks shared by the core values: each raises with field and value."""

from __future__ import annotations

import math

from pipeplan.core.errors import PipeplanError
from pipeplan.core.limits import Limit


def check_positive_int(error: type[PipeplanError], field: str, value: object) -> int:
    """Return value if it is an int >= 1, else raise error naming field and value."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise error(f"{field} must be an integer >= 1, got {value!r}")
    return value


def check_nonneg_int(error: type[PipeplanError], field: str, value: object) -> int:
    """Return value if it is an int >= 0, else raise error naming field and value."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise error(f"{field} must be an integer >= 0, got {value!r}")
    return value


def check_nonneg_float(error: type[PipeplanError], field: str, value: object, most: Limit | None = None) -> float:
    """Return value as float if it is a finite number >= 0 (and within `most`), else raise naming field and value."""
    if most is None and type(value) is float and 0.0 <= value < math.inf:  # the common case first: a search checks thousands
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise error(f"{field} must be a number >= 0, got {value!r}")
    if isinstance(value, int) and value > 1e300:  # float() of it would overflow
        raise error(most.message(field, value) if most is not None else f"{field} must be a finite number >= 0, got {value!r}")
    if math.isnan(value) or math.isinf(value) or value < 0:
        raise error(f"{field} must be a finite number >= 0, got {value!r}")
    if most is not None:
        most.check(error, field, value)
    return float(value)


def check_positive_float(
    error: type[PipeplanError], field: str, value: object, least: Limit | None = None, most: Limit | None = None
) -> float:
    """Return value as float if it is a finite number > 0 (and within `least` and `most`), else raise naming field
    and value."""
    number = check_nonneg_float(error, field, value, most)
    if number <= 0:
        raise error(f"{field} must be a number > 0, got {value!r}")
    if least is not None:
        least.check(error, field, number)
    return number
