"""Tests of sim.cost.layers (LayerCosts): layer times and bytes at any microbatch size, measured, floor or linear."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeplan.core.errors import ProfileError
from pipeplan.core.hardware.devices import GPU_SPECS
from pipeplan.core.profile import LayerCurve, LayerProfile, ModelProfile
from pipeplan.sim.cost.layers import OPTIMIZER_TRAFFIC, LayerCosts, StageWork, check_optimizer, check_scaling, interpolate

# The V100's figures (presets/gpus.py): 900 GB/s of HBM, 10 us per kernel launch.
LAUNCH_MS = 10e-3
MS_PER_BYTE = 1000.0 / 900e9

# A profile measured at 2, 4 and 8 samples (batch_size 4); layer 1's forward dips at 4 (not monotone).
SIZES = (2, 4, 8)
FWD = ((1.0, 1.5, 2.5), (0.3, 0.2, 0.4))
BWD = ((2.0, 3.5, 6.5), (0.5, 0.6, 0.6))
SAVED = ((30.0, 50.0, 90.0), (4.0, 8.0, 16.0))
ACTIVATION = ((10.0, 20.0, 40.0), (2.0, 20.0, 200.0))
CUT = (6.0, 10.0, 18.0)


def curve_profile(
    sizes: tuple[int, ...] = SIZES,
    fwd: tuple[tuple[float, ...], ...] = FWD,
    bwd: tuple[tuple[float, ...], ...] = BWD,
    batch_size: int = 4,
    split: bool = False,
    reference_device: str = "V100",
    cut: tuple[float, ...] | None = None,
) -> ModelProfile:
    """A profile measured at `sizes`: fwd/bwd curves, SAVED/ACTIVATION (or 1e3 bytes per sample), cut 0 `cut` (or CUT)."""
    at = sizes.index(batch_size)
    layers = []
    for i, (f, b) in enumerate(zip(fwd, bwd, strict=True)):
        saved = SAVED[i] if sizes == SIZES and i < 2 else tuple(1e3 * s for s in sizes)
        activation = ACTIVATION[i] if sizes == SIZES and i < 2 else saved
        inp = tuple(v * 0.25 for v in b) if split else None
        wgt = tuple(v * 0.75 for v in b) if split else None
        curve = LayerCurve(f, b, activation, saved, inp, wgt)
        layers.append(
            LayerProfile(
                f"l{i}",
                f[at],
                b[at],
                activation[at],
                1e6,
                saved[at],
                bwd_input_ms=inp[at] if inp else None,
                bwd_weight_ms=wgt[at] if wgt else None,
                curve=curve,
            )
        )
    default = CUT if sizes == SIZES else None
    cuts = tuple(cut or default or layer.curve.activation_bytes for layer in layers[:-1])  # type: ignore[union-attr]
    return ModelProfile(
        "curved", batch_size, tuple(layers), reference_device,
        cut_bytes=tuple(c[at] for c in cuts), batch_sizes=sizes, cut_curves=cuts,
    )  # fmt: skip


def one_size(
    reference_device: str = "V100", split: bool = False, optimizer_ms: tuple[tuple[str, float], ...] = ()
) -> ModelProfile:
    """At 8 samples: fwd 4, bwd 8 ms, 9e8 param bytes; fwd 0.5, bwd 1 ms, 9e8 bytes; fwd 0.25, bwd 0.5 ms, no params."""
    layers = (
        LayerProfile("big", 4.0, 8.0, 1e6, 9e8, 2e6,
                     bwd_input_ms=3.0 if split else None, bwd_weight_ms=5.0 if split else None, optimizer_ms=optimizer_ms),
        LayerProfile("tiny", 0.5, 1.0, 3e6, 9e8, 4e6,
                     bwd_input_ms=0.25 if split else None, bwd_weight_ms=0.75 if split else None),
        LayerProfile("relu", 0.25, 0.5, 3e6, 0.0, 8e6,
                     bwd_input_ms=0.25 if split else None, bwd_weight_ms=0.25 if split else None),
    )  # fmt: skip
    return ModelProfile("flat", 8, layers, reference_device, cut_bytes=(5e6, 7e6))


def floor_time(measured_ms: float, fixed_ms: float, samples: float, batch: float = 8) -> float:
    """F(x) = f + (F(P) - f) x / P with f = min(F(P), fixed)."""
    f = min(measured_ms, fixed_ms)
    return f + (measured_ms - f) * samples / batch


# ---- checks ---------------------------------------------------------------------------------------------------------


def test_the_v100_figures_used_here_are_the_preset() -> None:
    """The closed forms below assume the V100 preset: 900 GB/s and a 10 us launch floor."""
    assert (GPU_SPECS["V100"].hbm_gb_per_s, GPU_SPECS["V100"].launch_us) == (900.0, 10.0)


def test_check_scaling_and_optimizer_accept_known_names() -> None:
    """Known scalings and optimizers come back unchanged."""
    for scaling in ("auto", "measured", "floor", "linear"):
        assert check_scaling(scaling) == scaling
    for optimizer in ("adam", "sgd", "sgd_momentum"):
        assert check_optimizer(optimizer) == optimizer


def test_unknown_scaling_is_a_profile_error_naming_the_value() -> None:
    """An unknown scaling raises ProfileError naming --batch-scaling, the choices and the value."""
    with pytest.raises(ProfileError, match=r"--batch-scaling must be one of auto, measured, floor, linear, got 'fast'"):
        check_scaling("fast")
    with pytest.raises(ProfileError, match=r"--batch-scaling .* got 'Linear'"):
        LayerCosts(one_size(), "Linear")


def test_unknown_optimizer_is_a_profile_error_naming_the_value() -> None:
    """An unknown optimizer raises ProfileError naming --optimizer, the choices and the value."""
    with pytest.raises(ProfileError, match=r"--optimizer must be one of adam, sgd, sgd_momentum, got 'lamb'"):
        check_optimizer("lamb")
    with pytest.raises(ProfileError, match=r"--optimizer .* got 'lamb'"):
        LayerCosts(one_size(), "floor", "lamb")


def test_measured_scaling_of_a_one_size_profile_names_the_flag() -> None:
    """`measured` on a profile measured at one size raises ProfileError naming --batch-scaling and the size."""
    with pytest.raises(
        ProfileError, match=r"--batch-scaling measured needs .* several batch sizes; 'flat' has only 8 .*floor or linear"
    ):
        LayerCosts(one_size(), "measured")


def test_auto_resolves_to_measured_with_several_sizes_and_floor_with_one() -> None:
    """`auto` is `measured` for a multi-size profile and `floor` for a one-size profile; explicit modes stay."""
    assert LayerCosts(curve_profile()).mode == "measured"
    assert LayerCosts(one_size()).mode == "floor"
    assert LayerCosts(curve_profile(), "auto").scaling == "auto"
    assert LayerCosts(curve_profile(), "floor").mode == "floor"
    assert LayerCosts(curve_profile(), "linear").mode == "linear"
    assert LayerCosts(one_size(), "linear").mode == "linear"


# ---- measured -------------------------------------------------------------------------------------------------------


def test_measured_is_exact_at_every_measured_size() -> None:
    """At each measured size every layer's times and bytes are the measured values, bit for bit."""
    costs = LayerCosts(curve_profile(split=True), "measured")
    for j, size in enumerate(SIZES):
        arrays = costs.arrays(size)
        assert arrays.fwd.tolist() == [FWD[0][j], FWD[1][j]]
        assert arrays.bwd.tolist() == [BWD[0][j], BWD[1][j]]
        assert arrays.bwd_input is not None and arrays.bwd_input.tolist() == [BWD[0][j] * 0.25, BWD[1][j] * 0.25]
        assert arrays.bwd_weight is not None and arrays.bwd_weight.tolist() == [BWD[0][j] * 0.75, BWD[1][j] * 0.75]
        assert arrays.saved.tolist() == [SAVED[0][j], SAVED[1][j]]
        assert arrays.activation.tolist() == [ACTIVATION[0][j], ACTIVATION[1][j]]
        assert costs.cut_bytes(0, size) == CUT[j]


