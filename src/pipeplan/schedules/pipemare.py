"""PipeMare (Yang et al., MLSys'21): asynchronous pipelining, no flush between minibatches, no weight stashing.

Microbatches stream through the pipeline as one long 1F1B: stage i keeps
p - i forwards in flight, then alternates one backward and one forward, and
never drains between minibatches. Each stage applies its optimizer step (U)
as soon as its last backward of a minibatch is done, so a microbatch's
forward and backward on stage i may see different weights: the forward ran
τ updates before the backward (`sim.delays` derives τ from the order).

Minibatch t holds microbatches t·m .. t·m + m - 1; U actions carry the
minibatch index. With `sync_minibatches` W the first W minibatches run as
synchronous 1F1B (each flushed, then stepped) before the stream starts: the
synchronous warm-up.
"""

from pipeplan.core.errors import ScheduleError
from pipeplan.core.schedule import Action, Schedule
from pipeplan.schedules.kfkb import kfkb_order
from pipeplan.schedules.sizes import check_schedule_size, check_sizes

MINIBATCHES = 8
"""The fewest minibatches a pipemare schedule covers when not told (default_minibatches)."""


def fill_minibatches(stages: int, microbatches: int) -> int:
    """Minibatches the pipeline's fill (or drain) spans: ceil(p / m)."""
    return -(-stages // microbatches)


def default_minibatches(stages: int, microbatches: int) -> int:
    """Enough minibatches for a steady window between fill and drain at least as long as both: max(8, 4 ceil(p/m) + 4)."""
    return max(MINIBATCHES, 4 * fill_minibatches(stages, microbatches) + 4)


def stream_order(stage: int, stages: int, microbatches: int, first: int, total: int) -> list[Action]:
    """Stage `stage`'s asynchronous order over microbatches first .. total - 1: p - stage forwards, then one backward
    and one forward at a time, an optimizer step after each minibatch's last backward (minibatches of
    `microbatches`), then the remaining backwards."""
    order: list[Action] = []
    next_f = next_b = first
    warmup = min(first + stages - stage, total)

    def backward() -> None:
        nonlocal next_b
        order.append(Action.trusted(stage, "B", next_b))
        if (next_b + 1) % microbatches == 0:
            order.append(Action.trusted(stage, "U", next_b // microbatches))
        next_b += 1

    while next_f < warmup:
        order.append(Action.trusted(stage, "F", next_f))
        next_f += 1
    while next_f < total:
        backward()
        order.append(Action.trusted(stage, "F", next_f))
        next_f += 1
    while next_b < total:
        backward()
    return order


def pipemare(stages: int, microbatches: int, minibatches: int | None = None, sync_minibatches: int = 0) -> Schedule:
    """The PipeMare schedule of `minibatches` (default_minibatches when None) minibatches of `microbatches`
    microbatches on `stages` stages.

    Raises:
        ScheduleError: a size below 1, or `sync_minibatches` outside 0 .. minibatches.
        ScheduleTooLargeError: more actions or ranks than core.limits allows (checked before generating).
    """
    check_sizes(stages=stages, microbatches=microbatches)
    if minibatches is None:
        minibatches = default_minibatches(stages, microbatches)
    check_sizes(minibatches=minibatches)
    sizes = {"stages": stages, "microbatches": microbatches, "minibatches": minibatches}
    check_schedule_size("pipemare", sizes, stages, (2 * microbatches + 1) * stages * minibatches)
    if isinstance(sync_minibatches, bool) or not isinstance(sync_minibatches, int) or not 0 <= sync_minibatches <= minibatches:
        raise ScheduleError(
            f"sync_minibatches must be an integer in 0..{minibatches} (the minibatches), got {sync_minibatches!r}"
        )
    total = minibatches * microbatches
    ranks = []
    for stage in range(stages):
        order: list[Action] = []
        for t in range(sync_minibatches):
            base = t * microbatches
            warmup = min(stages - stage, microbatches)
            flushed = kfkb_order(stage, stages, microbatches, 1, warmup)
            order.extend(Action.trusted(stage, a.op, a.microbatch + base) for a in flushed)
            order.append(Action.trusted(stage, "U", t))
        order.extend(stream_order(stage, stages, microbatches, sync_minibatches * microbatches, total))
        ranks.append(tuple(order))
    return Schedule(tuple(ranks), tuple(range(stages)), "pipemare")
