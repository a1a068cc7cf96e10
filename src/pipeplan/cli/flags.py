"""What several commands' flags share: a memory budget, integer lists, a schedule file's sizes, common help texts
(number and byte-size lists are parsed by api.scheduling, where simulate NAME reads them; a memory budget and a
schedule file's sizes by api.option_text, re-exported here)."""

from __future__ import annotations

from pipeplan.api.option_text import parse_budget, refuse_sizes_for_file
from pipeplan.api.scheduling import cut
from pipeplan.core.errors import CostError
from pipeplan.core.plan import MEMORY_MARGIN

__all__ = ["parse_budget", "parse_int_list", "refuse_sizes_for_file"]

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
