"""GPipe: all forwards, then all backwards (Huang et al., 2019)."""

from pipeplan.core.schedule import Action, Schedule
from pipeplan.schedules.sizes import check_sizes


def gpipe(stages: int, microbatches: int) -> Schedule:
    """Each stage runs every forward, then every backward in the same microbatch order.

    Args:
        stages: pipeline stages p (one rank each).
        microbatches: microbatches m per iteration.

    Raises:
        ScheduleError: p or m below 1.
    """
    check_sizes(stages=stages, microbatches=microbatches)
    ranks = []
    for stage in range(stages):
        # phase 1: fill — all forwards; phase 2: drain — all backwards.
        forwards = [Action.trusted(stage, "F", mb) for mb in range(microbatches)]
        backwards = [Action.trusted(stage, "B", mb) for mb in range(microbatches)]
        ranks.append(tuple(forwards + backwards))
    return Schedule(tuple(ranks), tuple(range(stages)), "gpipe")
