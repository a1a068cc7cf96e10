"""What several commands' flags share: number and size lists, a schedule file's sizes, common help texts."""

from __future__ import annotations

import math
import re

from pipeplan.core.errors import CostError, PlanError
from pipeplan.core.limits import MAX_BYTES, MAX_MS
from pipeplan.core.plan import MEMORY_MARGIN

SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12, "tb": 10**12,
    "ki": 2**10, "kib": 2**10, "mi": 2**20, "mib": 2**20, "gi": 2**30, "gib": 2**30, "ti": 2**40, "tib": 2**40,
}  # fmt: skip
"""Byte-size suffixes (case-insensitive): k/M/G/T are powers of 1000, Ki/Mi/Gi/Ti powers of 1024."""

SCALING_HELP = (
    "How layer times follow the microbatch size: auto (measured curves when the profile has several batch sizes, else "
    "a fixed per-layer floor plus a part that scales), measured, floor, or linear (plain b/P)."
)
OPTIMIZER_HELP = "Optimizer whose step ends the iteration and whose state takes memory: adam, sgd or sgd_momentum."
PBS_HELP = "Batch a graph.txt profile was measured with, when its file name has no -pbs-N."
"""Help of --profile-batch-size, shared by the commands that read a profile."""
REPLICATION_HELP = (
    "What a plan may replicate: any (stages over several devices, whole pipelines), pipelines (whole pipelines "
    "only: one device per stage and pipeline) or none (one straight pipeline)."
)
"""Help of --replication (plan, compare)."""


def parse_size(part: str) -> float:
    """One byte count, optionally with a suffix of SIZE_UNITS: '64M' = 64e6, '1.5GiB' = 1.5 * 2**30.

    Raises:
        ValueError: not a number with a known suffix.
    """
    match = re.fullmatch(r"\s*([0-9.eE+\-]+?)\s*([A-Za-z]*)\s*", part)
    if match is None or match.group(2).lower() not in SIZE_UNITS:
        raise ValueError(part)
    return float(match.group(1)) * SIZE_UNITS[match.group(2).lower()]


def parse_numbers(flag: str, text: str | None, sizes: bool = False) -> list[float] | None:
    """Parse a flag value: one number or a comma-separated list, each finite, >= 0 and within its magnitude limit
    (core.limits: MAX_BYTES with `sizes`, else MAX_MS: so sums over every microbatch stay finite).

    With `sizes`, each number may carry a byte suffix (SIZE_UNITS: 64M, 1.5GiB).

    Raises:
        CostError: naming the flag and the bad value.
    """
    if text is None:
        return None
    values = []
    for part in text.split(","):
        try:
            value = parse_size(part) if sizes else float(part)
        except ValueError:
            kind = "a byte size (e.g. 64M, 1.5GiB) or a comma-separated list of sizes"
            if not sizes:
                kind = "a number or a comma-separated list of numbers"
            raise CostError(f"{flag} must be {kind}, got {_cut(text)}") from None
        if math.isnan(value) or math.isinf(value) or value < 0:
            raise CostError(f"{flag} values must be finite and >= 0, got {_cut(part.strip())}")
        (MAX_BYTES if sizes else MAX_MS).check(CostError, flag, value)
        values.append(value)
    return values


MEMORY_BUDGET_HELP = (
    "Adaptive k: the most any device may hold at any k, in bytes or with a suffix (14GiB, 15G) [the plan's adaptive "
    f"setting, else the device memory less {MEMORY_MARGIN:.0%}]."
)
"""Help of --memory-budget (plan, adapt, train)."""


def parse_budget(flag: str, text: str | None) -> float | None:
    """A memory budget flag (bytes, or a SIZE_UNITS suffix: 14GiB), None when not given.

    Raises:
        AdaptError: not a size, or not a finite number > 0 within core.limits.MAX_BYTES, naming the flag.
    """
    from pipeplan.core.errors import AdaptError

    if text is None:
        return None
    try:
        value = parse_size(text)
    except ValueError:
        raise AdaptError(f"{flag} must be a byte size such as 14GiB, 15G or 15000000000, got {_cut(text)}") from None
    if not math.isfinite(value) or value <= 0:
        raise AdaptError(f"{flag} must be a byte size > 0 (e.g. 14GiB), got {_cut(text)}")
    MAX_BYTES.check(AdaptError, flag, value)
    return value


def _cut(text: str) -> str:
    """repr of a flag's text, cut to 60 characters (a 5,000-digit number stays a readable line)."""
    shown = repr(text)
    return shown if len(shown) <= 60 else f"{shown[:57]}... ({len(text):,} characters)"


def parse_int_list(flag: str, text: str | None) -> list[int] | None:
    """A comma-separated list of integers, or None when the flag was not given.

    Raises:
        CostError: naming the flag and the value that is not an integer.
    """
    if text is None:
        return None
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise CostError(f"{flag} must be a comma-separated list of integers, got {_cut(text)}") from None


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


def plan_profile_and_cluster(command: str, profile: str | None, cluster: str | None, names: dict[str, str]) -> tuple[str, str]:
    """--profile and --cluster, each defaulting to the name the plan file records.

    Raises:
        PlanError: naming `command` (e.g. "adapt --plan p.json") and every flag still missing.
    """
    profile = profile or names.get("profile") or None
    cluster = cluster or names.get("cluster") or None
    missing = [flag for flag, value in (("--profile", profile), ("--cluster", cluster)) if value is None]
    if missing:
        raise PlanError(f"{command} also needs {' and '.join(missing)} (a file path or a built-in name)")
    assert profile is not None and cluster is not None
    return profile, cluster
