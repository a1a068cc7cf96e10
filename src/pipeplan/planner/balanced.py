"""`balanced`: the contiguous partition minimizing the slowest stage, one device per stage, 1F1B.

What DeepSpeed's `partition_balanced` and torchgpipe's `balance_by_time`
give: layers split into p contiguous blocks so that the largest block time
(forward + backward) is as small as possible, block i on device i.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_right
from collections.abc import Sequence

import numpy as np

from pipeplan.core.errors import PipeplanError, PlanError
from pipeplan.core.plan import Plan, Stage
from pipeplan.planner.base import PlanRequest, PlanResult, register_planner
from pipeplan.planner.baseline_tools import evaluate, powers_of_two_dividing, prefix_sums, require_schedule

MAX_STAGES = 64


def blocks_needed(prefix: Sequence[float], bound: float) -> int:
    """Fewest contiguous blocks with every block sum <= bound (greedy, each block as long as it can be).

    Returns len(prefix) (more than any partition has) when one element exceeds bound.
    """
    n = len(prefix) - 1
    count = start = 0
    while start < n:
        # furthest end with prefix[end] - prefix[start] <= bound; compared the same way candidates were made
        end = bisect_right(prefix, prefix[start] + bound, lo=start + 1) - 1
        while end + 1 <= n and prefix[end + 1] - prefix[start] <= bound:
            end += 1
        while end > start and prefix[end] - prefix[start] > bound:
            end -= 1
        if end == start:
            return n + 1
        count += 1
        start = end
    return count


def min_bottleneck(costs: Sequence[float], parts: int) -> float:
    """The smallest possible largest block sum over partitions of costs into at most `parts` contiguous blocks.

    The optimum is the sum of some contiguous range, so it is the smallest range sum the greedy feasibility probe
    accepts. The n^2/2 range sums are never built (20,000 layers would take gigabytes): row i's sums prefix[j] -
    prefix[i], j > i, rise with j, so each row keeps the window of its sums still in play, and a random pick among
    them (seeded: the same answer and path every time) either is feasible (drop it and every larger sum) or not
    (drop it and every smaller one); about 2 ln(n^2) probes, each O(n log n), in O(n) memory.
    """
    prefix = prefix_sums(costs)
    n = len(costs)
    array = np.asarray(prefix)  # array[j] - array[i]: the same float subtraction as the probe
    rows = np.arange(n)
    low = rows + 1  # first column of each row still in play
    high = np.full(n, n + 1)  # one past the last
    best = math.inf
    rng = np.random.default_rng(0)
    while True:
        sizes = high - low
        ends = np.cumsum(sizes)
        total = int(ends[-1])
        if total == 0:
            return best
        pick = int(rng.integers(total))
        row = int(np.searchsorted(ends, pick, side="right"))
        col = int(low[row] + pick - (ends[row] - sizes[row]))
        value = float(array[col] - array[row])
        if blocks_needed(prefix, value) <= parts:
            best = value
            high = _first_column(array, rows, low, high, value, strict=False)  # keep only sums below value
        else:
            low = _first_column(array, rows, low, high, value, strict=True)  # keep only sums above value


def _first_column(
    array: np.ndarray, rows: np.ndarray, low: np.ndarray, high: np.ndarray, value: float, strict: bool
) -> np.ndarray:
    """Per row i, the first column j in [low[i], high[i]) with array[j] - array[i] >= value (> value when strict),
    or high[i] when there is none: a binary search of every row at once."""
    lo, hi = low.copy(), high.copy()
    last = len(array) - 1
    while True:
        active = lo < hi
        if not active.any():
            return lo
        mid = (lo + hi) // 2
        diff = array[np.minimum(mid, last)] - array[rows]
        ok = diff > value if strict else diff >= value
        hi = np.where(active & ok, mid, hi)
        lo = np.where(active & ~ok, mid + 1, lo)


def balanced_partition(costs: Sequence[float], parts: int) -> list[int]:
    """Split costs into exactly `parts` contiguous non-empty blocks minimizing the largest block sum.

    Returns the block bounds [0, b1, ..., len(costs)] (block i is
    costs[bounds[i]:bounds[i+1]]). Blocks are filled greedily from the front up
    to the optimal bottleneck; while there are fewer than `parts` blocks, the
    block with the largest sum that has two or more elements is split where
    its larger half is smallest (splitting never raises the bottleneck).

    Raises:
        PlanError: parts < 1 or more parts than elements.
    """
    n = len(costs)
    if parts < 1 or parts > n:
        raise PlanError(f"cannot split {n} layers into {parts} non-empty stages")
    bound = min_bottleneck(costs, parts)
    prefix = prefix_sums(costs)
    bounds = [0]
    while bounds[-1] < n:
        start, end = bounds[-1], bounds[-1] + 1
        while end + 1 <= n and prefix[end + 1] - prefix[start] <= bound:
            end += 1
        bounds.append(end)
    while len(bounds) - 1 < parts:
        splittable = [i for i in range(len(bounds) - 1) if bounds[i + 1] - bounds[i] >= 2]
        i = max(splittable, key=lambda b: (prefix[bounds[b + 1]] - prefix[bounds[b]], -b))
        lo, hi = bounds[i], bounds[i + 1]
        cut = min(range(lo + 1, hi), key=lambda c: (max(prefix[c] - prefix[lo], prefix[hi] - prefix[c]), c))
        bounds.insert(i + 1, cut)
    return bounds


def default_microbatch_sizes(global_batch: int, stages: int) -> list[int]:
    """Microbatch sizes to try, preferred first: powers of two, largest with m >= 4p first, then smaller ones.

    GPipe's rule of thumb: m >= 4p microbatches keep the bubble small; among
    those the largest microbatch runs each kernel most efficiently. Smaller
    sizes follow, for when memory does not fit.
    """
    sizes = sorted(powers_of_two_dividing(global_batch), reverse=True)
    good = [b for b in sizes if global_batch // b >= 4 * stages]
    return good + [b for b in sizes if b not in good] if good else sorted(sizes)


def pipeline_replicas(devices: int, stages: int, global_batch: int) -> int:
    """DeepSpeed's data-parallel degree: devices // stages, lowered until it divides the global batch."""
    replicas = max(1, devices // stages)
    while global_batch % replicas:
        replicas -= 1
    return replicas


@register_planner("balanced")
def plan_balanced(request: PlanRequest) -> PlanResult:
    """Plan with the balanced partition over p = min(layers, devices, 64) stages, one device each, 1F1B.

    Stage i runs on device i; when devices are left over, the whole pipeline
    is copied rp = devices // p times (DeepSpeed's data-parallel degree, lowered
    to divide the global batch) onto the next devices in order. The
    microbatch size is the request's, else the largest power of two giving
    m >= 4p microbatches per pipeline that fits in memory (smaller ones if none does).

    Raises:
        PlanError: a schedule other than 1f1b was asked for, or no microbatch size fits.
    """
    started = time.perf_counter()
    require_schedule(request, "balanced", "1f1b")
    profile, cluster = request.profile, request.cluster
    stages_count = min(profile.num_layers, cluster.num_devices, MAX_STAGES)
    replicas = pipeline_replicas(cluster.num_devices, stages_count, request.global_batch) if request.pipelines_allowed else 1
    bounds = balanced_partition([layer.fwd_ms + layer.bwd_ms for layer in profile.layers], stages_count)
    stages = tuple(
        Stage(bounds[i], bounds[i + 1] - 1, tuple(t * stages_count + i for t in range(replicas))) for i in range(stages_count)
    )
    replica_batch = request.global_batch // replicas
    if request.microbatch_size:
        sizes = [request.microbatch_size] if replica_batch % request.microbatch_size == 0 else []
    else:
        sizes = default_microbatch_sizes(replica_batch, stages_count)
    error: PipeplanError | None = None
    for size in sizes:
        plan = Plan(stages, replicas, replica_batch // size, size, "1f1b")
        try:
            result, memory = evaluate(request, plan, record=True)
        except PipeplanError as exc:
            error = error or exc
            continue
        extra = {"bottleneck_ms": max(r.busy for r in result.per_rank) / plan.microbatches}
        return PlanResult(plan, "balanced", result, memory, time.perf_counter() - started, extra)
    if error is None:
        raise PlanError(
            f"planner 'balanced' runs {replicas} pipeline replicas; microbatch size {request.microbatch_size} "
            f"does not divide their batch of {replica_batch}"
        )
    raise PlanError(f"planner 'balanced' found no microbatch size that fits: {error}")
