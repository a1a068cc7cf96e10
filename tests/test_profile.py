"""Tests of core.profile's checks of a model's per-size curves, cuts and layer inputs (one layer: test_layer_profile)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from pipeplan.core.errors import ProfileError
from pipeplan.core.profile import LayerCurve, LayerProfile, ModelProfile

SIZES = (2, 4, 8)


def curve(**changes: Any) -> LayerCurve:
    """fwd 1/2/4 ms, bwd 2/4/8 ms, activation 10/20/40, saved 30/50/90 bytes at 2, 4, 8 samples; `changes` replace fields."""
    base = LayerCurve((1.0, 2.0, 4.0), (2.0, 4.0, 8.0), (10.0, 20.0, 40.0), (30.0, 50.0, 90.0))
    return dataclasses.replace(base, **changes)


def layer(name: str = "l0", **changes: Any) -> LayerProfile:
    """A layer whose scalars are its curve's values at 4 samples; `changes` replace fields."""
    fields: dict[str, Any] = {"name": name, "fwd_ms": 2.0, "bwd_ms": 4.0, "activation_bytes": 20.0, "param_bytes": 1e6,
                              "saved_bytes": 50.0, "curve": curve()}  # fmt: skip
    fields.update(changes)
    return LayerProfile(**fields)


def profile(**changes: Any) -> ModelProfile:
    """Two curved layers at batch 4 of SIZES, cut 0 measured 20/30/50 bytes; `changes` replace fields."""
    fields: dict[str, Any] = {"name": "toy", "batch_size": 4, "layers": (layer("l0"), layer("l1")), "cut_bytes": (30.0,),
                              "batch_sizes": SIZES, "cut_curves": ((20.0, 30.0, 50.0),)}  # fmt: skip
    fields.update(changes)
    return ModelProfile(**fields)


def test_a_curved_profile_is_accepted() -> None:
    """A consistent multi-size profile builds; sizes lists its batch sizes."""
    p = profile()
    assert p.sizes == SIZES
    assert profile(batch_size=2, layers=(layer(fwd_ms=1.0, bwd_ms=2.0, activation_bytes=10.0, saved_bytes=30.0),),
                   cut_bytes=(), cut_curves=()).sizes == SIZES  # fmt: skip


def test_a_one_size_profile_has_its_batch_size_as_sizes() -> None:
    """Without batch_sizes, sizes is (batch_size,)."""
    assert ModelProfile("one", 8, (LayerProfile("l", 1.0, 2.0, 3.0, 4.0),)).sizes == (8,)


@pytest.mark.parametrize(
    ("sizes", "message"),
    [
        ((2, 2, 4), r"profile 'toy' batch_sizes must be strictly increasing \(no repeats\), got \[2, 2, 4\]"),
        ((8, 4, 2), r"profile 'toy' batch_sizes must be strictly increasing \(no repeats\), got \[8, 4, 2\]"),
        ((2, 8, 16), r"profile 'toy' batch_sizes \[2, 8, 16\] must include the profile's batch_size 4"),
        ((), r"profile 'toy' batch_sizes must be a non-empty list of integers >= 1, got \(\)"),
        ([2, 4, 8], r"profile 'toy' batch_sizes must be a non-empty list of integers >= 1, got \[2, 4, 8\]"),
        ((0, 4, 8), r"profile 'toy' batch_sizes\[0\] must be an integer >= 1, got 0"),
        ((2, 4.0, 8), r"profile 'toy' batch_sizes\[1\] must be an integer >= 1, got 4\.0"),
    ],
)
def test_bad_batch_sizes_name_the_field_and_value(sizes: object, message: str) -> None:
    """batch_sizes must be a tuple of strictly increasing integers >= 1 holding batch_size."""
    with pytest.raises(ProfileError, match=message):
        profile(batch_sizes=sizes)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"fwd_ms": (1.0, 2.0)}, r"layer 'l0' fwd_ms must have 3 values \(one per batch size\), got 2"),
        ({"saved_bytes": (30.0, 50.0, 90.0, 170.0)}, r"layer 'l0' saved_bytes must have 3 values .*got 4"),
        ({"bwd_ms": [2.0, 4.0, 8.0]}, r"layer 'l0' bwd_ms must have 3 values .*got \[2\.0, 4\.0, 8\.0\]"),
        ({"activation_bytes": None}, r"layer 'l0' activation_bytes must have 3 values .*got None"),
        ({"fwd_ms": (1.0, 2.0, -4.0)}, r"layer 'l0' fwd_ms\[2\] must be a finite number >= 0, got -4\.0"),
        ({"bwd_ms": (math.nan, 4.0, 8.0)}, r"layer 'l0' bwd_ms\[0\] must be a finite number >= 0, got nan"),
        ({"saved_bytes": (30.0, 50.0, math.inf)}, r"layer 'l0' saved_bytes\[2\] must be a finite number >= 0, got inf"),
        ({"activation_bytes": (10.0, "20", 40.0)}, r"layer 'l0' activation_bytes\[1\] must be a number >= 0, got '20'"),
        ({"bwd_input_ms": (1.0, 2.0, 4.0)}, r"layer 'l0' needs both bwd_input_ms and bwd_weight_ms or neither"),
        ({"bwd_input_ms": (1.0, 2.0, 4.0), "bwd_weight_ms": (1.0, 2.0)}, r"layer 'l0' bwd_weight_ms must have 3 values"),
        (
            {"bwd_input_ms": (1.0, -2.0, 4.0), "bwd_weight_ms": (1.0, 2.0, 4.0)},
            r"layer 'l0' bwd_input_ms\[1\] must be .* got -2\.0",
        ),
    ],
)
def test_bad_curves_name_the_layer_field_and_value(changes: dict[str, Any], message: str) -> None:
    """A curve with the wrong length or a value that is negative, NaN, infinite or not a number is a ProfileError."""
    with pytest.raises(ProfileError, match=message):
        profile(layers=(layer(curve=curve(**changes)), layer("l1")))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"fwd_ms": 2.5}, r"profile 'toy' layer 'l0' fwd_ms is 2\.5 but its curve gives 2\.0 at batch_size 4"),
        ({"bwd_ms": 4.000001}, r"layer 'l0' bwd_ms is 4\.000001 but its curve gives 4\.0 at batch_size 4"),
        ({"activation_bytes": 10.0}, r"layer 'l0' activation_bytes is 10\.0 but its curve gives 20\.0 at batch_size 4"),
        ({"saved_bytes": None}, r"layer 'l0' saved_bytes is 20\.0 but its curve gives 50\.0 at batch_size 4"),
        ({"bwd_input_ms": 1.0, "bwd_weight_ms": 3.0}, r"profile 'toy' layer 'l0' has bwd_input_ms but no curve of it"),
        ({"curve": None}, r"profile 'toy' layer 'l0' has no curve for batch_sizes \[2, 4, 8\]"),
    ],
)
def test_a_scalar_that_disagrees_with_its_curve_names_both_values(changes: dict[str, Any], message: str) -> None:
    """A layer's value at batch_size must be its curve's value there, bit for bit; a curved profile needs every curve."""
    with pytest.raises(ProfileError, match=message):
        profile(layers=(layer(**changes), layer("l1")))


