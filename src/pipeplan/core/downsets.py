"""Down-sets of a DAG (node sets closed under inputs) as integer bitmasks: the one enumeration, and the masks it uses.

A stage boundary of a DAG plan is a down-set D: every node before the
boundary, closed under inputs (the antichain of D's maximal nodes generates
it). Bit i of a mask is node i; `inputs[v]` are the nodes v consumes. Both the
DAG search (planner.search.dag_states: every down-set) and PipeDream's planner
(planner.baselines.downset_tables: the down-sets reachable from its first source)
enumerate with `downsets`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

Inputs = Sequence[Sequence[int]]


class StateLimitError(ValueError):
    """The DAG has more down-sets than the caller allows (a DP over them would not finish)."""


def bits(mask: int) -> list[int]:
    """Indices of the set bits of `mask`, ascending."""
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


def ancestor_masks(inputs: Inputs) -> list[int]:
    """Per node, a bitmask of itself and its ancestors: the down-set it generates (inputs come before their
    consumers in index order)."""
    masks: list[int] = []
    for v, sources in enumerate(inputs):
        mask = 1 << v
        for u in sources:
            mask |= masks[u]
        masks.append(mask)
    return masks


def consumer_masks(inputs: Inputs) -> list[int]:
    """Per node, a bitmask of the nodes that consume its output."""
    succ = [0] * len(inputs)
    for v, sources in enumerate(inputs):
        for u in sources:
            succ[u] |= 1 << v
    return succ


def downsets(inputs: Inputs, start: int, moves: int, limit: int | None = None, name: str = "graph") -> list[int]:
    """The down-sets reachable from down-set `start`, as bitmasks in breadth-first discovery order (`start` first).

    A step goes from D to D ∪ ancestors(v) for a node v outside D that is
    one of `moves` or consumes a node added to D since `start`. From the
    empty set with `moves` = the sources, that is every down-set (a down-set
    grows one node at a time in a topological order of its nodes).

    Raises:
        StateLimitError: more than `limit` down-sets (naming `name` and the limit).
    """
    anc = ancestor_masks(inputs)
    succ = consumer_masks(inputs)
    seen = {start}
    order = [start]
    frontier = [moves & ~start]  # per state, the nodes that may join it next
    head = 0
    while head < len(order):
        mask, cand = order[head], frontier[head]
        head += 1
        todo = cand
        while todo:
            low = todo & -todo
            todo ^= low
            grown = mask | anc[low.bit_length() - 1]
            if grown in seen:
                continue
            if limit is not None and len(order) >= limit:
                raise StateLimitError(f"graph {name!r} has more than {limit:,} reachable down-sets (planning states)")
            added = grown & ~mask
            reach = cand
            while added:
                a = added & -added
                added ^= a
                reach |= succ[a.bit_length() - 1]
            seen.add(grown)
            order.append(grown)
            frontier.append(reach & ~grown)
    return order


def all_downsets(inputs: Inputs, limit: int) -> list[int] | None:
    """Every down-set of the graph as a bitmask, by size then value (the empty set first), or None when there are more
    than `limit`."""
    sources = sum(1 << v for v, vs in enumerate(inputs) if not vs)
    try:
        found = downsets(inputs, 0, sources, limit)
    except StateLimitError:
        return None
    return sorted(found, key=lambda m: (m.bit_count(), m))


def maximal(mask: int, anc: list[int]) -> int:
    """The maximal nodes of down-set `mask` (the antichain that generates it), given ancestor_masks."""
    out = mask
    for v in bits(mask):
        out &= ~(anc[v] & ~(1 << v))
    return out


def membership(masks: Sequence[int], nodes: int) -> np.ndarray:
    """A bool matrix, row i = which of the `nodes` nodes mask i holds."""
    width = (nodes + 7) // 8
    raw = b"".join(m.to_bytes(width, "little") for m in masks)
    flat = np.unpackbits(np.frombuffer(raw, dtype=np.uint8), bitorder="little")
    return flat.reshape(len(masks), width * 8)[:, :nodes].astype(bool)
