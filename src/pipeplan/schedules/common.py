"""Argument checks shared by the schedule generators."""

from pipeplan.core.checks import check_positive_int
from pipeplan.core.errors import ScheduleError


def check_sizes(**sizes: int) -> None:
    """Raise ScheduleError naming the first size (stages, microbatches, k, chunks) below 1."""
    for field, value in sizes.items():
        check_positive_int(ScheduleError, field, value)
