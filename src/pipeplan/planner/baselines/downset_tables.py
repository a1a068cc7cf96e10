"""PipeDream's planning states: the down-sets of a DAG reachable from its first source, as bitmasks.

A state is a down-set D (closed under producers) of the graph's nodes; a
stage is the difference D_j \\ D_k of two nested states. PipeDream builds
these states as "antichains" and walks from one to the next by replacing a
node of the (augmented) antichain with one of its consumers; the down-set of
the result is D ∪ ancestors(v) for a node v outside D that consumes a node of
D. So the states are the closure of {first source} under
D -> D ∪ anc(v), v ∉ D, v consumes some u ∈ D, which this module enumerates
breadth-first with integer bitmasks (bit i = node i) instead of lists of
node objects. The enumeration (and bits, maximal, the membership matrix,
StateLimitError, importable from here too) is core.downsets', the one the DAG
search uses as well; this module adds PipeDream's sums and its cut.

Note:
    `cut_bytes[i]` is PipeDream's "output activation size" of state i: the
    activations of its augmented antichain, i.e. the maximal nodes X of D_i
    plus every ancestor p of some a ∈ X with a consumer outside a's own
    ancestry. That also counts a p whose consumers all lie inside D_i (a
    diamond x -> a, x -> b with both a and b in X counts x): kept as the
    original computes it, since its plans depend on it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeplan.core.downsets import StateLimitError, bits, consumer_masks, downsets, maximal
from pipeplan.core.downsets import ancestor_masks as core_ancestor_masks
from pipeplan.core.downsets import membership as mask_matrix
from pipeplan.planner.baselines.pipedream_graph import PipeDreamGraph

__all__ = [
    "DownsetStates", "StateLimitError", "ancestor_masks", "augmented_extra", "bits", "downset_states",
    "enumerate_downsets", "mask_matrix", "maximal", "nested", "range_table", "range_tables", "successor_masks",
]  # fmt: skip


@dataclass(frozen=True, slots=True)
class DownsetStates:
    """The reachable down-sets of a DAG, ordered by size then discovery, with PipeDream's per-state sums.

    `masks[i]` is state i's node set; `work_ms[i]` the forward + backward
    time of its nodes, `activation_bytes[i]`, `param_bytes[i]` their sums,
    `cut_bytes[i]` the bytes PipeDream sends over a cut placed right after
    state i. The last state is the whole graph. State order is a topological
    order of inclusion (a subset never comes after a superset).
    """

    masks: tuple[int, ...]
    work_ms: np.ndarray
    activation_bytes: np.ndarray
    param_bytes: np.ndarray
    cut_bytes: np.ndarray

    @property
    def count(self) -> int:
        """Number of states."""
        return len(self.masks)

    def members(self, i: int) -> list[int]:
        """Node indices of state i, ascending."""
        return bits(self.masks[i])


def enumerate_downsets(dag: PipeDreamGraph, first: int, limit: int | None = None) -> list[int]:
    """Every down-set reachable from {first} (a source), as bitmasks in breadth-first discovery order.

    Raises:
        StateLimitError: more than `limit` states (naming the limit and the graph).
    """
    return downsets(dag.producers, ancestor_masks(dag)[first], successor_masks(dag)[first], limit, dag.name)


def ancestor_masks(dag: PipeDreamGraph) -> list[int]:
    """Per node, a bitmask (bit i = node i) of its ancestors and itself: the down-set it generates."""
    return core_ancestor_masks(dag.producers)


def successor_masks(dag: PipeDreamGraph) -> list[int]:
    """Per node, a bitmask of the nodes that consume its output."""
    return consumer_masks(dag.producers)


def augmented_extra(dag: PipeDreamGraph) -> list[int]:
    """Per node a, PipeDream's extra nodes when a is in an antichain: ancestors of a with a consumer outside a's
    ancestry (a itself excluded)."""
    anc = ancestor_masks(dag)
    succ = successor_masks(dag)
    # A strict ancestor p of a with one consumer c reaches a through c, so c is in a's ancestry: only nodes with two
    # or more consumers can count (a chain has none, which made this loop quadratic in big-integer steps for nothing).
    branching = sum(1 << p for p, consumers in enumerate(succ) if consumers & (consumers - 1))
    extra = []
    for a in range(dag.num_nodes):
        mask = 0
        for p in bits(anc[a] & ~(1 << a) & branching):
            if succ[p] & ~anc[a]:
                mask |= 1 << p
        extra.append(mask)
    return extra


def downset_states(dag: PipeDreamGraph, first: int, limit: int | None = None) -> DownsetStates:
    """The reachable down-sets of `dag` from source `first`, sorted by size (then discovery), with their sums.

    Raises:
        StateLimitError: more than `limit` states.
    """
    found = enumerate_downsets(dag, first, limit)
    ranked = sorted(range(len(found)), key=lambda i: (found[i].bit_count(), i))
    masks = tuple(found[i] for i in ranked)
    member = mask_matrix(masks, dag.num_nodes)
    work, act, par = dag.work_ms, dag.activation_bytes, dag.param_bytes
    return DownsetStates(
        masks=masks,
        work_ms=member @ work,
        activation_bytes=member @ act,
        param_bytes=member @ par,
        cut_bytes=augmented_members(dag, member) @ act,
    )


def augmented_members(dag: PipeDreamGraph, member: np.ndarray) -> np.ndarray:
    """Per state (a row of `member`), its augmented antichain as a bool row: the maximal nodes X of the down-set (a
    node none of whose consumers is in it) and augmented_extra of each node of X (module docstring).

    Note:
        Whole rows in numpy, then Python only for the nodes of X that have extra nodes: walking every node of every
        state with integer masks (core.downsets.maximal) was cubic in a chain's length (41 s at 5,000 layers).
    """
    consumers = dag.consumers()
    sources = np.array([u for u, cs in enumerate(consumers) if cs], dtype=np.int64)
    targets = np.array([w for cs in consumers for w in cs], dtype=np.int64)
    consumed_inside = np.zeros_like(member)
    if targets.size:
        starts = np.cumsum([0, *[len(cs) for cs in consumers if cs][:-1]])
        consumed_inside[:, sources] = np.logical_or.reduceat(member[:, targets], starts, axis=1)
    augmented = member & ~consumed_inside
    extra = augmented_extra(dag)
    with_extra = np.array([a for a, mask in enumerate(extra) if mask], dtype=np.int64)
    if with_extra.size:
        for i in np.flatnonzero(augmented[:, with_extra].any(axis=1)):
            mask = 0
            for a in with_extra[augmented[i, with_extra]]:
                mask |= extra[int(a)]
            augmented[i] |= mask_matrix([mask], dag.num_nodes)[0]
    return augmented


def nested(states: DownsetStates, nodes: int) -> np.ndarray:
    """inside[k, j]: state k's down-set is a proper subset of state j's."""
    member = mask_matrix(states.masks, nodes).astype(np.float32)
    inside = (member @ (1.0 - member).T) == 0
    np.fill_diagonal(inside, False)
    return inside


def range_tables(states: DownsetStates, nodes: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """Which (row, column) pairs name a node set, and each state's proper-subset states.

    Row r means "after state r-1" (row 0: from nothing), column j "up to
    state j": valid[r, j] when r = 0 or D_{r-1} is a proper subset of D_j, the
    node set D_j minus D_{r-1}.
    """
    proper = nested(states, nodes)
    valid = np.vstack([np.ones((1, states.count), dtype=bool), proper])
    return valid, [np.flatnonzero(proper[:, j]) for j in range(states.count)]


def range_table(values: np.ndarray, valid: np.ndarray, missing: float) -> np.ndarray:
    """A per-state cumulative value over every (row, column) range of range_tables (`missing` where invalid)."""
    full = np.vstack([values[None, :], values[None, :] - values[:, None]])
    return np.where(valid, full, missing)
