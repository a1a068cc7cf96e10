"""The DAG search's planning states of a profile: its down-sets (layer sets closed under inputs), within a limit.

A stage boundary of a DAG plan is a down-set D: every layer before the
boundary, closed under inputs. Free layers (no compute, no parameters) that
are sources (an `Input`, a `hidden` state) or sinks (a `__getitem__` nobody
reads) multiply the down-sets without changing any cost that matters to a
cut, so the states are those of the graph without them (`Reduced`): a free
source goes right before its first consumer, a free sink right after its
last input (`Reduced.expand`). The live bytes of a boundary still count a
free source's output while some but not all of its consumers are before it.

When the reduced graph has more down-sets than STATE_LIMIT, each series
chain (a layer whose one input feeds only it) becomes one node and the
states are that graph's down-sets, up to MERGED_LIMIT; beyond that, the
lattice the prefixes of two orders of the merged graph generate (their
unions and intersections are down-sets too): the default order (every layer
as early as its line allows) and the latest order (every layer as late as
possible); when even that exceeds STATE_LIMIT, those prefixes alone. The
enumeration and the bitmask matrix are core.downsets'.
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass

import numpy as np

from pipeplan.core.dag import consumers_of, inputs_of
from pipeplan.core.downsets import all_downsets
from pipeplan.core.downsets import membership as membership  # dag_orders reads the states' matrix from here
from pipeplan.core.profile import ModelProfile

STATE_LIMIT = 3000
"""Down-sets the DP may visit (it compares every pair: 9 M pairs per stage count at the limit, about 0.1 s)."""
MERGED_LIMIT = 20000
"""Down-sets with series chains as single nodes (above STATE_LIMIT the DP's boundaries keep to bands of work,
dag_orders.banded_partitions)."""


@dataclass(frozen=True)
class Reduced:
    """A profile's DAG as the DP sees it: node i stands for the profile layers `nodes[i]` (kept in that order),
    `inputs` between nodes; free sources and sinks are placed around the node they are attached to."""

    nodes: tuple[tuple[int, ...], ...]
    inputs: tuple[tuple[int, ...], ...]
    work_ms: np.ndarray
    sources: tuple[tuple[int, ...], ...]
    sinks: tuple[tuple[tuple[int, int], ...], ...]
    live_terms: tuple[tuple[int, float, int], ...]

    def expand(self, reduced_order: list[int]) -> tuple[int, ...]:
        """The profile order of an order of the nodes: each free source right before its first consumer, each free
        sink right after its last input."""
        out: list[int] = []
        seen: set[int] = set()
        placed = 0
        for r in reduced_order:
            for s in self.sources[r]:
                if s not in seen:
                    seen.add(s)
                    out.append(s)
            out.extend(self.nodes[r])
            placed |= 1 << r
            for sink, needs in self.sinks[r]:
                if not needs & ~placed:
                    out.append(sink)
        return tuple(out)


def reduce(profile: ModelProfile, merge: bool = False) -> Reduced:
    """The profile's DAG without free sources (all consumers kept) and free sinks (all inputs kept); with `merge`, each
    series chain (a layer whose one input feeds only it) is one node too."""
    inputs = inputs_of(profile)
    consumers = consumers_of(inputs)
    free = [layer.fwd_ms + layer.bwd_ms == 0 and layer.param_bytes == 0 for layer in profile.layers]
    n = profile.num_layers
    source = [free[v] and not inputs[v] and bool(consumers[v]) for v in range(n)]
    sink = [free[v] and not consumers[v] and bool(inputs[v]) and not any(source[u] for u in inputs[v]) for v in range(n)]
    source = [source[v] and not any(sink[c] for c in consumers[v]) for v in range(n)]
    kept = [v for v in range(n) if not source[v] and not sink[v]]
    head = {v: v for v in kept}
    if merge:
        for v in kept:
            real = [u for u in inputs[v] if u in head]
            if len(real) == 1 and sum(c in head for c in consumers[real[0]]) == 1:
                head[v] = head[real[0]]
    heads = sorted(set(head.values()))
    index = {h: i for i, h in enumerate(heads)}
    group = {v: index[head[v]] for v in kept}
    nodes = tuple(tuple(v for v in kept if group[v] == i) for i in range(len(heads)))
    reduced_inputs = tuple(
        tuple(sorted({group[u] for v in members for u in inputs[v] if u in group and group[u] != i}))
        for i, members in enumerate(nodes)
    )
    sources = tuple(tuple(u for v in members for u in inputs[v] if source[u]) for members in nodes)
    needs = {v: functools.reduce(operator.or_, (1 << group[u] for u in inputs[v])) for v in range(n) if sink[v]}
    sinks: list[list[tuple[int, int]]] = [[] for _ in nodes]
    for v, mask in needs.items():
        for g in range(len(nodes)):
            if mask >> g & 1:
                sinks[g].append((v, mask))
    # live bytes: a kept layer's output while some reader is past the boundary (a free sink is past it while one of
    # its inputs is); a free source's while some but not all of its consumers are (it sits right before the first)
    terms = []
    for v in range(n):
        act = profile.layers[v].activation_bytes
        if not act or sink[v] or not consumers[v]:
            continue
        readers = 0
        for c in consumers[v]:
            readers |= needs[c] if sink[c] else 1 << group[c]
        if v in group:
            readers &= ~(1 << group[v])
        if readers:
            terms.append((-1 if source[v] else group[v], act, readers))
    layers = profile.layers
    work = np.array([sum(layers[v].fwd_ms + layers[v].bwd_ms for v in members) for members in nodes])
    return Reduced(nodes, reduced_inputs, work, sources, tuple(tuple(x) for x in sinks), tuple(terms))


def latest_order(inputs: tuple[tuple[int, ...], ...]) -> list[int]:
    """A topological order that places every node late: built backwards from the sinks, each node's inputs placed as
    soon as all their consumers are (depth first: the input readied last goes right before its consumer)."""
    consumers = consumers_of(inputs)
    waiting = [len(c) for c in consumers]
    ready = [v for v in range(len(inputs)) if not waiting[v]]
    backwards = []
    while ready:
        v = ready.pop()
        backwards.append(v)
        for u in inputs[v]:
            waiting[u] -= 1
            if not waiting[u]:
                ready.append(u)
    return backwards[::-1]


def prefix_masks(order: list[int]) -> list[int]:
    """The bitmasks of every prefix of `order`, the empty one first."""
    masks, mask = [0], 0
    for v in order:
        mask |= 1 << v
        masks.append(mask)
    return masks


def states(profile: ModelProfile, limit: int = STATE_LIMIT) -> tuple[Reduced, list[int], str]:
    """The DP's graph and states (bitmasks over its nodes, the empty set first, the whole graph last), and which set
    they are: `all` (every down-set), `chains` (every down-set once series chains are single nodes), `lattice` (unions
    and intersections of the prefixes of the default and the latest order of the graph with chains merged) or
    `prefixes` (those prefixes)."""
    reduced = reduce(profile)
    every = all_downsets(reduced.inputs, limit)
    if every is not None:
        return reduced, every, "all"
    merged = reduce(profile, merge=True)
    every = all_downsets(merged.inputs, MERGED_LIMIT)
    if every is not None:
        return merged, every, "chains"
    early = prefix_masks(list(range(len(merged.nodes))))
    late = prefix_masks(latest_order(merged.inputs))
    if early == late or len(early) ** 2 > 4 * limit:  # the lattice has up to 2 (n + 1)^2 states
        return merged, sorted(set(early) | set(late), key=lambda m: (m.bit_count(), m)), "prefixes"
    lattice = {a & b for a in early for b in late} | {a | b for a in early for b in late}
    if len(lattice) <= limit:
        return merged, sorted(lattice, key=lambda m: (m.bit_count(), m)), "lattice"
    return merged, sorted(set(early) | set(late), key=lambda m: (m.bit_count(), m)), "prefixes"


def live_bytes(reduced: Reduced, member: np.ndarray) -> np.ndarray:
    """Per state (a row of the membership matrix), the bytes that cross a boundary there: outputs made before it and
    read after it."""
    out = np.zeros(len(member))
    for own, act, readers in reduced.live_terms:
        cols = [r for r in range(len(reduced.nodes)) if readers >> r & 1]
        inside = member[:, cols]
        made = inside.any(axis=1) if own < 0 else member[:, own]
        out += np.where(made & ~inside.all(axis=1), act, 0.0)
    return out
