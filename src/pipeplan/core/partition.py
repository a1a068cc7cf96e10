"""The one contiguous-partition solver: split a sequence of weights into consecutive blocks.

Every partitioner and blocker of pipeplan cuts through here: the balanced planner's stages and the straight
pipelines (`solve`: the smallest largest block sum, exact), interleaved chunks on ranks of unequal speed
(`solve_scaled`), the DP baselines' layer groups (`quantile_starts`), the search's blocks (`quantile_ends`), the
runtime's stages of a schedule (`split_evenly`) and the one rule of a microbatch's samples over a stage's replicas,
which the runtime runs and the simulator prices (`replica_split`). Bounds are indices [0, b1, ..., n]: block i holds
weights[bounds[i]:bounds[i + 1]] unless a function says otherwise. Where two callers needed different answers
(tie-breaking, exactness), each keeps its own variant, tested against the outputs the old functions gave.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from itertools import accumulate

import numpy as np

from pipeplan.core.errors import PlanError


def prefix_sums(values: Iterable[float]) -> list[float]:
    """[0, v0, v0+v1, ...]: the sum of values[i..j] is out[j + 1] - out[i]."""
    out = [0.0]
    for v in values:
        out.append(out[-1] + v)
    return out


def split_evenly(count: int, parts: int) -> list[tuple[int, int]]:
    """[lo, hi) of `parts` consecutive runs of `count` items, sizes differing by at most one, larger ones first (as
    torch.tensor_split splits rows): a microbatch's samples over a stage's replicas, layers over a schedule's stages."""
    base, extra = divmod(count, parts)
    ranges, lo = [], 0
    for j in range(parts):
        hi = lo + base + (1 if j < extra else 0)
        ranges.append((lo, hi))
        lo = hi
    return ranges


def splits_evenly(samples: int, replicas: int) -> bool:
    """Whether a microbatch of `samples` splits over `replicas` as the one replica rule requires: every replica the
    same share (samples / replicas, the share the cost model prices), at least one sample each."""
    return replicas >= 1 and samples >= replicas and samples % replicas == 0


def replica_split(samples: int, replicas: int) -> list[tuple[int, int]]:
    """[lo, hi) of each replica's share of a microbatch, the one replica rule: consecutive runs, sizes differing by at
    most one, larger first (the runtime's tensor rows). The simulator prices samples / replicas per replica, which is
    this split exactly when `splits_evenly`; every plan it prices must split evenly (sim.cost.plan_costs)."""
    return split_evenly(samples, replicas)


def quantile_ends(weights: Sequence[float], parts: int) -> list[int]:
    """For q = 1 .. parts - 1, the index of the element at which the running sum of weights first reaches q / parts of
    the total (the ideal last element of block q - 1); with no positive total, the even positions n q / parts - 1."""
    n = len(weights)
    prefix = list(accumulate(weights))
    total = prefix[-1] if prefix else 0.0
    if total > 0:
        return [bisect_left(prefix, total * q / parts) for q in range(1, parts)]
    return [(n * q) // parts - 1 for q in range(1, parts)]


def quantile_starts(weights: Sequence[float], parts: int) -> list[int]:
    """The first index of each of at most `parts` blocks of about equal weight (every index when there are no more
    elements than parts).

    A block starts after the element at which the running sum first reaches the next multiple of total / parts, so a
    block may hold one heavy element only and zero weights join the block before them; the last elements each
    start a block when as many blocks are left as elements.
    """
    n = len(weights)
    if n <= parts:
        return list(range(n))
    total = sum(weights) or 1.0
    starts = [0]
    running = 0.0
    for i in range(n - 1):
        running += weights[i]
        blocks_left = parts - len(starts)
        elements_left = n - 1 - i
        target = total * len(starts) / parts
        if blocks_left > 0 and (running >= target or elements_left <= blocks_left):
            starts.append(i + 1)
    return starts


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


def bottleneck(costs: Sequence[float], parts: int) -> float:
    """The smallest possible largest block sum over partitions of costs into at most `parts` contiguous blocks.

    The optimum is the sum of some contiguous range, so it is the smallest range sum the greedy feasibility probe
    accepts. The n^2/2 range sums are never built (20,000 layers would take gigabytes): row i's sums prefix[j] -
    prefix[i], j > i, rise with j, so each row keeps the window of its sums still in play, and a random pick among
    them (a fixed generator: the same answer and path every time) either is feasible (drop it and every larger sum) or not
    (drop it and every smaller one); about 2 ln(n^2) probes, each O(n log n), in O(n) memory.
    """
    prefix = prefix_sums(costs)
    n = len(costs)
    array = np.asarray(prefix)  # array[j] - array[i]: the same float subtraction as the probe
    rows = np.arange(n)
    low = rows + 1  # first column of each row still in play
    high = np.full(n, n + 1)  # one past the last
    best = math.inf
    state = 0  # the picks' generator (_next_pick); the answer is the optimum whatever the picks, only the path changes
    while True:
        sizes = high - low
        ends = np.cumsum(sizes)
        total = int(ends[-1])
        if total == 0:
            return best
        state, pick = _next_pick(state, total)
        row = int(np.searchsorted(ends, pick, side="right"))
        col = int(low[row] + pick - (ends[row] - sizes[row]))
        value = float(array[col] - array[row])
        if blocks_needed(prefix, value) <= parts:
            best = value
            high = _first_column(array, rows, low, high, value, strict=False)  # keep only sums below value
        else:
            low = _first_column(array, rows, low, high, value, strict=True)  # keep only sums above value


def _next_pick(state: int, total: int) -> tuple[int, int]:
    """(next state, a pick in 0..total-1) of a 64-bit linear congruential generator (Knuth's MMIX constants): the top
    53 bits of the state scaled to `total`. bottleneck's pivots need no more (importing numpy.random for them cost
    a plan process 16 ms)."""
    state = (state * 6364136223846793005 + 1442695040888963407) & 0xFFFFFFFFFFFFFFFF
    return state, ((state >> 11) * total) >> 53


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


def solve(costs: Sequence[float], parts: int) -> list[int]:
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
    bound = bottleneck(costs, parts)
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


def solve_scaled(work: list[float], factors: list[float]) -> list[tuple[int, int]] | None:
    """Split layers into len(factors) contiguous non-empty chunks minimizing max(sum(work) / factor).

    Binary search on the bottleneck with a greedy fill (each chunk takes
    layers while it stays under the bottleneck times its factor, leaving one
    layer for every later chunk). None when there are fewer layers than chunks.
    """
    n, c = len(work), len(factors)
    if n < c:
        return None

    def fill(cap: float) -> list[tuple[int, int]] | None:
        bounds, i = [], 0
        for k in range(c):
            limit = cap * factors[k] * (1 + 1e-12)
            j, total = i + 1, work[i]
            while j < n - (c - k - 1) and total + work[j] <= limit:
                total += work[j]
                j += 1
            if total > limit:
                return None
            bounds.append((i, j - 1))
            i = j
        return bounds if i == n else None

    low, high = 0.0, sum(work) / min(factors) + 1.0
    for _ in range(60):
        mid = (low + high) / 2
        if fill(mid) is None:
            low = mid
        else:
            high = mid
    return fill(high)