def test_measured_is_piecewise_linear_between_sizes() -> None:
    """Between two measured sizes a value is the straight line through them."""
    costs = LayerCosts(curve_profile(), "measured")
    three, six = costs.arrays(3), costs.arrays(6)
    assert three.fwd.tolist() == pytest.approx([1.0 + 0.5 * 0.5, 0.3 - 0.1 * 0.5])
    assert three.bwd.tolist() == pytest.approx([2.0 + 1.5 * 0.5, 0.5 + 0.1 * 0.5])
    assert six.fwd.tolist() == pytest.approx([1.5 + 1.0 * 0.5, 0.2 + 0.2 * 0.5])
    assert six.saved.tolist() == pytest.approx([70.0, 12.0])
    assert three.activation.tolist() == pytest.approx([15.0, 11.0])


def test_measured_extends_the_last_segment_beyond_the_largest_size() -> None:
    """Above the largest size the last segment (4 -> 8) is extended: at 16, v(4) + 3 (v(8) - v(4))."""
    costs = LayerCosts(curve_profile(), "measured")
    sixteen = costs.arrays(16)
    assert sixteen.fwd.tolist() == pytest.approx([1.5 + 3 * 1.0, 0.2 + 3 * 0.2])
    assert sixteen.bwd.tolist() == pytest.approx([3.5 + 3 * 3.0, 0.6])
    assert sixteen.saved.tolist() == pytest.approx([170.0, 32.0])
    assert costs.cut_bytes(0, 16) == pytest.approx(34.0)


