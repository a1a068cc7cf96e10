"""PipeDream's planning states (planner.baselines.downset_tables): the vectorized augmented antichains and extra nodes equal
the plain definitions (every node of every state walked with integer masks) on any DAG."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeplan.core.downsets import bits, maximal
from pipeplan.planner.baselines.downset_tables import ancestor_masks, augmented_extra, downset_states, successor_masks
from pipeplan.planner.baselines.pipedream_graph import PipeDreamGraph


@st.composite
def dags(draw: st.DrawFn) -> PipeDreamGraph:
    """A DAG of 1..12 nodes in topological order (node 0 a source), each reading 0..3 earlier nodes, with costs."""
    n = draw(st.integers(1, 12))
    producers: list[tuple[int, ...]] = [()]
    for v in range(1, n):
        producers.append(tuple(sorted(draw(st.sets(st.integers(0, v - 1), max_size=3)))))
    values = st.lists(st.integers(0, 10**6).map(float), min_size=n, max_size=n).map(np.array)
    fwd, bwd, act, par = draw(values), draw(values), draw(values), draw(values)
    names = tuple(f"n{i}" for i in range(n))
    return PipeDreamGraph("g", 8, names, names, fwd + bwd, fwd, bwd, act, par, tuple(producers))


def reference_extra(dag: PipeDreamGraph) -> list[int]:
    """Per node a, its strict ancestors with a consumer outside a's ancestry (every ancestor checked)."""
    anc, succ = ancestor_masks(dag), successor_masks(dag)
    return [sum(1 << p for p in bits(anc[a] & ~(1 << a)) if succ[p] & ~anc[a]) for a in range(dag.num_nodes)]


@settings(max_examples=200, deadline=None)
@given(dags())
def test_extra_nodes_equal_the_check_of_every_ancestor(dag: PipeDreamGraph) -> None:
    """augmented_extra (which skips ancestors with one consumer) equals checking every ancestor."""
    assert augmented_extra(dag) == reference_extra(dag)


@settings(max_examples=200, deadline=None)
@given(dags())
def test_cut_bytes_are_the_augmented_antichains_activations(dag: PipeDreamGraph) -> None:
    """Each state's cut bytes are the activations of its maximal nodes plus their extra nodes, summed as before."""
    states = downset_states(dag, 0)
    anc, extra = ancestor_masks(dag), reference_extra(dag)
    for i, mask in enumerate(states.masks):
        top = maximal(mask, anc)
        augmented = top
        for a in bits(top):
            augmented |= extra[a]
        row = np.zeros(dag.num_nodes, dtype=bool)
        row[bits(augmented)] = True
        assert states.cut_bytes[i] == row @ dag.activation_bytes


def test_a_long_chain_cuts_after_each_prefixs_last_layer() -> None:
    """In a chain of 3,000 layers every state is a prefix and its cut is its last layer's activation."""
    n = 3000
    act = np.arange(1.0, n + 1.0)
    names = tuple(f"l{i}" for i in range(n))
    chain = PipeDreamGraph("chain", 8, names, names, act, act, act, act, act, ((), *((i,) for i in range(n - 1))))
    states = downset_states(chain, 0)
    assert states.masks == tuple((1 << (i + 1)) - 1 for i in range(n))
    assert states.cut_bytes.tolist() == act.tolist()
