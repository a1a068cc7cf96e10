"""core.shared_params and ModelProfile's shared parameters: groups checked, each parameter counted once per holder."""

from __future__ import annotations

import pytest

from pipeplan.core.dag import reorder
from pipeplan.core.errors import ProfileError
from pipeplan.core.profile import LayerProfile, ModelProfile
from pipeplan.core.shared_params import (
    SharedGroup,
    first_holder_params,
    holding_stages,
    overlap_bytes,
    span_overlap_bytes,
)

MIB = float(1 << 20)


def tied(params: tuple[float, ...] = (40 * MIB, 10 * MIB, 10 * MIB, 45 * MIB), tie: float = 38 * MIB) -> ModelProfile:
    """Embedding, two blocks and a head whose 38 MiB weight is the embedding's (each layer counts it)."""
    layers = tuple(LayerProfile(f"l{i}", 1.0, 2.0, 1e6, p) for i, p in enumerate(params))
    return ModelProfile("tied", 8, layers, shared_params=(SharedGroup("l0.weight", (0, 3), tie),))


def test_total_param_bytes_counts_a_shared_parameter_once() -> None:
    """40 + 10 + 10 + 45 MiB of layers holding one 38 MiB weight twice: the model has 67 MiB."""
    profile = tied()
    assert profile.total_param_bytes == 67 * MIB
    assert ModelProfile("plain", 8, profile.layers).total_param_bytes == 105 * MIB


def test_held_param_bytes_dedups_within_a_set_and_not_across() -> None:
    """A set holding both tied layers keeps the weight once; a set holding one of them keeps its whole copy."""
    profile = tied()
    assert profile.held_param_bytes([0, 1, 2, 3]) == 67 * MIB
    assert profile.held_param_bytes([0, 1]) == 50 * MIB
    assert profile.held_param_bytes([2, 3]) == 55 * MIB
    assert profile.held_param_bytes([0, 3]) == 47 * MIB


def test_overlap_counts_each_member_beyond_the_first() -> None:
    """A group of three layers inside a set counts its bytes twice too many; the span form agrees."""
    groups = (SharedGroup("w", (1, 2, 4), 5.0), SharedGroup("v", (0, 4), 3.0))
    assert overlap_bytes(groups, {1, 2, 4}) == 10.0
    assert overlap_bytes(groups, {0, 1, 2, 3, 4}) == 13.0
    assert overlap_bytes(groups, {1, 3}) == 0.0
    for first in range(5):
        for last in range(first, 5):
            assert span_overlap_bytes(groups, first, last) == overlap_bytes(groups, set(range(first, last + 1)))


def test_first_holder_params_never_exceed_what_a_set_holds() -> None:
    """The per-layer lower bound summed over every contiguous span is at most the span's held bytes."""
    profile = tied()
    low = first_holder_params([x.param_bytes for x in profile.layers], profile.shared_params)
    assert low == [40 * MIB, 10 * MIB, 10 * MIB, 7 * MIB]
    for first in range(4):
        for last in range(first, 4):
            assert sum(low[first : last + 1]) <= profile.held_param_bytes(range(first, last + 1))


def test_holding_stages_lists_each_stage_once() -> None:
    """Layers 0 and 3 on stages 0 and 1 of a 2-stage split; both on stage 0 of a 1-stage plan."""
    group = SharedGroup("w", (0, 3), 1.0)
    assert holding_stages(group, [0, 0, 1, 1]) == (0, 1)
    assert holding_stages(group, [0, 0, 0, 0]) == (0,)


@pytest.mark.parametrize(
    ("layers", "nbytes", "match"),
    [
        ((3,), 1.0, r"layers must list at least 2 layer indices, got \[3\]"),
        ((3, 1), 1.0, r"ascending without repeats, got \[3, 1\]"),
        ((1, 1), 1.0, r"ascending without repeats, got \[1, 1\]"),
        ((-1, 2), 1.0, r"layer indices >= 0, got -1"),
        ((0, True), 1.0, r"layer indices >= 0, got True"),
        ((0, 2), -1.0, r"param_bytes must be a finite number >= 0, got -1.0"),
        ((0, 2), float("nan"), r"param_bytes must be a finite number >= 0, got nan"),
    ],
)
def test_a_bad_group_is_refused_naming_field_and_value(layers: tuple[int, ...], nbytes: float, match: str) -> None:
    """Each field of a group is checked on construction, the message naming the parameter, field and value."""
    with pytest.raises(ProfileError, match=match):
        SharedGroup("w", layers, nbytes)


def test_a_profile_refuses_groups_out_of_range_twice_named_or_larger_than_a_holder() -> None:
    """A group naming layer 4 of a 4-layer profile, a name given twice, or bytes beyond a holder's param_bytes."""
    layers = tied().layers
    with pytest.raises(ProfileError, match=r"names layer 4, but the profile has layers 0\.\.3"):
        ModelProfile("p", 8, layers, shared_params=(SharedGroup("w", (0, 4), 1.0),))
    with pytest.raises(ProfileError, match=r"names 'w' twice"):
        ModelProfile("p", 8, layers, shared_params=(SharedGroup("w", (0, 3), 1.0), SharedGroup("w", (1, 2), 1.0)))
    too_large = r"layer 'l1' holds shared parameters of 11534336 bytes but its param_bytes is 10485760"
    with pytest.raises(ProfileError, match=too_large):
        ModelProfile("p", 8, layers, shared_params=(SharedGroup("w", (1, 3), 11 * MIB),))
    with pytest.raises(ProfileError, match=r"shared_params must be a tuple of SharedGroup values"):
        ModelProfile("p", 8, layers, shared_params=[SharedGroup("w", (0, 3), 1.0)])  # type: ignore[arg-type]


def test_reorder_renumbers_a_group_to_its_layers_new_positions() -> None:
    """A DAG whose layers 1 and 2 swap places in an order: the group on (0, 2) then names positions (0, 1)."""
    layers = tuple(LayerProfile(f"l{i}", 1.0, 2.0, 1e6, 8.0) for i in range(4))
    profile = ModelProfile(
        "dag", 8, layers, layer_inputs=((), (0,), (0,), (1, 2)), shared_params=(SharedGroup("w", (0, 2), 8.0),)
    )
    view = reorder(profile, (0, 2, 1, 3))
    assert view.shared_params == (SharedGroup("w", (0, 1), 8.0),)
    assert view.total_param_bytes == profile.total_param_bytes == 24.0
