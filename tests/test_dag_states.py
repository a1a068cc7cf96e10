"""Tests of planner.search.dag_states: the DP's graph (free layers placed around others) and its states (the
enumeration itself: tests/test_core_downsets.py)."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeplan.core.dag import check_order, reorder
from pipeplan.core.downsets import all_downsets, membership
from pipeplan.core.profile import LayerProfile, ModelProfile
from pipeplan.planner.search.dag_states import latest_order, live_bytes, reduce, states
from pipeplan.presets.resolve import load_profile


@st.composite
def dags(draw: st.DrawFn, most: int = 8) -> tuple[list[tuple[int, ...]], list[bool]]:
    """A random DAG in index order and which layers are free (no compute, no parameters)."""
    n = draw(st.integers(1, most))
    inputs = [tuple(sorted(draw(st.sets(st.integers(0, i - 1), max_size=3)))) if i else () for i in range(n)]
    return inputs, [draw(st.booleans()) for _ in range(n)]


def profile_of(inputs: list[tuple[int, ...]], free: list[bool]) -> ModelProfile:
    """Layer i: 1 + i ms unless free, output 2**i bytes, parameters unless free."""
    layers = tuple(LayerProfile(f"l{i}", 0.0 if f else 1.0 + i, 0.0, float(2**i), 0.0 if f else 8.0) for i, f in enumerate(free))
    return ModelProfile("g", 1, layers, layer_inputs=tuple(inputs))


def test_the_latest_order_places_every_node_as_late_as_its_consumers_allow() -> None:
    """latest_order builds backwards from the sinks: an input goes right before the consumer that readied it last."""
    assert latest_order(((), (), (0, 1))) == [0, 1, 2]
    assert latest_order(((), (0,), (), (1, 2))) == [0, 1, 2, 3]
    assert latest_order(((), (), (1,), (0,), (2, 3))) == [1, 2, 0, 3, 4]


def test_gnmt_loses_its_free_inputs_and_getitem_sinks_to_the_dp() -> None:
    """gnmt's free sources and sinks leave the DP's graph and come back in place: the expanded default order is a
    topological order of all 48 layers."""
    profile = load_profile("gnmt")
    reduced, masks, kind = states(profile)
    assert kind == "all" and len(reduced.nodes) < profile.num_layers and len(masks) < 1000
    order = reduced.expand(list(range(len(reduced.nodes))))
    assert sorted(order) == list(range(profile.num_layers))
    check_order(profile, order)


@settings(max_examples=120, deadline=None)
@given(dags())
def test_every_state_s_live_bytes_are_the_cut_of_an_order_with_it_as_prefix(case: tuple) -> None:
    """With free layers out, every state's live bytes equal the cut bytes of an order that has the state as a prefix
    (the expansion of a reduced order)."""
    inputs, free = case
    profile = profile_of(inputs, free)
    for merge in (False, True):
        reduced = reduce(profile, merge)
        masks = all_downsets(reduced.inputs, 10_000)
        assert masks is not None
        live = live_bytes(reduced, membership(masks, len(reduced.nodes)))
        for mask, value in zip(masks, live, strict=True):
            inside = [v for v in range(len(reduced.nodes)) if mask >> v & 1]
            outside = [v for v in range(len(reduced.nodes)) if not mask >> v & 1]
            order = reduced.expand(inside + outside)
            check_order(profile, order)
            if not inside or not outside:
                continue
            position = len(reduced.expand(inside)) - 1
            placed = {order[p] for p in range(position + 1)}
            made = [u for u in placed if any(c not in placed for c in range(len(inputs)) if u in inputs[c])]
            assert value == sum(profile.layers[u].activation_bytes for u in made)
            assert value == reorder(profile, order).cut_bytes[position]


def test_series_chains_merge_and_expand_in_order() -> None:
    """resnet50's blocks become few nodes when chains merge: every layer but the free Input is in one node once, and
    expanding the nodes' order gives a valid order of all layers."""
    profile = load_profile("resnet50")
    merged = reduce(profile, merge=True)
    assert len(merged.nodes) < 60
    order = merged.expand(list(range(len(merged.nodes))))
    check_order(profile, order)
    kept = sorted(itertools.chain.from_iterable(merged.nodes))
    assert kept == sorted(set(kept)) and len(kept) == profile.num_layers - 1  # all but the free Input
