"""The replicated-pipeline seeds' analytical pieces: all-reduce estimate, GPU placement policies (the pivot-stage
latency is DAPPLE's own: baselines.dapple.pivot).

pipeplan's own seed generator (search.replicated.seeds), not the `dapple` baseline: these pieces come from the
earlier reading of Fan et al., "DAPPLE: A Pipelined Data Parallel Approach for Training Large
Models", PPoPP 2021 (arXiv 2007.01045), and the planner in the authors'
repository (AlibabaPAI/DAPPLE, `planner/`). Pure functions over lists.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np

FRESH_FIRST = "fresh-first"
APPEND_FIRST = "append-first"
SCATTER_FIRST = "scatter-first"
POLICIES = (FRESH_FIRST, APPEND_FIRST, SCATTER_FIRST)


def ring_allreduce_ms(param_bytes: float, replicas: int, slowest_bytes_per_ms: float) -> float:
    """DAPPLE's own all-reduce estimate (the paper's 2 W (r-1) / (r B_slowest), no latency term: not sim.cost.link_model's
    ring); 0 for one replica."""
    if replicas < 2:
        return 0.0
    return 2.0 * param_bytes * (replicas - 1) / (replicas * slowest_bytes_per_ms)


def allocate(
    nodes: Sequence[Sequence[int]], used: tuple[int, ...], need: int, policy: str
) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """Pick `need` free GPUs by a placement policy; return (sorted GPUs, new use counts) or None.

    `nodes` lists each machine's GPU ids (ascending); `used[i]` GPUs of machine
    i are taken, always its first ones (every policy takes a machine's lowest
    free GPUs, so the free GPUs of a machine are the tail of its list). Fresh
    First fills whole unused machines first (all-reduce stays inside a
    machine), Append First fills partly used machines first (packs stages),
    Scatter First takes one GPU from each machine in turn.
    """
    return allocate_replicas(nodes, used, need, 1, policy)


def allocate_replicas(
    nodes: Sequence[Sequence[int]],
    used: tuple[int, ...],
    need: int,
    replicas: int,
    policy: str,
    sizes: Sequence[int] | None = None,
    grid: np.ndarray | None = None,
    ints: Sequence[int] | None = None,
) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """Allocate `need` GPUs for each of `replicas` pipeline replicas in turn with one policy.

    Returns the GPUs replica-major (replica t's GPUs at [t*need:(t+1)*need],
    each replica's sorted) and the new use counts; None when too few are free.
    `sizes` (each machine's GPU count) may be passed to save counting;
    `grid` (machines x GPU ids, when every machine has as many) lets Fresh
    and Append First, and Scatter First for one GPU, place with numpy;
    `ints[g]` is the int object to return for GPU g (the caller's own: numpy
    makes new ones, 28 bytes per GPU per cached placement, a gigabyte on
    8,192 GPUs).
    Each replica takes, until it has `need`: Scatter First one GPU from each
    of the first machines with a free one; Fresh First from the first machine
    nothing is taken from; Append First from the first partly used machine;
    else (no such machine) from the first machine with a free GPU.

    Note:
        Cost is in the GPUs placed, not in replicas x machines: the first
        machine with a free GPU moves only forward (a pointer that skips full
        machines), so does the first fresh one, and partly used machines wait
        in a heap (8,192 GPUs: rp = 4,096 replicas placed in milliseconds).
    """
    count = list(used)
    size = [len(node) for node in nodes] if sizes is None else sizes
    m = len(nodes)
    if sum(size) - sum(count) < need * replicas:
        return None
    if grid is not None and (policy != SCATTER_FIRST or need == 1):
        placed, final = _on_grid(grid, np.asarray(count), need, replicas, policy)
        return (placed if ints is None else tuple(map(ints.__getitem__, placed))), final
    head: tuple[int, ...] = ()
    if grid is not None:  # Scatter First: the replicas the lanes serve, the rest one by one below
        head, count, replicas = _scatter_lanes(grid, np.asarray(count), need, replicas)
        head = head if ints is None else tuple(map(ints.__getitem__, head))
        if not replicas:
            return head, tuple(count)
    skip = list(range(m))  # skip[i]: no machine in i..skip[i]-1 has a free GPU (full machines stay full)

    def first_free(i: int) -> int:
        path = []
        while i < m and count[i] >= size[i]:
            path.append(i)
            i = max(skip[i], i + 1)
        for j in path:
            skip[j] = i
        return i

    partly = [i for i in range(m) if 0 < count[i] < size[i]] if policy == APPEND_FIRST else []
    heapq.heapify(partly)
    fresh = 0 if policy == FRESH_FIRST else m
    devices: list[int] = []
    for _ in range(replicas):
        taken: list[int] = []
        while len(taken) < need:
            while fresh < m and (count[fresh] or not size[fresh]):
                fresh += 1
            while partly and count[partly[0]] >= size[partly[0]]:
                heapq.heappop(partly)
            picks: list[tuple[int, int]] = []
            if policy == SCATTER_FIRST:
                i = first_free(0)
                while i < m and len(picks) < need - len(taken):
                    picks.append((i, 1))
                    i = first_free(i + 1)
            elif fresh < m:
                picks = [(fresh, need - len(taken))]
            elif partly:
                picks = [(partly[0], need - len(taken))]
            else:
                picks = [(first_free(0), need - len(taken))]
            for i, want in picks:
                k = min(size[i] - count[i], want)
                if policy == APPEND_FIRST and count[i] == 0 and count[i] + k < size[i]:
                    heapq.heappush(partly, i)
                taken += nodes[i][count[i] : count[i] + k]
                count[i] += k
        devices += sorted(taken)
    return head + tuple(devices), tuple(count)


def _on_grid(
    grid: np.ndarray, used: np.ndarray, need: int, replicas: int, policy: str
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """allocate_replicas on machines of equal size (`grid`: machines x GPU ids), the policies as it says.

    One GPU per replica, or Append First: replicas take the free GPUs in turn, machine by machine (Append First:
    partly used machines first; Fresh First with one GPU: one from each fresh machine first). Fresh First: each
    replica takes ceil(need / size) fresh machines in order, the last one in part; when fresh machines run out,
    the next replica takes the fresh ones left whole, and from there replicas take the free GPUs in turn.
    """
    m, size = grid.shape
    column = np.arange(size)[None, :]
    every = np.arange(m)
    count = used.copy()

    def free_ids(rows: np.ndarray) -> np.ndarray:
        return grid[rows][column >= count[rows][:, None]]

    fresh = every[count == 0]
    if policy == APPEND_FIRST:
        partly = (count > 0) & (count < size)
        taken = np.concatenate([free_ids(every[partly]), free_ids(every[~partly])])[: need * replicas]
    elif policy == FRESH_FIRST:
        per = -(-need // size)
        whole = min(replicas, len(fresh) // per)
        rows = fresh[: whole * per]
        first = grid[rows].reshape(whole, per * size)[:, :need].reshape(-1)
        count[rows] = size
        if whole:
            count[rows[per - 1 :: per]] = need - (per - 1) * size
        left = fresh[whole * per :] if whole < replicas else fresh[:0]
        head = grid[left].reshape(-1)
        count[left] = size
        taken = np.concatenate([first, head, free_ids(every)[: (replicas - whole) * need - len(head)]])
    else:
        taken = free_ids(every)[: need * replicas]
    machine = np.zeros(int(grid.max()) + 1, dtype=np.int64)
    machine[grid.reshape(-1)] = np.repeat(every, size)
    final = used + np.bincount(machine[taken], minlength=m)
    placed = np.sort(taken.reshape(replicas, need), axis=1).reshape(-1)
    return tuple(placed.tolist()), tuple(final.tolist())


def _scatter_lanes(grid: np.ndarray, used: np.ndarray, need: int, replicas: int) -> tuple[tuple[int, ...], list[int], int]:
    """Scatter First on machines of equal size while at least `need` machines have a free GPU: (GPUs of the replicas
    served, replica-major; use counts after them; replicas left).

    Each replica takes one GPU from each of the first `need` machines with a free one. Seen as `need` lanes, a
    lane hands out its machine's free GPUs one per replica and, when its machine is full, takes the next machine
    in order (lanes that run dry together take them in any order: the set each replica gets is the same). Served
    while every lane still has a GPU; the rest (too few machines left) go to the one-by-one loop.
    """
    m, size = grid.shape
    free = np.flatnonzero(used < size)
    if len(free) < need:
        return (), used.tolist(), replicas
    room = (size - used).tolist()
    lanes = [[int(f)] for f in free[:need]]
    heap = [(room[f], lane) for lane, f in enumerate(free[:need].tolist())]
    heapq.heapify(heap)
    for f in free[need:].tolist():
        end, lane = heap[0]
        if end >= replicas:
            break
        lanes[lane].append(f)
        heapq.heapreplace(heap, (end + room[f], lane))
    served = min(replicas, heap[0][0])
    columns = []
    for lane in lanes:
        ids = np.concatenate([grid[f, used[f] :] for f in lane])
        columns.append(ids[:served])
    taken = np.stack(columns, axis=1)  # replicas x need
    machine = np.zeros(int(grid.max()) + 1, dtype=np.int64)
    machine[grid.reshape(-1)] = np.repeat(np.arange(m), size)
    count = used + np.bincount(machine[taken.reshape(-1)], minlength=m)
    return tuple(np.sort(taken, axis=1).reshape(-1).tolist()), count.tolist(), replicas - served
