"""Tests of device orders: the node-structured chain walks exactly as the pair-by-pair greedy chain."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeplan.core.links import DenseLinks, NodeLinks
from pipeplan.planner.search.mapping import chain_order


@settings(max_examples=60, deadline=None)
@given(
    nodes=st.lists(st.integers(0, 5), min_size=1, max_size=30),
    rates=st.sampled_from([(2.0, 1.0), (1.0, 1.0), (5.0, 0.5)]),
    data=st.data(),
)
def test_node_chain_equals_the_dense_greedy_chain(nodes: list[int], rates: tuple[float, float], data: st.DataObject) -> None:
    """On a two-level cluster (any node labels, a subset allowed or not) the fast walk gives the dense walk's order."""
    links = NodeLinks(np.array(nodes), rates[0], rates[1], np.inf)
    n = len(nodes)
    allowed = data.draw(st.none() | st.lists(st.integers(0, n - 1), min_size=1, unique=True).map(sorted))
    start = data.draw(st.sampled_from(allowed if allowed else list(range(n))))
    assert chain_order(links, start, allowed) == chain_order(DenseLinks(links.dense()), start, allowed)
