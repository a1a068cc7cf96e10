"""Tests of core.layer_profile: one layer's checks (its curve's type, the zero-bubble split, optimizer steps)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from pipeplan.core.errors import ProfileError
from pipeplan.core.layer_profile import LayerProfile, TensorSplit


def test_a_layer_curve_must_be_a_layer_curve() -> None:
    """curve holds a LayerCurve or None; anything else names the type."""
    with pytest.raises(ProfileError, match=r"layer 'l0' curve must be a LayerCurve, got dict"):
        LayerProfile("l0", 1.0, 2.0, 3.0, 4.0, curve={"fwd_ms": (1.0, 2.0, 4.0)})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"bwd_input_ms": 1.0}, r"layer 'l0' needs both bwd_input_ms and bwd_weight_ms or neither"),
        ({"bwd_weight_ms": 1.0}, r"layer 'l0' needs both bwd_input_ms and bwd_weight_ms or neither"),
        ({"bwd_input_ms": -1.0, "bwd_weight_ms": 1.0}, r"layer 'l0' bwd_input_ms must be a finite number >= 0, got -1\.0"),
        ({"bwd_input_ms": 1.0, "bwd_weight_ms": math.nan}, r"layer 'l0' bwd_weight_ms must be a finite number >= 0, got nan"),
    ],
)
def test_the_zero_bubble_split_needs_both_halves(changes: dict[str, Any], message: str) -> None:
    """bwd_input_ms without bwd_weight_ms (or the reverse), or a bad value, is a ProfileError naming the layer."""
    with pytest.raises(ProfileError, match=message):
        LayerProfile("l0", 1.0, 2.0, 3.0, 4.0, **changes)


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        ((("adam", 1.0), ("adam", 2.0)), r"layer 'l0' optimizer_ms names an optimizer twice: \['adam', 'adam'\]"),
        ((("adam", -1.0),), r"layer 'l0' optimizer_ms\['adam'\] must be a finite number >= 0, got -1\.0"),
        ((("sgd", math.nan),), r"layer 'l0' optimizer_ms\['sgd'\] must be a finite number >= 0, got nan"),
        ((("", 1.0),), r"layer 'l0' optimizer_ms must hold \(optimizer name, ms\) pairs, got \('', 1\.0\)"),
        ((["adam", 1.0],), r"layer 'l0' optimizer_ms must hold \(optimizer name, ms\) pairs, got \['adam', 1\.0\]"),
        ((("adam", 1.0, 2.0),), r"layer 'l0' optimizer_ms must hold \(optimizer name, ms\) pairs"),
    ],
)
def test_bad_optimizer_steps_name_the_layer_and_value(steps: object, message: str) -> None:
    """optimizer_ms holds (name, ms >= 0) pairs, each optimizer once."""
    with pytest.raises(ProfileError, match=message):
        LayerProfile("l0", 1.0, 2.0, 3.0, 4.0, optimizer_ms=steps)  # type: ignore[arg-type]


def test_optimizer_steps_are_sorted_and_looked_up_by_name() -> None:
    """optimizer_ms is stored sorted by name as floats; optimizer_step_ms gives a step or None."""
    lay = LayerProfile("l0", 1.0, 2.0, 3.0, 4.0, optimizer_ms=(("sgd", 1), ("adam", 2.5)))
    assert lay.optimizer_ms == (("adam", 2.5), ("sgd", 1.0))
    assert lay.optimizer_step_ms("sgd") == 1.0
    assert lay.optimizer_step_ms("sgd_momentum") is None


def test_a_tensor_split_takes_its_kinds_default_whole_share_unless_given() -> None:
    """The share kept whole without sequence parallelism is the kind's (Korthikanti's 10 of 34 sbh per block)."""
    assert TensorSplit("block", 32).whole_share == 10 / 34
    assert TensorSplit("mlp", 4096, 0.5).whole_share == 0.5
    assert TensorSplit("row", 8).whole_share == 0.0
    assert LayerProfile("l", 1.0, 2.0, 8, 8).tp is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("conv", 4), "tp kind must be one of block, attention, mlp, vocab, row, column, got 'conv'"),
        (("mlp", 0), "tp width must be an integer >= 1 .*got 0"),
        (("mlp", 2.0), "tp width must be an integer >= 1 .*got 2.0"),
        (("mlp", 8, -0.1), "tp replicated_share must be a fraction in 0..1, got -0.1"),
        (("mlp", 8, None, 1.5), "tp whole_fwd must be a fraction in 0..1, got 1.5"),
        (("mlp", 8, None, 0.0, True), "tp whole_bwd must be a fraction in 0..1, got True"),
        (("mlp", 8, None, 0.0, 0.0, 1), "tp recomputed must be true or false, got 1"),
    ],
)
def test_a_bad_tensor_split_is_refused_naming_field_and_value(args: tuple, message: str) -> None:
    """kind, width, replicated_share, whole_fwd, whole_bwd and recomputed are checked."""
    with pytest.raises(ProfileError, match=message):
        TensorSplit(*args)
