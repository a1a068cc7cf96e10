"""DAPPLE's analytical pieces: the pivot-stage latency model, ring all-reduce, and GPU placement policies.

Fan et al., "DAPPLE: A Pipelined Data Parallel Approach for Training Large
Models", PPoPP 2021 (arXiv 2007.01045), and the planner in the authors'
repository (AlibabaPAI/DAPPLE, `planner/`). Pure functions over lists.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

FRESH_FIRST = "fresh-first"
APPEND_FIRST = "append-first"
SCATTER_FIRST = "scatter-first"
POLICIES = (FRESH_FIRST, APPEND_FIRST, SCATTER_FIRST)


def pivot_stage(fwd: Sequence[float], bwd: Sequence[float], microbatches: int) -> int:
    """The pivot Q: scanning from the last stage down, stage s takes over when its steady phase outlasts Q's.

    s replaces Q when (M-1)(F_s+B_s) > (M-1)(F_Q+B_Q) + sum_{s<t<=Q}(F_t+B_t):
    the extra steady work of s is more than the work s's microbatches still
    meet between s and Q. Ties keep the later stage.
    """
    q = len(fwd) - 1
    between = 0.0  # sum of F_t + B_t for s < t <= q
    for s in range(len(fwd) - 2, -1, -1):
        between += fwd[s + 1] + bwd[s + 1]
        if (microbatches - 1) * (fwd[s] + bwd[s]) > (microbatches - 1) * (fwd[q] + bwd[q]) + between:
            q = s
            between = 0.0
    return q


def pivot_latency(fwd: Sequence[float], bwd: Sequence[float], allreduce: Sequence[float], microbatches: int) -> tuple[float, int]:
    """DAPPLE's iteration latency L = T_w + T_s + T_e and its pivot stage Q.

    Args:
        fwd, bwd: per-stage time of one microbatch; transfers between stages
            enter as stages of their own (F = B = transfer time, no all-reduce).
        allreduce: per-stage gradient all-reduce time AR(P_s, r_s).
        microbatches: M.

    Returns:
        (L, Q) with warm-up T_w = sum_{s<=Q} F_s, steady T_s = (M-1)(F_Q+B_Q),
        ending T_e = max_s AR_s + K_s, where K_s = sum_{s<=t<=Q} B_t is the
        backward work of the last microbatch still ahead of stage s's last
        backward for s <= Q, and K_s = -sum_{Q<t<s} B_t for s > Q (those stages
        finished their last backward before Q started its own).
    """
    q = pivot_stage(fwd, bwd, microbatches)
    warmup = sum(fwd[: q + 1])
    steady = (microbatches - 1) * (fwd[q] + bwd[q])
    ending = -math.inf
    ahead = sum(bwd[: q + 1])  # K_0; each step down the pipeline removes that stage's backward
    for s in range(len(fwd)):
        ending = max(ending, allreduce[s] + ahead)
        ahead -= bwd[s]
    return warmup + steady + ending, q


def dapple_allreduce_ms(param_bytes: float, replicas: int, slowest_bytes_per_ms: float) -> float:
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
    nodes: Sequence[Sequence[int]], used: tuple[int, ...], need: int, replicas: int, policy: str
) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """Allocate `need` GPUs for each of `replicas` pipeline replicas in turn with one policy.

    Returns the GPUs replica-major (replica t's GPUs at [t*need:(t+1)*need],
    each replica's sorted) and the new use counts; None when too few are free.
    """
    count = list(used)
    avail = [i for i, node in enumerate(nodes) if count[i] < len(node)]  # machines with a free GPU, in order
    if sum(len(nodes[i]) - count[i] for i in avail) < need * replicas:
        return None
    partly = sum(1 for i in avail if count[i])  # machines with some GPUs taken and some free
    fresh = 0  # no machine before this one is fresh: counts only grow, so the first fresh machine only moves on
    devices: list[int] = []
    for _ in range(replicas):
        taken: list[int] = []
        while len(taken) < need:
            if policy == SCATTER_FIRST:
                picks = [(i, 1) for i in avail[: need - len(taken)]]
            elif policy == FRESH_FIRST and partly < len(avail):
                while count[fresh] or not nodes[fresh]:  # the first available machine with nothing taken
                    fresh += 1
                picks = [(fresh, need - len(taken))]
            elif policy == APPEND_FIRST and partly:
                picks = [(next(i for i in avail if count[i]), need - len(taken))]
            else:
                picks = [(avail[0], need - len(taken))]
            for i, want in picks:
                k = min(len(nodes[i]) - count[i], want)
                partly += (count[i] + k < len(nodes[i])) - (count[i] > 0)
                taken += nodes[i][count[i] : count[i] + k]
                count[i] += k
            for i, _ in picks:
                if count[i] == len(nodes[i]):
                    avail.remove(i)
        devices += sorted(taken)
    return tuple(devices), tuple(count)
