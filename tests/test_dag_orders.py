"""Tests of planner.search.dag_orders: the bottleneck DP over down-sets and the orders it gives."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeplan.core.dag import check_order
from pipeplan.core.profile import LayerProfile, ModelProfile
from pipeplan.planner.search.dag_orders import banded_partitions, bottleneck_partitions, dag_orders
from pipeplan.planner.search.dag_states import all_downsets, membership
from pipeplan.presets.resolve import load_profile


def value(cuts: list[int], work: np.ndarray, live: np.ndarray) -> float:
    """max(stage work, boundary live) of the partition with those boundary states (last state: everything)."""
    bounds = [0, *cuts, len(work) - 1]
    stages = [work[b] - work[a] for a, b in itertools.pairwise(bounds)]
    return max([*stages, *(live[c] for c in cuts)])


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_the_dp_finds_the_best_down_set_partition_by_brute_force(data: st.DataObject) -> None:
    """On random DAGs of up to 6 nodes the DP's partition into p <= 4 stages has the smallest bottleneck of every
    chain of down-sets (brute force), and the banded DP's is one of them or none."""
    n = data.draw(st.integers(2, 6))
    inputs = tuple(tuple(sorted(data.draw(st.sets(st.integers(0, i - 1), max_size=2)))) if i else () for i in range(n))
    work_of = np.array([data.draw(st.integers(1, 9)) for _ in range(n)], dtype=float)
    masks = all_downsets(inputs, 1000)
    assert masks is not None
    member = membership(masks, n)
    work = member.astype(float) @ work_of
    live = np.array([float(data.draw(st.integers(0, 12))) for _ in masks])
    answers = bottleneck_partitions(work, live, member, 4)
    inner = range(1, len(masks) - 1)
    for p in range(2, 5):
        chains = [
            list(c) for c in itertools.combinations(inner, p - 1)
            if all(masks[a] & masks[b] == masks[a] and masks[a] != masks[b] for a, b in itertools.pairwise(c))
        ]  # fmt: skip
        if not chains:
            assert answers[p - 1] == []
            continue
        best = min(value(c, work, live) for c in chains)
        assert value(answers[p - 1], work, live) == best
        banded = banded_partitions(work, live, member, p)
        assert banded == [] or (banded in chains and value(banded, work, live) >= best)


def test_gnmt_orders_are_valid_and_new() -> None:
    """gnmt (every down-set) and gnmt_large (series chains merged) get orders beyond the default, each a topological
    order of the profile; a chain profile gets none."""
    for name, kind in (("gnmt", "all"), ("gnmt_large", "chains")):
        profile = load_profile(name)
        orders, states = dag_orders(profile, 25e9 / 8 / 1000, 8)
        assert states == kind and 1 <= len(orders) <= 3
        for order in orders:
            assert check_order(profile, order) != tuple(range(profile.num_layers))
    chain = ModelProfile("chain", 1, tuple(LayerProfile(f"l{i}", 1.0, 2.0, 8.0, 8.0) for i in range(6)))
    assert dag_orders(chain, 1e6, 8) == ([], "chain")
