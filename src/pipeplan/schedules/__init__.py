"""Static schedule generators, registered by name."""

from collections.abc import Callable

from pipeplan.core.errors import ScheduleError
from pipeplan.core.schedule import Schedule
from pipeplan.schedules.gpipe import gpipe
from pipeplan.schedules.kfkb import kfkb
from pipeplan.schedules.one_f_one_b import one_f_one_b

SCHEDULES: dict[str, Callable[..., Schedule]] = {
    "gpipe": lambda stages, microbatches, k=1, chunks=1: gpipe(stages, microbatches),
    "1f1b": lambda stages, microbatches, k=1, chunks=1: one_f_one_b(stages, microbatches),
    "kfkb": lambda stages, microbatches, k=1, chunks=1: kfkb(stages, microbatches, k),
}
"""name -> generator(stages, microbatches, k, chunks); every generator takes all four."""


def make_schedule(name: str, stages: int, microbatches: int, k: int = 1, chunks: int = 1) -> Schedule:
    """Generate the schedule called `name` for `stages` ranks and `microbatches` microbatches.

    `k` is used by kfkb, `chunks` (v) by interleaved-1f1b; others ignore them.

    Raises:
        ScheduleError: unknown name or bad sizes.
    """
    generator = SCHEDULES.get(name)
    if generator is None:
        raise ScheduleError(f"unknown schedule {name!r}; choose one of {', '.join(SCHEDULES)}")
    return generator(stages, microbatches, k=k, chunks=chunks)


__all__ = ["SCHEDULES", "gpipe", "kfkb", "make_schedule", "one_f_one_b"]
