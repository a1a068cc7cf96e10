"""How `exact` walks its part of the plan space without repeating a plan: device tuples up to twins, the space's size.

exact's part of planner.plan_space is every plan the cost model can score without interleaving:

- every pipeline-replica count rp that divides the global batch (at most the device count), and every
  microbatch count m dividing the per-replica batch (or the one the request's microbatch size gives);
- every contiguous partition of the layers, and for each stage an ordered tuple of unused devices of length
  r * rp (replica-major, r data-parallel replicas with r | the microbatch size; order matters: it fixes which
  replicas pair up for transfers and the all-reduce ring); devices may stay unused;
- every schedule among gpipe, 1f1b, kfkb (k = 2..4, k < m) and zb-h1 (or the request's schedule):
  plan_space.EXACT_SCHEDULES.

Twins (planner.search.refine.twin_classes: same node, speed, memory and links) are interchangeable, so a stage
takes of every twin class only its lowest unused device next (canonical_tuples): every plan of the space is a
twin relabelling of exactly one plan walked, with the same simulated time.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from functools import cache, lru_cache

from pipeplan.schedules import make_schedule
from pipeplan.sim.cost.memory import order_peak_activation


@lru_cache(maxsize=4096)
def canonical_list(free: tuple[int, ...], length: int, classes: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """canonical_tuples as a tuple, cached (exact asks for the same free devices at many nodes)."""
    return tuple(canonical_tuples(free, length, classes))


def canonical_tuples(free: tuple[int, ...], length: int, classes: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
    """Ordered tuples of `length` distinct devices of `free` (ascending), up to swapping twins.

    `classes[d]` names d's twin class (refine.twin_classes: a permutation inside a class maps every plan onto
    one with the same simulated time). Of each class only its smallest device not yet taken may come next, so
    every tuple of `permutations(free, length)` is a twin-relabelling of exactly one tuple given here, and a
    cluster without twins gives all of them, in the same order.
    """
    if length == 0:
        yield ()
        return
    seen: set[int] = set()
    for i, d in enumerate(free):
        twin = classes[d] if classes else d
        if twin in seen:
            continue
        seen.add(twin)
        for rest in canonical_tuples(free[:i] + free[i + 1 :], length - 1, classes):
            yield (d, *rest)


def ordered_groups(devices: int, stages: int) -> int:
    """How many sequences of `stages` disjoint non-empty ordered device tuples `devices` devices allow."""
    return sum(math.perm(devices, k) * math.comb(k - 1, stages - 1) for k in range(stages, devices + 1))


def search_space(layers: int, devices: int, limit: int | None = None) -> int:
    """(contiguous partition, ordered device groups) pairs: the size of the space before twins and bounds.

    With `limit`, the count stops as soon as it passes the limit (every term is positive) and returns that partial
    count: on 1024 devices the full count has thousands of digits and takes seconds to add up.
    """
    total = 0
    for s in range(1, min(layers, devices) + 1):
        partitions = math.comb(layers - 1, s - 1)
        for k in range(s, devices + 1):
            total += partitions * math.perm(devices, k) * math.comb(k - 1, s - 1)
            if limit is not None and total > limit:
                return total
    return total


@cache
def peak_inflight(name: str, stages: int, microbatches: int, k: int) -> tuple[int, ...]:
    """Per stage, the most microbatches a schedule holds at once (F opens one, B or W closes it)."""
    schedule = make_schedule(name, stages, microbatches, k=k)
    return tuple(int(peak) for peak in order_peak_activation(schedule, (1.0,) * stages))