def test_measured_extends_the_first_segment_below_the_smallest_size() -> None:
    """Below the smallest size the first segment (2 -> 4) is extended: layer 1's dip makes it rise to 0.35 at 1 sample."""
    arrays = LayerCosts(curve_profile(), "measured").arrays(1)
    assert arrays.fwd[1] == pytest.approx(0.3 + 0.1 * 0.5)
    assert arrays.saved.tolist() == pytest.approx([20.0, 2.0])


def test_measured_times_never_fall_below_the_smallest_measured_time() -> None:
    """Extending a rising first segment below the smallest size stops at the layer's smallest measured time."""
    costs = LayerCosts(curve_profile(), "measured")
    for samples in (1, 0.5, 0.01):
        arrays = costs.arrays(samples)
        assert arrays.fwd[0] == 1.0  # the line would give 1.0 + 0.5 (samples - 2) / 2 < 1.0
        assert arrays.bwd[0] == 2.0
        assert arrays.fwd[1] >= 0.2


def test_interpolate_clamps_a_falling_extension_at_the_floor() -> None:
    """interpolate extends the nearest segment on either side and never returns less than `floor`."""
    sizes, values, floor = np.array([1.0, 2.0]), np.array([[3.0, 1.0], [1.0, 2.0]]), np.array([1.0, 0.0])
    assert interpolate(sizes, values, 1.5, floor).tolist() == [2.0, 1.5]
    assert interpolate(sizes, values, 4.0, floor).tolist() == [1.0, 4.0]  # 3 - 2*3 = -3 -> floor 1
    assert interpolate(sizes, values, 0.0, floor).tolist() == [5.0, 0.0]  # 1 - 1 = 0 -> floor 0


def test_interpolate_at_a_measured_size_returns_a_copy() -> None:
    """The exact column comes back as a copy: changing it does not change the curve."""
    values = np.array([[3.0, 1.0]])
    out = interpolate(np.array([1.0, 2.0]), values, 2.0, np.zeros(1))
    out[0] = 99.0
    assert values.tolist() == [[3.0, 1.0]]


def test_measured_bytes_interpolate_and_never_go_below_zero() -> None:
    """Bytes follow the same lines; layer 1's activation (2, 20, 200) extended to 1 sample would be -7, so it is 0."""
    costs = LayerCosts(curve_profile(), "measured")
    assert costs.arrays(1).activation.tolist() == [5.0, 0.0]
    assert costs.arrays(0.5).saved.tolist() == pytest.approx([15.0, 1.0])
    assert costs.cut_bytes(0, 1) == pytest.approx(4.0)
    assert costs.cut_bytes(0, 3) == pytest.approx(8.0)


def test_measured_cut_bytes_do_not_go_below_zero() -> None:
    """A cut curve (2, 20, 40) extended to 1 sample would be -7 bytes: it is 0."""
    costs = LayerCosts(curve_profile(cut=(2.0, 20.0, 40.0)), "measured")
    assert costs.cut_bytes(0, 1) == 0.0
    assert costs.cut_bytes(0, 3) == pytest.approx(11.0)
    assert costs.cut_bytes(0, 16) == pytest.approx(80.0)


