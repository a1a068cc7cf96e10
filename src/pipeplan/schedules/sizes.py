"""Argument checks shared by the schedule generators: sizes at least 1, schedules within the size limits."""

from pipeplan.core.checks import check_positive_int
from pipeplan.core.errors import ScheduleError, ScheduleTooLargeError
from pipeplan.core.limits import ACTIONS, RANKS


def check_sizes(**sizes: int) -> None:
    """Raise ScheduleError naming the first size (stages, microbatches, k, chunks) below 1."""
    for field, value in sizes.items():
        check_positive_int(ScheduleError, field, value)


def check_schedule_size(name: str, sizes: dict[str, int], ranks: int, actions: int) -> None:
    """Refuse, before it is generated, a schedule of more actions than core.limits.ACTIONS or more ranks than RANKS.

    Raises:
        ScheduleTooLargeError: `{name} with stages=.., microbatches=..: too large: N actions, the limit is M, because ...`.
    """
    what = f"{name} with {', '.join(f'{key}={value}' for key, value in sizes.items())}"
    if not ACTIONS.allows(actions):
        raise ScheduleTooLargeError(f"{ACTIONS.message(what, actions)}; use fewer microbatches or stages")
    if not RANKS.allows(ranks):
        raise ScheduleTooLargeError(RANKS.message(what, ranks))
