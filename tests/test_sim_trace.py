"""Bandwidth traces: parsing, the piecewise factor, and transfers re-timed by it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeplan.core.errors import CostError
from pipeplan.core.hardware.bandwidth_trace import BandwidthTrace, finish_time
from pipeplan.core.schedule import Schedule
from pipeplan.io.bandwidth_trace_json import bandwidth_trace_from_json, bandwidth_trace_to_json, read_bandwidth_trace
from pipeplan.schedules import make_schedule
from pipeplan.sim import Costs, lower_bound, simulate, uniform_costs


def _gpipe_one_microbatch(trace: BandwidthTrace | None) -> tuple[float, list[tuple[str, float, float]]]:
    """p=2, m=1, f=b=1, c=2: act [1,3], r1 F [3,4] B [4,5], grad [5,7], r0 B [7,8] without a trace."""
    schedule = make_schedule("gpipe", 2, 1)
    result = simulate(schedule, uniform_costs(schedule, 1.0, 1.0, comm=2.0), trace)
    return result.iteration_time, [(t.kind, t.start_ms, t.end_ms) for t in result.transfers]


def test_factor_half_from_zero_doubles_the_work_of_that_link_only() -> None:
    """A factor 0.5 on link (0,1) from t=0 makes the activation take 4 ms; the gradient on (1,0) is unchanged."""
    assert _gpipe_one_microbatch(None) == (8.0, [("act", 1.0, 3.0), ("grad", 5.0, 7.0)])
    trace = bandwidth_trace_from_json([{"t_ms": 0, "link": [0, 1], "factor": 0.5}])
    assert _gpipe_one_microbatch(trace) == (10.0, [("act", 1.0, 5.0), ("grad", 7.0, 9.0)])


def test_a_step_mid_transfer_re_times_it_exactly() -> None:
    """Activation of 2 ms work starting at 1: 1 ms at factor 1 until t=2, then 1 ms of work at 0.5 takes 2 ms: ends at 4."""
    trace = bandwidth_trace_from_json([{"t_ms": 2, "link": [0, 1], "factor": 0.5}])
    assert _gpipe_one_microbatch(trace) == (9.0, [("act", 1.0, 4.0), ("grad", 6.0, 8.0)])
    # back to full rate at 3: work done 1 + 0.5 by t=3, the last 0.5 ms ends at 3.5
    trace = bandwidth_trace_from_json([{"t_ms": 2, "link": [0, 1], "factor": 0.5}, {"t_ms": 3, "link": "all", "factor": 1.0}])
    assert _gpipe_one_microbatch(trace) == (8.5, [("act", 1.0, 3.5), ("grad", 5.5, 7.5)])


def test_all_applies_to_every_link_and_a_later_step_wins() -> None:
    """ "all" changes both directions; a step on one link after it overrides it for that link."""
    trace = bandwidth_trace_from_json([{"t_ms": 0, "link": "all", "factor": 2.0}, {"t_ms": 0, "link": [1, 0], "factor": 0.25}])
    assert trace.factor_at((0, 1), 10.0) == 2.0
    assert trace.factor_at((1, 0), 10.0) == 0.25
    assert _gpipe_one_microbatch(trace) == (13.0, [("act", 1.0, 2.0), ("grad", 4.0, 12.0)])


def test_a_faster_link_lowers_the_lower_bound_so_it_stays_a_bound() -> None:
    """Under a trace that speeds links up, the bound uses the fastest rate and stays below the iteration time."""
    schedule = make_schedule("gpipe", 2, 1)
    costs = uniform_costs(schedule, 1.0, 1.0, comm=2.0)
    trace = bandwidth_trace_from_json([{"t_ms": 0, "link": "all", "factor": 4.0}])
    result = simulate(schedule, costs, trace)
    assert result.iteration_time == 4.0 + 0.5 + 0.5
    assert lower_bound(schedule, costs) == 8.0
    assert result.lower_bound == lower_bound(schedule, costs, trace) == 5.0


def test_finish_time_integrates_the_piecewise_factor() -> None:
    """Work spanning several segments ends where the integral of the factor reaches it."""
    times, factors = (0.0, 10.0, 20.0), (1.0, 0.5, 2.0)
    assert finish_time(times, factors, 5.0, 3.0) == 8.0
    assert finish_time(times, factors, 8.0, 4.0) == 14.0  # 2 by t=10, then 2 more at 0.5 take 4 ms
    assert finish_time(times, factors, 9.0, 7.0) == 20.5  # 1 by 10, 5 more by 20, the last 1 at 2x takes 0.5 ms
    assert finish_time(times, factors, 3.0, 0.0) == 3.0


def test_segments_merge_link_and_all_steps_in_time_order() -> None:
    """Steps on a link and on "all" merge in time order; equal times apply in list order."""
    trace = bandwidth_trace_from_json(
        [
            {"t_ms": 1, "link": "all", "factor": 0.8},
            {"t_ms": 5, "link": [0, 1], "factor": 0.5},
            {"t_ms": 5, "link": "all", "factor": 0.9},
            {"t_ms": 7, "link": [2, 3], "factor": 0.1},
        ]
    )
    assert trace.segments((0, 1)) == ((0.0, 1.0, 5.0), (1.0, 0.8, 0.9))
    assert trace.segments((2, 3)) == ((0.0, 1.0, 5.0, 7.0), (1.0, 0.8, 0.9, 0.1))
    assert not BandwidthTrace(()).affects((0, 1))
    assert trace.max_factor((2, 3)) == 1.0


def test_shifted_trace_starts_at_the_offset() -> None:
    """shifted(t) moves the steps so time t becomes 0, keeping the factor in force at t."""
    trace = bandwidth_trace_from_json([{"t_ms": 2, "link": [0, 1], "factor": 0.5}, {"t_ms": 30, "link": "all", "factor": 2.0}])
    later = trace.shifted(10.0)
    assert later.factor_at((0, 1), 0.0) == 0.5
    assert later.factor_at((0, 1), 20.0) == 2.0
    assert later.factor_at((1, 0), 5.0) == 1.0


def test_read_and_round_trip_a_trace_file(tmp_path: Path) -> None:
    """A trace file reads back to the same steps; the object form with "steps" is accepted too."""
    steps = [{"t_ms": 0.0, "link": [0, 1], "factor": 0.5}, {"t_ms": 4.5, "link": "all", "factor": 1.0}]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(steps))
    trace = read_bandwidth_trace(path)
    assert bandwidth_trace_to_json(trace) == steps
    assert bandwidth_trace_from_json({"format": "pipeplan.bandwidth_trace/1", "steps": steps}) == trace


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        ([{"t_ms": -1, "link": "all", "factor": 1}], r"entry 0: t_ms must be a finite number >= 0, got -1"),
        ([{"t_ms": 0, "link": "all", "factor": 0}], r"entry 0: factor must be a finite number > 0, got 0"),
        ([{"t_ms": 0, "link": "all", "factor": float("nan")}], r"factor must be a finite number > 0, got nan"),
        ([{"t_ms": 0, "link": [1, 1], "factor": 1}], r"link must be \"all\" or two different device ids \[a, b\], got \(1, 1\)"),
        ([{"t_ms": 0, "link": "some", "factor": 1}], r"entry 0: link must be \"all\" or \[a, b\], got 'some'"),
        ([{"t_ms": 0, "link": "all", "factor": 1}, {"t_ms": 0, "factor": 1}], r"entry 1: missing 'link'"),
        ([{"t_ms": 0, "link": "all", "factor": 1, "speed": 2}], r"entry 0: unknown key 'speed'"),
        ([3], r"entry 0 must be an object with t_ms, link, factor, got 3"),
        ({"t_ms": 0}, r"unknown key 't_ms'"),
        ("fast", r"must be a JSON list of steps, got str"),
        (
            [{"t_ms": 5, "link": "all", "factor": 1}, {"t_ms": 2, "link": "all", "factor": 0.5}],
            r"entry 1: t_ms 2.0 is before the previous entry's 5.0 \(steps must be sorted by time\)",
        ),
    ],
)
def test_bad_trace_entries_raise_cost_error_naming_entry_and_value(obj: object, message: str) -> None:
    """Each malformed trace raises CostError quoting the entry and the bad value."""
    with pytest.raises(CostError, match=message):
        bandwidth_trace_from_json(obj)


def test_unreadable_trace_files_raise_cost_error(tmp_path: Path) -> None:
    """A missing file or non-JSON text is a one-line CostError naming the path."""
    with pytest.raises(CostError, match=r"nope.json: cannot read bandwidth trace: does not exist$"):
        read_bandwidth_trace(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("[{")
    with pytest.raises(CostError, match=r"bad.json: invalid JSON at line 1 column 3"):
        read_bandwidth_trace(bad)
    bad.write_text('[{"t_ms": 0, "link": "all", "factor": -1}]')
    with pytest.raises(CostError, match=r"bad.json: bandwidth trace entry 0: factor .*-1"):
        read_bandwidth_trace(bad)


RING = (10, 11)
"""The all-reduce ring of stage 0 in the tests below: two devices no transfer uses (links (10, 11) and (11, 10))."""


def _ring_costs(latency: float = 1.0, work: float = 8.0) -> tuple[Schedule, Costs]:
    """GPipe p=2, m=1, f=b=1, c=2 (stage 0's last backward ends at 8) with a ring all-reduce on stage 0."""
    schedule = make_schedule("gpipe", 2, 1)
    costs = uniform_costs(schedule, 1.0, 1.0, comm=2.0)
    ring = dataclasses.replace(costs.stages[0], allreduce_ms=latency + work, allreduce_latency_ms=latency, allreduce_ring=RING)
    return schedule, dataclasses.replace(costs, stages=(ring, costs.stages[1]))


def test_a_ring_all_reduce_under_a_step_trace_ends_at_the_closed_form() -> None:
    """Latency 1 then 8 ms of work from the last backward at 8: a ring link at 0.25 from t0 = 12 leaves 8 - (12 - 9)
    to run at 0.25, so the ring ends at 12 + 5 / 0.25 = 32; its slower link sets the pace (the ring's minimum)."""
    schedule, costs = _ring_costs()
    plain = simulate(schedule, costs)
    assert plain.collectives == ((0, 8.0, 17.0),) and plain.iteration_time == 17.0
    start, latency, work, t0 = 8.0, 1.0, 8.0, 12.0
    trace = bandwidth_trace_from_json([{"t_ms": t0, "link": [10, 11], "factor": 0.25}])
    result = simulate(schedule, costs, trace)
    expected = t0 + (work - (t0 - (start + latency))) / 0.25
    assert result.collectives[0].end_ms == pytest.approx(expected, rel=0, abs=1e-12) and expected == 32.0
    assert result.iteration_time == pytest.approx(expected, rel=0, abs=1e-12)
    # one link at 0.5 from 0, the other at 0.25 from t0: the ring runs at 0.5 until t0, then at 0.25
    trace = bandwidth_trace_from_json(
        [{"t_ms": 0, "link": [10, 11], "factor": 0.5}, {"t_ms": t0, "link": [11, 10], "factor": 0.25}]
    )
    expected = t0 + (work - 0.5 * (t0 - (start + latency))) / 0.25
    assert simulate(schedule, costs, trace).collectives[0].end_ms == pytest.approx(expected, rel=0, abs=1e-12)
    # a later iteration sees the trace from its offset
    shifted = bandwidth_trace_from_json([{"t_ms": t0 + 5.0, "link": [10, 11], "factor": 0.25}])
    assert simulate(schedule, costs, shifted, offset_ms=5.0).collectives[0].end_ms == pytest.approx(32.0, rel=0, abs=1e-12)


def test_a_trace_on_other_links_leaves_the_ring_all_reduce_exact() -> None:
    """The ring's links untouched: the all-reduce ends at start + allreduce_ms, the same float as without a trace."""
    schedule, costs = _ring_costs(0.3, 7.7)
    trace = bandwidth_trace_from_json([{"t_ms": 0, "link": [3, 4], "factor": 0.1}])
    assert simulate(schedule, costs, trace).collectives == simulate(schedule, costs).collectives == ((0, 8.0, 8.0 + 8.0),)


def test_a_ring_sped_up_lowers_the_lower_bound_so_it_stays_a_bound() -> None:
    """Factors may exceed 1 (core.limits.MAX_FACTOR): under "all" at 4 the ring's work takes 2 ms and the iteration 8;
    the bound reads the ring's fastest factor (at its nominal time the path bound would be 14)."""
    schedule, costs = _ring_costs()
    trace = bandwidth_trace_from_json([{"t_ms": 0, "link": "all", "factor": 4.0}])
    result = simulate(schedule, costs, trace)
    assert result.iteration_time == 8.0
    assert result.lower_bound <= result.iteration_time
    nominal_ring = dataclasses.replace(costs, stages=(dataclasses.replace(costs.stages[0], allreduce_ring=()), costs.stages[1]))
    assert lower_bound(schedule, nominal_ring, trace) == 14.0


_steps = st.lists(st.tuples(st.floats(0.0, 40.0), st.sampled_from([(10, 11), (11, 10), "all"]), st.floats(0.05, 1.0)), max_size=6)


@given(_steps, st.floats(0.0, 30.0))
@settings(max_examples=60, deadline=None)
def test_factors_at_most_1_never_end_a_ring_all_reduce_earlier(steps: list[tuple[float, object, float]], offset: float) -> None:
    """With every factor <= 1 the all-reduce (and the iteration) never ends earlier than without the trace."""
    schedule, costs = _ring_costs()
    entries = [
        {"t_ms": t, "link": link if link == "all" else list(link), "factor": f}
        for t, link, f in sorted(steps, key=lambda s: s[0])
    ]  # type: ignore[call-overload]
    trace = bandwidth_trace_from_json(entries)
    plain, slowed = simulate(schedule, costs), simulate(schedule, costs, trace, offset_ms=offset)
    slack = 1e-12 * plain.iteration_time  # the offset's rounding (trace clock = time + offset, then - offset): ulps
    assert slowed.collectives[0].end_ms >= plain.collectives[0].end_ms - slack
    assert slowed.iteration_time >= plain.iteration_time - slack


@given(
    st.lists(
        st.tuples(st.floats(0.0, 40.0), st.sampled_from([(10, 11), (11, 10), (0, 1), "all"]), st.floats(0.05, 8.0)), max_size=6
    )
)
@settings(max_examples=60, deadline=None)
def test_the_lower_bound_holds_under_any_trace_of_the_ring(steps: list[tuple[float, object, float]]) -> None:
    """Factors below and above 1 on the ring's and a transfer's links: the bound never exceeds the iteration."""
    schedule, costs = _ring_costs()
    entries = [
        {"t_ms": t, "link": link if link == "all" else list(link), "factor": f}
        for t, link, f in sorted(steps, key=lambda s: s[0])
    ]  # type: ignore[call-overload]
    result = simulate(schedule, costs, bandwidth_trace_from_json(entries))
    assert result.lower_bound <= result.iteration_time + 1e-9


def test_ring_segments_are_the_lower_envelope_of_the_rings_links() -> None:
    """The ring's factor is its slowest link's at every moment; a link no step names holds it at 1 at most; a trace
    of "all" steps gives every link alike (one link read for the whole ring)."""
    trace = bandwidth_trace_from_json(
        [
            {"t_ms": 0, "link": [1, 2], "factor": 2.0},
            {"t_ms": 5, "link": [2, 1], "factor": 0.5},
            {"t_ms": 9, "link": [1, 2], "factor": 0.25},
        ]
    )
    assert trace.ring_segments(((1, 2), (2, 1))) == ((0.0, 5.0, 9.0), (1.0, 0.5, 0.25))
    assert trace.ring_segments(((1, 2),)) == ((0.0, 9.0), (2.0, 0.25))
    assert trace.ring_segments(((1, 2), (2, 3))) == ((0.0, 9.0), (1.0, 0.25))
    assert trace.ring_segments(((3, 4), (4, 3))) is None
    assert trace.ring_max_factor(((1, 2),)) == 2.0 and trace.ring_max_factor(((3, 4),)) == 1.0
    everything = bandwidth_trace_from_json([{"t_ms": 3, "link": "all", "factor": 0.5}])
    ring = tuple((d, (d + 1) % 1000) for d in range(1000))
    assert everything.representatives(ring) == ((0, 1),)
    assert everything.ring_segments(ring) == ((0.0, 3.0), (1.0, 0.5))
