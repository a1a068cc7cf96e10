"""Tests of core.dag: layer orders of a DAG profile, its chain profile per order, stages as sets of layers."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeplan.core.dag import check_order, inputs_of, live_cuts, order_from_stages, reorder, stage_layers
from pipeplan.core.errors import PlanError
from pipeplan.core.plan import Plan, Stage
from pipeplan.core.profile import LayerCurve, LayerProfile, ModelProfile
from pipeplan.presets.resolve import load_profile


def dag_profile(inputs: list[tuple[int, ...]], activations: list[float] | None = None, sizes: bool = False) -> ModelProfile:
    """A profile over `inputs` (earlier indices per layer); activation i defaults to 2**i bytes; `sizes`: two sizes."""
    acts = activations or [float(2**i) for i in range(len(inputs))]
    layers = []
    for i, a in enumerate(acts):
        curve = LayerCurve((1.0, 2.0), (2.0, 4.0), (a / 2, a), (a / 2, a)) if sizes else None
        layers.append(LayerProfile(f"l{i}", 2.0 if sizes else 1.0, 4.0 if sizes else 2.0, a, 10.0, curve=curve))
    if not sizes:
        return ModelProfile("dag", 4, tuple(layers), layer_inputs=tuple(inputs))
    full = live_cuts(acts, inputs)
    return ModelProfile(
        "dag", 4, tuple(layers), batch_sizes=(2, 4), cut_curves=tuple((c / 2, c) for c in full), cut_bytes=full,
        layer_inputs=tuple(inputs),
    )  # fmt: skip


DIAMOND = [(), (0,), (0,), (1, 2)]
"""a -> b, a -> c, (b, c) -> d."""


def test_diamond_cut_bytes_are_the_live_sets_of_the_order() -> None:
    """On a -> {b, c} -> d with outputs 1, 10, 100, 1000 bytes the cuts of a, b, c, d and of a, c, b, d are closed-form."""
    profile = dag_profile(DIAMOND, [1.0, 10.0, 100.0, 1000.0])
    assert reorder(profile, (0, 1, 2, 3)) is profile
    assert profile.cut_bytes == (1.0, 11.0, 110.0)  # a; a (still wanted by c) and b; b and c
    swapped = reorder(profile, (0, 2, 1, 3))
    assert [layer.name for layer in swapped.layers] == ["l0", "l2", "l1", "l3"]
    assert swapped.cut_bytes == (1.0, 101.0, 110.0)  # a alone; a (still wanted by b) and c; c and b
    assert swapped.layer_inputs == ((), (0,), (0,), (1, 2))


def test_graph_txt_default_order_cut_bytes_are_the_live_sets() -> None:
    """resnet50's reader cuts equal the live-set cuts of its own order (the rule reorder applies to any order)."""
    profile = load_profile("resnet50")
    assert profile.layer_inputs is not None
    assert live_cuts([layer.activation_bytes for layer in profile.layers], profile.layer_inputs) == profile.cut_bytes


def test_check_order_names_the_layer_and_its_input() -> None:
    """An order that runs d before c, repeats a layer or is short is refused naming the layer."""
    profile = dag_profile(DIAMOND)
    with pytest.raises(PlanError, match=r"puts layer 3 \(l3\) \(position 2\) before its input layer 2 \(l2\) \(position 3\)"):
        check_order(profile, (0, 1, 3, 2))
    with pytest.raises(PlanError, match=r"places layer 1 \(l1\) twice"):
        check_order(profile, (0, 1, 1, 3))
    with pytest.raises(PlanError, match="has 3 entries but profile 'dag' has 4 layers"):
        check_order(profile, (0, 1, 2))
    chain = ModelProfile("chain", 1, tuple(LayerProfile(f"c{i}", 1.0, 1.0, 1.0, 0.0) for i in range(3)))
    with pytest.raises(PlanError, match="before its input"):
        reorder(chain, (1, 0, 2))


def test_order_from_stages_refuses_overlap_missing_and_open_stages() -> None:
    """Overlapping stages, a layer in no stage, and a stage whose layer's input is later are refused naming both."""
    profile = dag_profile(DIAMOND)
    assert order_from_stages(profile, [{0, 2}, {1, 3}]) == (0, 2, 1, 3)
    with pytest.raises(PlanError, match=r"stages 0 and 1 both hold layer 2 \(l2\)"):
        order_from_stages(profile, [{0, 2}, {1, 2, 3}])
    with pytest.raises(PlanError, match=r"no stage holds layer 3 \(l3\)"):
        order_from_stages(profile, [{0, 2}, {1}])
    with pytest.raises(PlanError, match=r"stage 0 holds layer 1 \(l1\) but its input layer 0 \(l0\) is in the later stage 1"):
        order_from_stages(profile, [{1}, {0, 2, 3}])
    with pytest.raises(PlanError, match="stage 1 holds no layer"):
        order_from_stages(profile, [{0, 1, 2, 3}, set()])
    with pytest.raises(PlanError, match="stage 0 names layer 7"):
        order_from_stages(profile, [{0, 1, 2, 3, 7}])


def test_stage_layers_maps_positions_through_the_order() -> None:
    """A plan over order a, c, b, d with stages {a, c} and {b, d} has those layer sets; without an order, the ranges."""
    plan = Plan((Stage(0, 1, (0,)), Stage(2, 3, (1,))), 1, 2, 1, "1f1b", layer_order=(0, 2, 1, 3))
    assert stage_layers(plan) == ((0, 2), (1, 3))
    chain = Plan((Stage(0, 1, (0,)), Stage(2, 3, (1,))), 1, 2, 1, "1f1b", layer_order=(0, 1, 2, 3))
    assert chain.layer_order is None
    assert stage_layers(chain) == ((0, 1), (2, 3))


