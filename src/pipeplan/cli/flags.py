"""What several commands' flags share: a memory budget, integer lists, a schedule file's sizes, common help texts
(number and byte-size lists are parsed by api.scheduling, where simulate NAME reads them)."""

from __future__ import annotations

import math

from pipeplan.api.scheduling import cut, parse_size
from pipeplan.core.errors import CostError
from pipeplan.core.limits import MAX_BYTES
from pipeplan.core.plan import MEMORY_MARGIN

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


MEMORY_BUDGET_HELP = (
    "Adaptive k: the most any device may hold at any k, in bytes or with a suffix (14GiB, 15G) [the plan's adaptive "
    f"setting, else the device memory less {MEMORY_MARGIN:.0%}]."
)
"""Help of --memory-budget (plan, adapt, train)."""


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
        raise CostError(f"{flag} must be a comma-separated list of integers, got {cut(text)}") from None


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
