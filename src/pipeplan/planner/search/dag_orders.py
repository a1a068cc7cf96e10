"""Layer orders for a DAG profile in which good antichain cuts are contiguous: a DP over down-sets per stage count.

For p = 2..P the DP finds the partition of the DAG into p stages, each the
difference of two nested down-sets, that minimizes the bottleneck
max(largest stage's forward + backward ms, largest boundary's live bytes /
the cluster's slowest link rate); its order (core.dag: stage by stage) makes
that partition contiguous. Partitions whose boundaries nest (a chain under
inclusion) share one order; orders whose boundaries are all prefixes of the
profile's own order add nothing and are dropped. pipeplan's search then runs
on the default order and on each of these (planner.search.selection).

What the orders cover (the argument, not a measurement):
1. A partition into stages S1..Sp whose every prefix union S1 ∪ .. ∪ Sk is a
   down-set (the cuts PipeDream's planner makes, at antichains) is contiguous
   in order_from_stages(S): stage by stage, layers by index inside a stage,
   is a topological order because every input of a layer in Sk lies in Sk
   (smaller index) or an earlier stage. Conversely every contiguous
   partition of a topological order has down-set prefixes. So "search the
   contiguous partitions of a set of orders" covers exactly the down-set
   partitions contiguous in one of those orders.
2. The default order covers every partition pipeplan planned before (its
   search runs first, unchanged, and wins ties), so no plan gets slower.
3. For each p = 2..P (P = min(devices, 16); 8 above STATE_LIMIT states) the DP
   returns a partition Π_p minimizing the bottleneck above over every
   down-set partition into p stages (exactly over all down-sets when the DAG
   without free sources and sinks has at most STATE_LIMIT of them; over all
   down-sets of the graph with series chains merged, boundaries within a
   band of k/p of the work, up to MERGED_LIMIT; else over the lattice or the
   prefixes named by dag_states.states). Π_p is contiguous in the order of its
   group (chain_groups), in the default order when all its boundaries are
   prefixes of it, or is left out when MAX_ORDERS groups came before its own
   (the extra-order budget: then the search never saw it as one order).
   The search on that order then considers Π_p and every other contiguous
   partition of it, with any replication and schedule, scored by the
   simulator (the DP's bottleneck is only the guide that picks orders).
What is not covered: down-set partitions that are neither contiguous in the
default order nor in a DP order (for instance a partition with p stages that
beats Π_p in the simulator but not in the bottleneck guide, or one that
needs cuts from two different groups).
"""

from __future__ import annotations

import itertools

import numpy as np

from pipeplan.core.dag import is_identity
from pipeplan.core.profile import ModelProfile
from pipeplan.planner.search.dag_states import STATE_LIMIT, Reduced, live_bytes, membership, states

MAX_STAGES = 16
"""The largest stage count the DP plans for (the search's stages are at most 32; a DAG's antichain cuts matter most
at the few boundaries of a short pipeline)."""
MAX_STAGES_LARGE = 8
"""The largest stage count over more than STATE_LIMIT states."""
BAND = 0.25
"""Above STATE_LIMIT states, boundary k of p keeps within BAND * W / p of k * W / p work (W: all of it)."""
MAX_ORDERS = 3
"""Orders beyond the default at most (each costs one more run of the search)."""
_BLOCK = 512


