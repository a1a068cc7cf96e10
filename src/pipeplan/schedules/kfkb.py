"""kFkB (Ada-Grouper): groups of k forwards and k backwards; k=1 is 1F1B, k>=m is GPipe."""

from pipeplan.core.schedule import Action, Schedule
from pipeplan.schedules.sizes import check_sizes


def kfkb_order(stage: int, stages: int, microbatches: int, k: int, warmup: int) -> tuple[Action, ...]:
    """One stage's order: `warmup` forwards, then k backwards / k forwards, then the rest of the backwards."""
    order: list[Action] = []
    next_f = next_b = 0
    # phase 1: warm-up forwards.
    while next_f < warmup:
        order.append(Action.trusted(stage, "F", next_f))
        next_f += 1
    # phase 2: steady state — k backwards, then k forwards.
    while next_f < microbatches:
        for _ in range(k):
            if next_b < next_f:
                order.append(Action.trusted(stage, "B", next_b))
                next_b += 1
        for _ in range(k):
            if next_f < microbatches:
                order.append(Action.trusted(stage, "F", next_f))
                next_f += 1
    # phase 3: cool-down — remaining backwards.
    while next_b < microbatches:
        order.append(Action.trusted(stage, "B", next_b))
        next_b += 1
    return tuple(order)


def kfkb(stages: int, microbatches: int, k: int = 1) -> Schedule:
    """Stage r warms up with min(k*(p-r), m) forwards, then alternates k backwards and k forwards.

    Raises:
        ScheduleError: p, m or k below 1.
    """
    check_sizes(stages=stages, microbatches=microbatches, k=k)
    ranks = tuple(kfkb_order(stage, stages, microbatches, k, min(k * (stages - stage), microbatches)) for stage in range(stages))
    return Schedule(ranks, tuple(range(stages)), "kfkb")