def test_measured_stage_uses_the_curve_at_b_over_r_and_divides_times_by_speed() -> None:
    """A microbatch of 12 on 2 replicas of speed 2 takes each layer at 6 samples, times halved, bytes not."""
    costs = LayerCosts(curve_profile(), "measured")
    work = costs.stage(range(2), 12, replicas=2, speed=2.0)
    assert work.fwd_ms == pytest.approx((2.0 + 0.3) / 2)
    assert work.bwd_ms == pytest.approx((3.5 + 3.0 * 0.5 + 0.6) / 2)
    assert work.saved_bytes == pytest.approx(70.0 + 12.0)
    assert work.param_bytes == 2e6
    assert work.bwd_input_ms is None and work.bwd_weight_ms is None
    one = costs.stage([1], 8, replicas=2)
    assert (one.fwd_ms, one.bwd_ms, one.saved_bytes) == (0.2, 0.6, 8.0)


def test_measured_stage_interpolates_the_zero_bubble_split() -> None:
    """With I/W curves the stage's I and W are interpolated like B (here a quarter and three quarters of it)."""
    costs = LayerCosts(curve_profile(split=True), "measured")
    work = costs.stage([0], 6)
    assert work.bwd_ms == pytest.approx(5.0)
    assert work.bwd_input_ms == pytest.approx(1.25)
    assert work.bwd_weight_ms == pytest.approx(3.75)


def test_per_layer_ms_is_forward_plus_backward() -> None:
    """per_layer_ms(x) is every layer's fwd + bwd at x samples."""
    costs = LayerCosts(curve_profile(), "measured")
    assert costs.per_layer_ms(8).tolist() == [2.5 + 6.5, 0.4 + 0.6]
    assert costs.per_layer_ms(3).tolist() == pytest.approx([1.25 + 2.75, 0.25 + 0.55])


@given(st.data())
def test_measured_times_never_decrease_with_samples_when_the_measurements_do_not(data: st.DataObject) -> None:
    """Non-decreasing measured times give non-decreasing interpolated times at every pair of sample counts."""
    sizes = tuple(sorted(data.draw(st.sets(st.integers(1, 64), min_size=2, max_size=5))))
    steps = st.lists(st.floats(0.0, 10.0), min_size=len(sizes), max_size=len(sizes))
    fwd = tuple(tuple(itertools.accumulate(data.draw(steps))) for _ in range(2))
    bwd = tuple(tuple(itertools.accumulate(data.draw(steps))) for _ in range(2))
    batch = data.draw(st.sampled_from(sizes))
    costs = LayerCosts(curve_profile(sizes, fwd, bwd, batch_size=batch), "measured")
    low, high = sorted(data.draw(st.floats(0.01, 200.0)) for _ in range(2))
    for key in ("fwd", "bwd"):
        a, b = getattr(costs.arrays(low), key), getattr(costs.arrays(high), key)
        assert np.all(a <= b + 1e-9 * np.maximum(1.0, b)), (key, low, high, a, b)


# ---- floor ----------------------------------------------------------------------------------------------------------


def test_floor_mode_has_a_fixed_part_from_launch_and_weight_traffic() -> None:
    """F(x) = f + (F(P) - f) x / P, f = min(F(P), launch + params / hbm); backward has 2 launches and twice the traffic."""
    costs = LayerCosts(one_size(), "floor")
    fwd_fixed = LAUNCH_MS + 9e8 * MS_PER_BYTE  # 1.01 ms: below layer 0's 4 ms, above layer 1's 0.5 ms
    bwd_fixed = 2 * LAUNCH_MS + 2 * 9e8 * MS_PER_BYTE  # 2.02 ms
    relu_fwd_fixed, relu_bwd_fixed = LAUNCH_MS, 2 * LAUNCH_MS
    assert costs.fixed_ms["fwd"].tolist() == pytest.approx([fwd_fixed, 0.5, relu_fwd_fixed])
    assert costs.fixed_ms["bwd"].tolist() == pytest.approx([bwd_fixed, 1.0, relu_bwd_fixed])
    for samples in (1, 4, 6, 16):
        arrays = costs.arrays(samples)
        expected_fwd = [floor_time(4.0, fwd_fixed, samples), 0.5, floor_time(0.25, relu_fwd_fixed, samples)]
        expected_bwd = [floor_time(8.0, bwd_fixed, samples), 1.0, floor_time(0.5, relu_bwd_fixed, samples)]
        assert arrays.fwd.tolist() == pytest.approx(expected_fwd)
        assert arrays.bwd.tolist() == pytest.approx(expected_bwd)
    assert costs.arrays(4).fwd[0] == pytest.approx(1.01 + (4.0 - 1.01) / 2)


