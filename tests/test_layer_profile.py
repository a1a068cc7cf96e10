"""Tests of core.layer_profile: one layer's checks (its curve's type, the zero-bubble split, optimizer steps)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from pipeplan.core.errors import ProfileError
from pipeplan.core.layer_profile import LayerProfile


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