def subset_blocks(member: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """Per block of states j (start, bool matrix [i, j - start]): state i is a proper subset of state j."""
    ones = member.astype(np.float32)
    out = []
    for start in range(0, len(member), _BLOCK):
        outside = (~member[start : start + _BLOCK]).astype(np.float32)
        sub = (ones @ outside.T) == 0
        span = np.arange(start, start + len(outside))
        sub[span, span - start] = False
        out.append((start, sub))
    return out


def bottleneck_partitions(work: np.ndarray, live: np.ndarray, member: np.ndarray, stages: int) -> list[list[int]]:
    """For p = 1..stages, the states at the boundaries of a partition of the last state (all nodes) into p stages from
    the first (empty) that minimizes max(stage work, boundary live cost); empty when none has p stages."""
    count = len(work)
    blocks = subset_blocks(member)
    best = work - work[0]
    best[0] = np.inf
    choices: list[np.ndarray] = []
    answers: list[list[int]] = [[]]
    for _ in range(2, stages + 1):
        nxt = np.full(count, np.inf)
        arg = np.zeros(count, dtype=np.int64)
        for start, sub in blocks:
            cols = slice(start, start + sub.shape[1])
            cost = np.maximum(np.maximum(best[:, None], work[None, cols] - work[:, None]), live[:, None])
            cost[~sub] = np.inf
            pick = np.argmin(cost, axis=0)
            arg[cols] = pick
            nxt[cols] = cost[pick, np.arange(sub.shape[1])]
        choices.append(arg)
        best = nxt
        if not np.isfinite(best[-1]):
            answers.append([])
            continue
        cuts, j = [], count - 1
        for table in reversed(choices):
            j = int(table[j])
            cuts.append(j)
        answers.append(cuts[::-1])
    return answers


def banded_partitions(work: np.ndarray, live: np.ndarray, member: np.ndarray, stages: int) -> list[int]:
    """The boundary states of a partition into `stages` stages minimizing max(stage work, boundary live cost) among
    those whose k-th boundary does k/stages of the work, give or take a quarter stage (BAND); empty when none nests."""
    total = work[-1]
    width = BAND * total / stages
    levels = [np.flatnonzero(np.abs(work - k * total / stages) <= width) for k in range(1, stages)]
    levels = [lv[lv < len(work) - 1] for lv in levels]
    if any(len(lv) == 0 for lv in levels):
        return []
    ones = member.astype(np.float32)
    best = np.maximum(work[levels[0]], live[levels[0]])
    back: list[np.ndarray] = []
    for below, above in itertools.pairwise(levels):
        sub = (ones[below] @ (~member[above]).astype(np.float32).T) == 0
        sub &= below[:, None] != above[None, :]  # a proper subset
        cost = np.maximum(np.maximum(best[:, None], work[above][None, :] - work[below][:, None]), live[above][None, :])
        cost[~sub] = np.inf
        pick = np.argmin(cost, axis=0)
        back.append(pick)
        best = cost[pick, np.arange(len(above))]
    final = np.maximum(best, total - work[levels[-1]])
    j = int(np.argmin(final))
    if not np.isfinite(final[j]):
        return []
    cuts = [int(levels[-1][j])]
    for level, pick in zip(reversed(levels[:-1]), reversed(back), strict=True):
        j = int(pick[j])
        cuts.append(int(level[j]))
    return cuts[::-1]


def chain_groups(partitions: list[list[int]], masks: list[int]) -> list[list[int]]:
    """Boundary states grouped so each group is a chain under inclusion (one order holds all its cuts), in the order of
    the partitions that opened them."""
    groups: list[set[int]] = []
    for cuts in partitions:
        for group in groups:
            if all(masks[a] & masks[b] in (masks[a], masks[b]) for a in cuts for b in group):
                group.update(cuts)
                break
        else:
            if cuts:
                groups.append(set(cuts))
    return [sorted(g, key=lambda s: masks[s].bit_count()) for g in groups]


def group_order(reduced: Reduced, chain: list[int], masks: list[int]) -> tuple[int, ...]:
    """The profile order whose prefixes include every state of `chain`: the nodes of each difference in index order."""
    order: list[int] = []
    done = 0
    for mask in [*(masks[s] for s in chain), (1 << len(reduced.nodes)) - 1]:
        order.extend(v for v in range(len(reduced.nodes)) if mask >> v & 1 and not done >> v & 1)
        done |= mask
    return reduced.expand(order)


def dag_orders(profile: ModelProfile, rate_bytes_per_ms: float, max_stages: int) -> tuple[list[tuple[int, ...]], str]:
    """Orders of a DAG profile, beyond its own, in which the bottleneck-optimal down-set partitions into 2..max_stages
    stages are contiguous (at most MAX_ORDERS), and which states the DP ran over (`all`, `lattice`, `prefixes`;
    `chain` for a profile without a DAG)."""
    if profile.layer_inputs is None:
        return [], "chain"
    reduced, masks, kind = states(profile, STATE_LIMIT)
    member = membership(masks, len(reduced.nodes))
    work = member.astype(np.float64) @ reduced.work_ms
    live = live_bytes(reduced, member) / rate_bytes_per_ms if rate_bytes_per_ms > 0 else np.zeros(len(masks))
    if len(masks) <= STATE_LIMIT:
        stages = max(2, min(max_stages, MAX_STAGES, len(reduced.nodes)))
        partitions = bottleneck_partitions(work, live, member, stages)[1:]
    else:
        stages = max(2, min(max_stages, MAX_STAGES_LARGE, len(reduced.nodes)))
        partitions = [banded_partitions(work, live, member, p) for p in range(2, stages + 1)]
    orders: list[tuple[int, ...]] = []
    for chain in chain_groups(partitions, masks):
        if all(not masks[s] & (masks[s] + 1) for s in chain):
            continue  # every cut is a prefix of the default order: the default covers it
        order = group_order(reduced, chain, masks)
        if not is_identity(order) and order not in orders:
            orders.append(order)
        if len(orders) == MAX_ORDERS:
            break
    return orders, kind