def test_floor_mode_splits_i_and_w_with_one_launch_and_one_weight_read_each() -> None:
    """I and W each get a fixed part of one launch plus the weights' bytes over hbm (capped at their own time)."""
    costs = LayerCosts(one_size(split=True), "floor")
    fixed = LAUNCH_MS + 9e8 * MS_PER_BYTE
    assert costs.fixed_ms["bwd_input"].tolist() == pytest.approx([fixed, 0.25, LAUNCH_MS])
    assert costs.fixed_ms["bwd_weight"].tolist() == pytest.approx([fixed, 0.75, LAUNCH_MS])
    work = costs.stage([0], 4)
    assert work.bwd_input_ms == pytest.approx(floor_time(3.0, fixed, 4))
    assert work.bwd_weight_ms == pytest.approx(floor_time(5.0, fixed, 4))


def test_floor_equals_the_measured_time_at_the_profile_size() -> None:
    """At x = P (also reached as b/r) floor mode gives the measured times and bytes exactly."""
    profile = one_size(split=True)
    costs = LayerCosts(profile, "floor")
    arrays = costs.arrays(8)
    assert arrays.fwd.tolist() == [4.0, 0.5, 0.25]
    assert arrays.bwd.tolist() == [8.0, 1.0, 0.5]
    assert arrays.bwd_input is not None and arrays.bwd_input.tolist() == [3.0, 0.25, 0.25]
    assert arrays.saved.tolist() == [2e6, 4e6, 8e6]
    work = costs.stage([0], 16, replicas=2)
    assert (work.fwd_ms, work.bwd_ms, work.bwd_input_ms, work.bwd_weight_ms, work.saved_bytes) == (4.0, 8.0, 3.0, 5.0, 2e6)


def test_floor_mode_scales_bytes_by_x_over_p() -> None:
    """Saved and activation bytes and cuts are linear in x under the floor model."""
    costs = LayerCosts(one_size(), "floor")
    assert costs.arrays(2).saved.tolist() == pytest.approx([0.5e6, 1e6, 2e6])
    assert costs.arrays(16).activation.tolist() == pytest.approx([2e6, 6e6, 6e6])
    assert costs.cut_bytes(1, 4) == pytest.approx(3.5e6)
    assert costs.stage(range(3), 8, replicas=4).saved_bytes == pytest.approx((2e6 + 4e6 + 8e6) / 4)


def test_floor_stage_divides_times_by_speed_and_uses_b_over_r() -> None:
    """A stage of 8 samples on 2 replicas of speed 0.5 costs each layer at 4 samples, times doubled."""
    costs = LayerCosts(one_size(), "floor")
    work = costs.stage(range(2), 8, replicas=2, speed=0.5)
    expected = floor_time(4.0, LAUNCH_MS + 9e8 * MS_PER_BYTE, 4) + 0.5
    assert work.fwd_ms == pytest.approx(expected / 0.5)
    assert work.param_bytes == 1.8e9


def test_floor_of_a_product_named_reference_device_uses_its_kind() -> None:
    """A profile measured on "Tesla V100-SXM2-16GB" gets the V100's floor."""
    named = LayerCosts(one_size("Tesla V100-SXM2-16GB"), "floor")
    assert named.fixed_ms["fwd"].tolist() == LayerCosts(one_size(), "floor").fixed_ms["fwd"].tolist()


def test_floor_of_a_cpu_profile_uses_the_cpu_figures() -> None:
    """A `cpu` profile's floor takes 10 GB/s of memory traffic and 10 us per operator."""
    costs = LayerCosts(one_size("cpu"), "floor")
    assert costs.fixed_ms["fwd"].tolist() == pytest.approx([min(4.0, 0.01 + 9e8 / 10e9 * 1000), 0.5, 0.01])


