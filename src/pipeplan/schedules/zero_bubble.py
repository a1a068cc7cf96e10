"""ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024): 1F1B with backward split into I and W."""

from pipeplan.core.schedule import Action, Schedule
from pipeplan.schedules.sizes import check_sizes


def zb_h1_order(rank: int, ranks: int, microbatches: int) -> tuple[Action, ...]:
    """One rank's order: 1F1B's warm-up, then I/F pairs with rank r holding back r weight passes."""
    warmup = min(ranks - rank, microbatches)
    deferred = rank
    order: list[Action] = []
    next_f = next_i = next_w = 0

    def input_then_weight() -> None:
        nonlocal next_i, next_w
        order.append(Action.trusted(rank, "I", next_i))
        next_i += 1
        # a W runs once more than `deferred` microbatches wait for theirs.
        if next_i - next_w > deferred:
            order.append(Action.trusted(rank, "W", next_w))
            next_w += 1

    # phase 1: warm-up — the same p - r forwards as 1F1B.
    while next_f < warmup:
        order.append(Action.trusted(rank, "F", next_f))
        next_f += 1
    # phase 2: steady state — I (and a W once r are held back), then F.
    while next_f < microbatches:
        input_then_weight()
        order.append(Action.trusted(rank, "F", next_f))
        next_f += 1
    # phase 3: cool-down — the remaining I passes, then the held-back W passes fill the tail.
    while next_i < microbatches:
        input_then_weight()
    while next_w < microbatches:
        order.append(Action.trusted(rank, "W", next_w))
        next_w += 1
    return tuple(order)


def zero_bubble_h1(stages: int, microbatches: int) -> Schedule:
    """ZB-H1: rank r warms up with min(p-r, m) forwards and defers its first r weight passes.

    Args:
        stages: pipeline stages p (one rank each).
        microbatches: microbatches m per iteration (any m >= 1).

    Returns:
        A schedule whose backward is split into I (input gradient) and W
        (weight gradient). Every rank holds at most p microbatches in flight
        (from the start of F to the end of W), as 1F1B's first rank does.
        With F = I = W, m >= p and no transfer time, each rank idles
        (p-1)(F+I-W) against 1F1B's (p-1)(F+I+W).

    Raises:
        ScheduleError: p or m below 1.

    Note:
        Holding back r W passes on rank r lets the I passes run one step
        apart down the ranks (they no longer wait for W), so the I chain
        reaches rank 0 as early as F allows; the r held-back W passes then
        fill exactly the r-step tail that rank r would otherwise idle while
        rank 0 finishes. The in-flight count on rank r is (p-r) + r = p.
    """
    check_sizes(stages=stages, microbatches=microbatches)
    ranks = tuple(zb_h1_order(rank, stages, microbatches) for rank in range(stages))
    return Schedule(ranks, tuple(range(stages)), "zb-h1")
