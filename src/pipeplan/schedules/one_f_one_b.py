"""1F1B with early backward (DAPPLE; PipeDream-flush): bounded in-flight microbatches."""

from pipeplan.core.schedule import Schedule
from pipeplan.schedules.kfkb import kfkb_order
from pipeplan.schedules.sizes import check_sizes


def one_f_one_b(stages: int, microbatches: int, extra_warmup: bool = False) -> Schedule:
    """Stage i runs K_i forwards, then alternates one backward and one forward, then drains.

    K_i = min(p - i, m); with `extra_warmup`, K_i = min(2(p - i) - 1, m)
    (DAPPLE's variant that hides transfers comparable to compute).

    Raises:
        ScheduleError: p or m below 1.
    """
    check_sizes(stages=stages, microbatches=microbatches)
    ranks = []
    for stage in range(stages):
        warmup = 2 * (stages - stage) - 1 if extra_warmup else stages - stage
        ranks.append(kfkb_order(stage, stages, microbatches, 1, min(warmup, microbatches)))
    return Schedule(tuple(ranks), tuple(range(stages)), "1f1b")