@pytest.mark.parametrize("reference", ["unknown", "local", "NVIDIA GeForce RTX 4090"])
def test_floor_without_a_known_reference_device_is_linear(reference: str) -> None:
    """With no spec for the reference device the fixed part is 0 and floor times equal linear ones up to rounding."""
    floor, linear = LayerCosts(one_size(reference, split=True), "floor"), LayerCosts(one_size(reference, split=True), "linear")
    assert floor.spec is None
    assert all(v.tolist() == [0.0, 0.0, 0.0] for v in floor.fixed_ms.values())
    for b, r, speed in ((1, 1, 1.0), (4, 2, 3.0), (32, 1, 0.7)):
        got, want = floor.stage(range(3), b, r, speed), linear.stage(range(3), b, r, speed)
        assert got.fwd_ms == pytest.approx(want.fwd_ms, rel=1e-12)
        assert got.bwd_ms == pytest.approx(want.bwd_ms, rel=1e-12)
        assert got.bwd_input_ms == pytest.approx(want.bwd_input_ms, rel=1e-12)
        assert got.saved_bytes == pytest.approx(want.saved_bytes, rel=1e-12)


@given(
    st.floats(0.0, 50.0),
    st.floats(0.0, 2e10),
    st.floats(0.01, 64.0),
)
def test_floor_times_lie_above_linear_below_p_and_below_linear_above_it(fwd: float, params: float, samples: float) -> None:
    """Floor times exceed the plain x/P scaling when x < P and fall short of it when x > P, and never fall below f."""
    profile = ModelProfile("one", 8, (LayerProfile("l", fwd, 2 * fwd, 1.0, params),), "V100")
    floor = LayerCosts(profile, "floor").arrays(samples).fwd[0]
    linear = fwd * samples / 8
    fixed = min(fwd, LAUNCH_MS + params * MS_PER_BYTE)
    tol = 1e-9 * max(1.0, fwd * samples)
    assert floor >= fixed - tol
    if samples <= 8:
        assert floor >= linear - tol
    else:
        assert floor <= linear + tol


# ---- linear ---------------------------------------------------------------------------------------------------------


def test_linear_mode_is_sum_times_b_over_p_over_r_speed_exactly() -> None:
    """Under linear a stage costs sum * (b/P) / (r * speed), summed in layer order, bit for bit."""
    profile = one_size(split=True)
    costs = LayerCosts(profile, "linear")
    layers = profile.layers
    for b, r, speed in ((3, 1, 1.0), (12, 3, 0.7), (8, 2, 5.0)):
        work = costs.stage(range(3), b, r, speed)
        scale = b / 8
        assert work.fwd_ms == sum(layer.fwd_ms for layer in layers) * scale / (r * speed)
        assert work.bwd_ms == sum(layer.bwd_ms for layer in layers) * scale / (r * speed)
        assert work.bwd_input_ms == sum(layer.bwd_input_ms or 0.0 for layer in layers) * scale / (r * speed)
        assert work.bwd_weight_ms == sum(layer.bwd_weight_ms or 0.0 for layer in layers) * scale / (r * speed)
        assert work.saved_bytes == sum(layer.saved_bytes or 0.0 for layer in layers) * scale / r
        assert work.param_bytes == 1.8e9


def test_linear_mode_scales_cuts_and_ignores_curves() -> None:
    """Linear cut bytes are cut_bytes * b / P even for a multi-size profile."""
    costs = LayerCosts(curve_profile(), "linear")
    assert costs.cut_bytes(0, 12) == 10.0 * 12 / 4
    assert costs.arrays(12).fwd.tolist() == pytest.approx([1.5 * 3, 0.2 * 3])


def test_linear_stage_without_a_split_has_no_i_and_w() -> None:
    """Without measured I/W every mode leaves bwd_input_ms and bwd_weight_ms None."""
    for scaling in ("floor", "linear"):
        work = LayerCosts(one_size(), scaling).stage([0, 1], 8)
        assert isinstance(work, StageWork)
        assert work.bwd_input_ms is None and work.bwd_weight_ms is None


# ---- optimizer ------------------------------------------------------------------------------------------------------


def test_measured_optimizer_step_wins_in_every_mode() -> None:
    """A layer's measured step time for the chosen optimizer is used as is (divided by speed), even under linear."""
    profile = one_size("unknown", optimizer_ms=(("adam", 3.0), ("sgd", 1.0)))
    for scaling in ("floor", "linear"):
        assert LayerCosts(profile, scaling).optimizer_ms([0]) == 3.0
        assert LayerCosts(profile, scaling, "sgd").optimizer_ms([0], speed=2.0) == 0.5
    assert LayerCosts(profile, "linear", "sgd_momentum").optimizer_ms([0]) == 0.0


