"""What the baselines share (planner.baselines.rules): the layer order of stages given as layer sets is
core.dag.order_from_stages' in every case, None where that is the index order."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeplan.core.dag import order_from_stages
from pipeplan.core.errors import PlanError
from pipeplan.core.profile import LayerProfile, ModelProfile
from pipeplan.planner.baselines.rules import layer_order

DIAMOND = ((), (0,), (0,), (1, 2), (3,), (3, 4))


def profile(n: int, dag: bool) -> ModelProfile:
    """A chain of n layers, or (dag) the 6-layer DIAMOND graph."""
    layers = tuple(LayerProfile(f"l{i}", 1.0, 2.0, 10.0, 10.0) for i in range(len(DIAMOND) if dag else n))
    return ModelProfile("p", 1, layers, layer_inputs=DIAMOND if dag else None)


def reference(p: ModelProfile, sets: list[list[int]]) -> tuple[int, ...] | str | None:
    """order_from_stages, with the identity as None (as a Plan stores it) and a refusal as its message."""
    try:
        order = order_from_stages(p, sets)
    except PlanError as error:
        return str(error)
    return None if order == tuple(range(p.num_layers)) else order


@settings(max_examples=300, deadline=None)
@given(st.booleans(), st.integers(1, 8), st.data())
def test_layer_order_is_order_from_stages_or_none_for_the_index_order(dag: bool, n: int, data: st.DataObject) -> None:
    """Any split of any permutation (or a prefix) of the layers into stages: the same order, or the same refusal."""
    p = profile(n, dag)
    layers = data.draw(st.permutations(range(p.num_layers)))
    layers = layers[: data.draw(st.integers(1, len(layers)))]
    cuts = sorted(data.draw(st.sets(st.integers(1, len(layers) - 1), max_size=3))) if len(layers) > 1 else []
    sets = [sorted(layers[a:b]) for a, b in zip([0, *cuts], [*cuts, len(layers)], strict=True)]
    expected = reference(p, sets)
    if isinstance(expected, str):
        with pytest.raises(PlanError) as caught:
            layer_order(p, sets)
        assert str(caught.value) == expected
    else:
        assert layer_order(p, sets) == expected


def test_consecutive_ranges_of_a_chain_are_the_index_order() -> None:
    """Stages 0-2, 3-3, 4-9 of a 10-layer chain: no order (the index order)."""
    assert layer_order(profile(10, False), [[0, 1, 2], [3], [4, 5, 6, 7, 8, 9]]) is None
