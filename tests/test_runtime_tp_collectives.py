"""runtime.measurement.tp_collectives: the ring formula fitted through synthetic all-reduce timings, the message
sizes a profile's split layers give, and the group sizes a job's process count offers."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("torch")

from pipeplan.core.profile import LayerCurve, LayerProfile, ModelProfile, TensorSplit
from pipeplan.runtime.measurement.tp_collectives import TP_BYTES, fit_tp_allreduce, tp_degrees, tp_message_bytes

pytestmark = pytest.mark.torch  # the module imports torch


def ring_seconds(t: int, nbytes: int, latency_s: float, rate: float) -> float:
    """One ring all-reduce of nbytes over t processes: 2(t-1) latency + 2(t-1)/t nbytes / rate."""
    return 2 * (t - 1) * latency_s + 2 * (t - 1) / t * nbytes / rate


@settings(max_examples=50, deadline=None)
@given(st.floats(1e-6, 5e-3), st.floats(1e7, 1e11), st.sampled_from(((2,), (2, 4), (2, 3, 6))))
def test_the_fit_recovers_latency_and_bus_bandwidth_from_exact_ring_timings(latency: float, rate: float, degrees: tuple) -> None:
    """Timings made by the ring formula at TP's sizes on every group size give back its latency and bandwidth, the
    bandwidth capped at 10x what the largest message shows (its bytes moved over its time)."""
    points = [(t, n, ring_seconds(t, n, latency, rate)) for t in degrees for n in (4096, 65536, 1 << 20)]
    fitted_rate, fitted_latency = fit_tp_allreduce(points)
    t = max(degrees)
    largest = 2 * (t - 1) / t * (1 << 20)
    assert fitted_latency == pytest.approx(latency, rel=1e-9)
    assert fitted_rate == pytest.approx(min(rate, 10 * largest / ring_seconds(t, 1 << 20, latency, rate)), rel=1e-9)


def test_a_negative_intercept_is_held_at_zero_and_a_flat_line_is_all_latency() -> None:
    """Noisy timings whose line would start below 0 give latency 0 and the slope through the origin; timings that do
    not grow with the size give the mean per-step time and the 10x cap of the largest message's rate."""
    points = [(2, 1000, 0.5e-3), (2, 2000, 1.5e-3)]  # line: -0.5 ms + 1 us / byte
    rate, latency = fit_tp_allreduce(points)
    moved = [1000.0, 2000.0]  # 2(t-1)/t n at t = 2
    slope = (moved[0] * 0.5e-3 + moved[1] * 1.5e-3) / (moved[0] ** 2 + moved[1] ** 2)
    assert latency == 0.0 and rate == pytest.approx(1 / slope, rel=1e-12)
    flat = [(2, 1000, 2e-3), (2, 4000, 1e-3)]
    rate, latency = fit_tp_allreduce(flat)
    assert latency == pytest.approx((2e-3 + 1e-3) / 2 / 2, rel=1e-12)
    assert rate == pytest.approx(10 * 4000 / 1e-3, rel=1e-12)


def test_message_sizes_span_the_split_layers_activations_over_the_profiles_sizes() -> None:
    """A block's output at sizes 1..8 (1 KiB..8 KiB) gives 4 log-spaced sizes from 1 KiB to 8 KiB (layers that do not
    split do not count); a profile without split layers, or none, gives TP_BYTES; one size gives itself."""
    curve = LayerCurve((1.0, 2.0), (1.0, 2.0), (1024.0, 8192.0), (1024.0, 8192.0))
    split = LayerProfile("block", 2.0, 2.0, 8192.0, 1e3, 8192.0, curve=curve, tp=TensorSplit("block", 4))
    plain = LayerProfile("head", 2.0, 2.0, 1e9, 1e3, 1e9, curve=LayerCurve((1.0, 2.0), (1.0, 2.0), (1e8, 1e9), (1e8, 1e9)))
    profile = ModelProfile("p", 8, (split, plain), batch_sizes=(1, 8), cut_curves=((1024.0, 8192.0),))
    assert tp_message_bytes(profile) == (1024, 2048, 4096, 8192)
    assert tp_message_bytes(None) == TP_BYTES
    assert tp_message_bytes(ModelProfile("q", 8, (LayerProfile("x", 1.0, 1.0, 64.0, 0.0),))) == TP_BYTES
    one = ModelProfile("r", 8, (LayerProfile("b", 1.0, 1.0, 640.0, 0.0, tp=TensorSplit("block", 2)),))
    assert tp_message_bytes(one) == (640,)


def test_group_sizes_are_the_divisors_of_the_process_count_from_two() -> None:
    assert (tp_degrees(1), tp_degrees(2), tp_degrees(4), tp_degrees(6)) == ([], [2], [2, 4], [2, 3, 6])