@pytest.mark.parametrize("optimizer", ["adam", "sgd", "sgd_momentum"])
def test_unmeasured_optimizer_step_is_launch_plus_traffic_over_hbm(optimizer: str) -> None:
    """Unmeasured (floor or measured mode), a step is launch + OPTIMIZER_TRAFFIC * params / hbm per layer with params."""
    step = LAUNCH_MS + OPTIMIZER_TRAFFIC[optimizer] * 9e8 * MS_PER_BYTE
    costs = LayerCosts(one_size(), "floor", optimizer)
    assert costs.optimizer_ms([0]) == pytest.approx(step)
    assert costs.optimizer_ms(range(3), speed=2.0) == pytest.approx(2 * step / 2.0)
    assert costs.optimizer_ms([2]) == 0.0  # no parameters, no step
    assert costs.stage(range(2), 8).optimizer_ms == pytest.approx(2 * step)
    measured = LayerCosts(curve_profile(), "measured", optimizer)
    assert measured.optimizer_ms([0]) == pytest.approx(LAUNCH_MS + OPTIMIZER_TRAFFIC[optimizer] * 1e6 * MS_PER_BYTE)


def test_adam_step_estimate_reads_and_writes_seven_bytes_per_parameter_byte() -> None:
    """Adam's unmeasured step on 9e8 parameter bytes of a V100 is 0.01 + 7 ms."""
    assert LayerCosts(one_size(), "floor").optimizer_ms([0]) == pytest.approx(7.01)


def test_no_optimizer_estimate_under_linear_or_without_a_reference_device() -> None:
    """Linear mode and an unknown reference device estimate nothing: unmeasured steps cost 0."""
    assert LayerCosts(one_size(), "linear").optimizer_ms(range(3)) == 0.0
    assert LayerCosts(one_size("unknown"), "floor").optimizer_ms(range(3)) == 0.0
    assert LayerCosts(one_size("local"), "auto").stage(range(3), 8).optimizer_ms == 0.0


def test_optimizer_step_does_not_depend_on_the_microbatch() -> None:
    """The stage's optimizer_ms is the same at any microbatch size and replica count."""
    costs = LayerCosts(one_size(), "floor")
    steps = {costs.stage(range(3), b, r).optimizer_ms for b, r in ((1, 1), (8, 2), (64, 4))}
    assert len(steps) == 1
    assert math.isclose(steps.pop(), 2 * 7.01)


def shared_profile(sizes: tuple[int, ...] = (2, 4)) -> ModelProfile:
    """Three layers of 100 saved bytes per sample; layers 1 and 2 share 40 per sample with the layer before."""
    layers = []
    for i in range(3):
        saved = tuple(100.0 * b for b in sizes)
        shared = tuple((40.0 * b if i else 0.0) for b in sizes)
        curve = LayerCurve((1.0,) * len(sizes), (2.0,) * len(sizes), saved, saved, shared_bytes=shared if i else None)
        layers.append(LayerProfile(f"l{i}", 1.0, 2.0, saved[-1], 1e3, saved[-1], curve=curve, shared_bytes=shared[-1]))
    cuts = tuple(tuple(100.0 * b for b in sizes) for _ in range(2))
    return ModelProfile("shared", sizes[-1], tuple(layers), "cpu", cut_bytes=tuple(c[-1] for c in cuts), batch_sizes=sizes,
                        cut_curves=cuts)  # fmt: skip


@pytest.mark.parametrize("scaling", ["measured", "linear"])
def test_a_stage_holds_a_storage_two_neighbours_save_once(scaling: str) -> None:
    """Saved bytes of a stage: the layers' sum less the shared bytes of each layer whose predecessor is in the stage
    (a ReLU's output and the next Linear's input are one tensor); a layer cut off from its predecessor holds all."""
    costs = LayerCosts(shared_profile(), scaling=scaling)
    for b in (2, 4):
        assert costs.stage(range(3), b).saved_bytes == pytest.approx(300 * b - 80 * b)
        assert costs.stage([1, 2], b).saved_bytes == pytest.approx(200 * b - 40 * b)
        assert costs.stage([0, 2], b).saved_bytes == pytest.approx(200 * b)  # not neighbours: nothing shared
        assert costs.stage([2], b).saved_bytes == pytest.approx(100 * b)
    assert costs.stage(range(3), 4, replicas=2).saved_bytes == pytest.approx(220 * 2)


