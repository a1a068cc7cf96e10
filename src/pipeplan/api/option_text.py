"""Option values given as text, parsed and checked once for the command line and the API: --opt KEY=VALUE pairs, a
memory budget, and the sizes a schedule file fixes."""

from __future__ import annotations

import math

from pipeplan.api.scheduling import cut, parse_size
from pipeplan.core.errors import ProfileError
from pipeplan.core.limits import MAX_BYTES


def parse_options(pairs: list[str]) -> dict[str, str]:
    """KEY=VALUE strings to a dict.

    Raises:
        ProfileError: naming a pair without `=` or an empty key, or a repeated key.
    """
    result: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise ProfileError(f"--opt must be KEY=VALUE, got {pair!r}")
        if key in result:
            raise ProfileError(f"--opt {key!r} given twice")
        result[key] = value.strip()
    return result


def parse_budget(flag: str, text: str | None) -> float | None:
    """A memory budget flag (bytes, or an api.scheduling.SIZE_UNITS suffix: 14GiB), None when not given.

    Raises:
        AdaptError: not a size, or not a finite number > 0 within core.limits.MAX_BYTES, naming the flag.
    """
    from pipeplan.core.errors import AdaptError

    if text is None:
        return None
    try:
        value = parse_size(text)
    except ValueError:
        raise AdaptError(f"{flag} must be a byte size such as 14GiB, 15G or 15000000000, got {cut(text)}") from None
    if not math.isfinite(value) or value <= 0:
        raise AdaptError(f"{flag} must be a byte size > 0 (e.g. 14GiB), got {cut(text)}")
    MAX_BYTES.check(AdaptError, flag, value)
    return value


def refuse_sizes_for_file(name: str, stages: int | None, microbatches: int | None, k: int, chunks: int) -> None:
    """A schedule file fixes its own sizes: --stages, --microbatches, --k or --chunks given with one is an error
    naming the flag (not silently ignored)."""
    from pipeplan.core.errors import ScheduleError

    if not name.lower().endswith((".csv", ".json")):
        return
    given = (("--stages", stages), ("--microbatches", microbatches), ("--k", k != 1 or None), ("--chunks", chunks != 1 or None))
    for flag, value in given:
        if value is not None:
            raise ScheduleError(f"{flag} does not apply to the schedule file {name} (it fixes its own sizes)")
