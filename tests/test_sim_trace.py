"""Bandwidth traces: parsing, the piecewise factor, and transfers re-timed by it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeplan.core.errors import CostError
from pipeplan.schedules import make_schedule
from pipeplan.sim import BandwidthTrace, bandwidth_trace_from_json, lower_bound, read_bandwidth_trace, simulate, uniform_costs
from pipeplan.sim.trace import finish_time


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
    assert trace.to_json() == steps
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