def test_a_split_curve_without_split_scalars_is_refused() -> None:
    """A curve of I and W needs the layer's bwd_input_ms and bwd_weight_ms at batch_size."""
    split = curve(bwd_input_ms=(1.0, 1.0, 2.0), bwd_weight_ms=(1.0, 3.0, 6.0))
    with pytest.raises(ProfileError, match=r"layer 'l0' bwd_input_ms is None but its curve gives 1\.0 at batch_size 4"):
        profile(layers=(layer(curve=split), layer("l1")))
    assert profile(layers=(layer(curve=split, bwd_input_ms=1.0, bwd_weight_ms=3.0), layer("l1"))).layers[0].bwd_weight_ms == 3.0


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"cut_curves": None}, r"profile 'toy' cut_curves must have 1 entries, got none"),
        ({"cut_curves": ((20.0, 30.0, 50.0), (1.0, 2.0, 3.0))}, r"profile 'toy' cut_curves must have 1 entries, got 2"),
        ({"cut_curves": ((20.0, 30.0),)}, r"profile 'toy' cut_curves\[0\] must have 3 values \(one per batch size\)"),
        ({"cut_curves": ([20.0, 30.0, 50.0],)}, r"profile 'toy' cut_curves\[0\] must have 3 values"),
        ({"cut_curves": ((20.0, 30.0, -50.0),)}, r"profile 'toy' cut_curves\[0\]\[2\] must be a finite number >= 0, got -50\.0"),
        ({"cut_curves": ((math.nan, 30.0, 50.0),)}, r"profile 'toy' cut_curves\[0\]\[0\] must be a finite number >= 0, got nan"),
        ({"cut_bytes": (31.0,)}, r"profile 'toy' cut_bytes\[0\] is 31\.0 but cut_curves\[0\] gives 30\.0"),
        ({"cut_bytes": None}, r"profile 'toy' cut_bytes\[0\] is 20\.0 but cut_curves\[0\] gives 30\.0"),
    ],
)
def test_bad_cut_curves_name_the_field_and_value(changes: dict[str, Any], message: str) -> None:
    """cut_curves needs one curve per cut, each with a value per size, >= 0, agreeing with cut_bytes at batch_size."""
    with pytest.raises(ProfileError, match=message):
        profile(**changes)


def test_curves_without_batch_sizes_are_refused() -> None:
    """A layer curve or cut_curves on a profile without batch_sizes is a ProfileError."""
    with pytest.raises(ProfileError, match=r"profile 'toy' has per-size curves but no batch_sizes"):
        profile(batch_sizes=None, cut_curves=None)
    plain = (layer(curve=None), layer("l1", curve=None))
    with pytest.raises(ProfileError, match=r"profile 'toy' has per-size curves but no batch_sizes"):
        profile(batch_sizes=None, layers=plain)
    assert profile(batch_sizes=None, layers=plain, cut_curves=None).sizes == (4,)


def test_layer_inputs_must_name_earlier_layers_and_a_chain_is_none() -> None:
    """Inputs that name a later layer or repeat are refused naming the layer; chain inputs are stored as None and a
    DAG's default cuts are its live sets."""
    layers = tuple(LayerProfile(f"l{i}", 1.0, 1.0, float(10**i), 0.0) for i in range(3))
    assert ModelProfile("c", 1, layers, layer_inputs=((), (0,), (1,))).layer_inputs is None
    dag = ModelProfile("d", 1, layers, layer_inputs=((), (0,), (0, 1)))
    assert dag.layer_inputs == ((), (0,), (0, 1)) and dag.cut_bytes == (1.0, 11.0)
    with pytest.raises(ProfileError, match=r"layer 1 \(l1\) names input 2, not an earlier layer 0..0"):
        ModelProfile("d", 1, layers, layer_inputs=((), (2,), (1,)))
    with pytest.raises(ProfileError, match=r"layer 2 \(l2\) inputs must be ascending without repeats"):
        ModelProfile("d", 1, layers, layer_inputs=((), (0,), (1, 0)))
    with pytest.raises(ProfileError, match="layer_inputs must have 3 entries"):
        ModelProfile("d", 1, layers, layer_inputs=((), (0,)))
