"""core.units: each conversion is the one multiplication or division it names, the same float as written by hand."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeplan.core.units import (
    bytes_per_s_to_gb_per_s,
    bytes_to_gib,
    bytes_to_mib,
    gb_per_s_to_bytes_per_s,
    gib_to_bytes,
    ms_per_byte,
    ms_to_s,
    ms_to_us,
    s_to_ms,
    s_to_us,
    us_to_ms,
    us_to_s,
    wire_ms,
)
from pipeplan.io.cluster_json import cluster_from_json, cluster_to_json
from pipeplan.sim.cost.link_model import pair_ms

finite = st.just(0.0) | st.floats(1e-300, 1e12)  # 0 or a normal float (subnormals lose bits in any product)
positive = st.floats(1e-3, 1e15, allow_nan=False, allow_infinity=False)


def test_closed_forms() -> None:
    """A few values worked by hand."""
    assert s_to_ms(1.5) == 1500.0 and ms_to_s(250.0) == 0.25 and s_to_us(2.0) == 2e6
    assert us_to_ms(500.0) == pytest.approx(0.5, rel=1e-15) and ms_to_us(0.5) == pytest.approx(500.0, rel=1e-15)
    assert wire_ms(1e9, 10e9) == 100.0 and ms_per_byte(1e6) == 1e-3
    assert gb_per_s_to_bytes_per_s(25.0) == 25e9 and bytes_per_s_to_gb_per_s(12.5e9) == 12.5
    assert gib_to_bytes(16.0) == 16 * 2**30 and bytes_to_gib(2**31) == 2.0 and bytes_to_mib(3 * 2**20) == 3.0


@given(finite, positive)
def test_each_conversion_is_the_float_of_its_one_operation(x: float, rate: float) -> None:
    """Bit for bit the hand-written forms they replace (so moving a conversion here changes no result)."""
    assert s_to_ms(x) == x * 1000.0 and ms_to_s(x) == x / 1000.0 and ms_to_us(x) == x * 1000.0
    assert us_to_ms(x) == x / 1000.0 and us_to_s(x) == x * 1e-6 and s_to_us(x) == x * 1e6
    assert wire_ms(x, rate) == x / rate * 1000.0 and ms_per_byte(rate) == 1000.0 / rate
    assert gb_per_s_to_bytes_per_s(x) == x * 1e9 and bytes_per_s_to_gb_per_s(x) == x / 1e9
    assert gib_to_bytes(x) == x * 2**30 and bytes_to_gib(x) == x / 2**30


@given(finite)
def test_round_trips_come_back_within_an_ulp_or_two(x: float) -> None:
    """ms -> s -> ms and us -> ms -> us return the value up to rounding (a few parts in 10^16)."""
    assert ms_to_s(s_to_ms(x)) == pytest.approx(x, rel=4e-16, abs=0.0)
    assert ms_to_us(us_to_ms(x)) == pytest.approx(x, rel=1e-15, abs=0.0)


@given(st.integers(0, 10_000_000).map(lambda n: n / 100))  # a file's latency: us with two decimals
def test_a_cluster_file_latency_is_ms_inside_and_written_back_as_it_was(us: float) -> None:
    """The reader turns `latency_us` into ms (pair_ms adds it to the wire time as is); the writer gives the file's
    number back."""
    data = {
        "format": "pipeplan.cluster/1",
        "name": "two",
        "devices": [{"kind": "generic", "memory_gb": 16, "speed": 1.0}] * 2,
        "bandwidth_gb_per_s": [[0, 10], [10, 0]],
        "latency_us": [[0, us], [us, 0]],
    }
    cluster = cluster_from_json(data)
    as_before = s_to_ms(us_to_s(us))  # through seconds: the float a file's latency was always priced at
    assert cluster.latency_ms[0, 1] == as_before
    assert pair_ms(cluster, 0, 1, 1e9) == as_before + 100.0
    again = cluster_to_json(cluster)["latency_us"][0][1]
    assert again == us