def test_block_sums_hold_what_the_stage_holds() -> None:
    """The DP's range sums over blocks agree with LayerCosts.stage on every range of layers (shared bytes included)."""
    from pipeplan.planner.search.partition_dp import block_sums

    costs = LayerCosts(shared_profile())
    blocks = ((0, 0), (1, 1), (2, 2))
    sums = block_sums(costs, blocks, 4.0, 4)
    for i, j in itertools.combinations_with_replacement(range(3), 2):
        assert sums.saved_bytes[i, j] == pytest.approx(costs.stage(range(i, j + 1), 4).saved_bytes)
    merged = block_sums(costs, ((0, 1), (2, 2)), 4.0, 4)
    assert merged.saved_bytes[0, 1] == pytest.approx(costs.stage(range(3), 4).saved_bytes)
    assert merged.saved_bytes[1, 1] == pytest.approx(costs.stage([2], 4).saved_bytes)


def _loop_optimizer_ms(costs: LayerCosts, layers: list[int], speed: float) -> float:
    """The optimizer step of `layers` as a plain loop: measured where the layer has it, else the weight-traffic
    estimate (floor and measured modes on a known device), else nothing."""
    total = 0.0
    for i in layers:
        layer = costs.profile.layers[i]
        measured = layer.optimizer_step_ms(costs.optimizer)
        if measured is not None:
            total += measured
        elif costs.mode != "linear" and layer.param_bytes > 0:
            total += LAUNCH_MS + OPTIMIZER_TRAFFIC[costs.optimizer] * layer.param_bytes / 900e9 * 1000.0
    return total / speed


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0, 1e9), st.none() | st.floats(0, 1e3)), min_size=1, max_size=30),
    st.sampled_from(["floor", "linear"]),
    st.sampled_from(["adam", "sgd"]),
    st.floats(0.1, 10.0),
    st.data(),
)
def test_optimizer_and_parameter_sums_are_the_plain_loops_bit_for_bit(
    layers: list[tuple[float, float | None]], scaling: str, optimizer: str, speed: float, data: st.DataObject
) -> None:
    """optimizer_ms and a stage's param_bytes (sums over per-layer arrays) equal a loop over the layers' fields, to
    the last bit, for any layers, any subset and order, measured steps or estimated ones."""
    profile = ModelProfile(
        "p",
        4,
        tuple(
            LayerProfile(f"l{i}", 1.0, 2.0, 10.0, params, optimizer_ms=() if step is None else ((optimizer, step),))
            for i, (params, step) in enumerate(layers)
        ),
        reference_device="V100",
    )
    costs = LayerCosts(profile, scaling, optimizer)
    chosen = data.draw(st.lists(st.integers(0, len(layers) - 1), unique=True))
    assert costs.optimizer_ms(chosen, speed) == _loop_optimizer_ms(costs, chosen, speed)
    if chosen:
        expected = 0.0
        for i in sorted(chosen):
            expected += profile.layers[i].param_bytes
        assert costs.stage(chosen, 4).param_bytes == expected


@pytest.mark.parametrize("scaling", ["floor", "linear", "measured"])
def test_a_kept_range_costs_what_its_layers_cost_fresh(scaling: str) -> None:
    """stage keeps a range's costs: asked again (and after other ranges, sizes, replicas and speeds), a range gives
    the values its layers give as a list, which is never kept (the same arithmetic, so equal floats)."""
    profile = curve_profile() if scaling == "measured" else one_size(split=True)
    costs = LayerCosts(profile, scaling)
    n = profile.num_layers
    spans = [(a, b) for a in range(n) for b in range(a + 1, n + 1)]
    asks = [(a, b, size, r, speed) for a, b in spans for size, r, speed in ((4, 1, 1.0), (8, 2, 0.7))]
    first = [costs.stage(range(a, b), size, r, speed) for a, b, size, r, speed in asks]
    again = [costs.stage(range(a, b), size, r, speed) for a, b, size, r, speed in reversed(asks)][::-1]
    fresh = [costs.stage(list(range(a, b)), size, r, speed) for a, b, size, r, speed in asks]
    assert first == again == fresh