def test_reorder_keeps_shared_bytes_only_behind_the_predecessor() -> None:
    """A layer that shares its input with the layer before it keeps that share only while that layer stays right
    before it."""
    layers = tuple(LayerProfile(f"l{i}", 1.0, 1.0, 8.0, 0.0, saved_bytes=8.0, shared_bytes=4.0 if i else 0.0) for i in range(4))
    profile = ModelProfile("shared", 1, layers, layer_inputs=tuple(DIAMOND))
    placed = reorder(profile, (0, 2, 1, 3))
    assert [layer.shared_bytes for layer in placed.layers] == [0.0, 0.0, 0.0, 0.0]
    placed = reorder(profile, (0, 1, 2, 3))
    assert [layer.shared_bytes for layer in placed.layers] == [0.0, 4.0, 4.0, 4.0]


@st.composite
def dags_and_orders(draw: st.DrawFn) -> tuple[list[tuple[int, ...]], tuple[int, ...], list[int]]:
    """A random DAG in topological index order, a random topological order of it, and random cut points in that order."""
    n = draw(st.integers(1, 12))
    inputs = [tuple(sorted(draw(st.sets(st.integers(0, i - 1), max_size=3)))) if i else () for i in range(n)]
    consumers: list[list[int]] = [[] for _ in range(n)]
    for v, sources in enumerate(inputs):
        for u in sources:
            consumers[u].append(v)
    waiting = [len(s) for s in inputs]
    ready = [v for v in range(n) if not waiting[v]]
    order = []
    while ready:
        v = ready.pop(draw(st.integers(0, len(ready) - 1)))
        order.append(v)
        for w in consumers[v]:
            waiting[w] -= 1
            if not waiting[w]:
                ready.append(w)
    cuts = sorted(draw(st.sets(st.integers(1, n - 1), max_size=n - 1))) if n > 1 else []
    return inputs, tuple(order), cuts


def brute_cut(inputs: list[tuple[int, ...]], acts: list[float], order: tuple[int, ...], k: int) -> float:
    """Bytes after position k: outputs of layers at positions <= k consumed at a position > k, in position order."""
    position = {v: p for p, v in enumerate(order)}
    live = [u for u in order[: k + 1] if any(u in inputs[v] and position[v] > k for v in range(len(inputs)))]
    return sum(acts[u] for u in live)


@settings(max_examples=150, deadline=None)
@given(dags_and_orders(), st.booleans())
def test_any_down_set_partition_round_trips_through_its_order(case: tuple, sizes: bool) -> None:
    """Stages cut from any topological order (every prefix a down-set) give back that order, a plan over it gives back
    the stage sets, and the reordered profile's cuts are the live sets."""
    inputs, order, cuts = case
    profile = dag_profile(inputs, sizes=sizes)
    bounds = [0, *cuts, len(order)]
    sets = [set(order[a:b]) for a, b in itertools.pairwise(bounds)]
    rebuilt = order_from_stages(profile, sets)
    assert [set(rebuilt[a:b]) for a, b in itertools.pairwise(bounds)] == sets
    stages = tuple(Stage(a, b - 1, (s,)) for s, (a, b) in enumerate(itertools.pairwise(bounds)))
    plan = Plan(stages, 1, 1, 1, "gpipe", layer_order=rebuilt)
    assert [set(layers) for layers in stage_layers(plan)] == sets
    chain = reorder(profile, order)
    acts = [layer.activation_bytes for layer in profile.layers]
    assert [layer.name for layer in chain.layers] == [f"l{v}" for v in order]
    assert chain.cut_bytes == tuple(brute_cut(inputs, acts, order, k) for k in range(len(order) - 1))
    if sizes:
        assert chain.cut_curves is not None
        assert tuple(c[1] for c in chain.cut_curves) == chain.cut_bytes
        assert tuple(c[0] for c in chain.cut_curves) == tuple(c / 2 for c in chain.cut_bytes)
    assert sorted(map(sorted, (inputs_of(chain)[p] for p in range(len(order))))) == sorted(
        sorted(order.index(u) for u in inputs[v]) for v in order
    )


@settings(max_examples=150, deadline=None)
@given(dags_and_orders(), st.lists(st.integers(0, 3), min_size=12, max_size=12))
def test_any_assignment_is_accepted_exactly_when_closed_under_the_cut(case: tuple, owners: list[int]) -> None:
    """Layers assigned to stages at random: order_from_stages accepts exactly the assignments where no input is in a
    later stage (and no stage is empty)."""
    inputs = case[0]
    n = len(inputs)
    used = sorted(set(owners[:n]))
    rank = {s: i for i, s in enumerate(used)}
    owner = [rank[owners[v]] for v in range(n)]
    sets = [{v for v in range(n) if owner[v] == s} for s in range(len(used))]
    closed = all(owner[u] <= owner[v] for v in range(n) for u in inputs[v])
    profile = dag_profile(inputs)
    if closed:
        order = order_from_stages(profile, sets)
        check_order(profile, order)
    else:
        with pytest.raises(PlanError, match="not closed under the cut"):
            order_from_stages(profile, sets)
