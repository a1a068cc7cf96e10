"""sim.trace_gen and io.series_csv: periodic, Markov and replayed traces, and the measured series they read."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeplan.core.errors import CostError
from pipeplan.io.bandwidth_trace_json import bandwidth_trace_from_json, bandwidth_trace_to_json
from pipeplan.io.series_csv import read_series
from pipeplan.sim.trace_gen import markov_trace, periodic_trace, replay_trace

DATA = Path(__file__).parent / "data" / "norway_train_1.csv"


def test_periodic_slows_the_start_of_every_period_and_ends_nominal() -> None:
    """Period 100 ms, duty 0.3: factor 0.2 on [0, 30), [100, 130), ...; nominal from the duration on."""
    trace = periodic_trace(100.0, 0.3, 0.2, 350.0, [(0, 1)])
    assert trace.segments((0, 1)) == ((0.0, 30.0, 100.0, 130.0, 200.0, 230.0, 300.0, 330.0), (0.2, 1.0) * 4)
    assert trace.factor_at((0, 1), 310.0) == 0.2
    assert trace.factor_at((0, 1), 340.0) == 1.0
    assert trace.factor_at((1, 0), 10.0) == 1.0


@given(
    period=st.floats(1.0, 500.0),
    duty=st.floats(0.05, 1.0),
    factor=st.floats(0.01, 1.0),
    periods=st.integers(1, 30),
)
def test_periodic_traces_are_sorted_valid_and_slow_exactly_the_duty(
    period: float, duty: float, factor: float, periods: int
) -> None:
    """Any periodic trace reads back, and the time at the slow factor over whole periods is duty x duration."""
    duration = period * periods
    trace = periodic_trace(period, duty, factor, duration, [(2, 3), (3, 2)])
    assert bandwidth_trace_from_json(bandwidth_trace_to_json(trace)) == trace
    times, factors = trace.segments((2, 3))
    ends = (*times[1:], duration)
    slow = sum(end - start for start, end, f in zip(times, ends, factors, strict=True) if f == factor and factor != 1.0)
    if factor != 1.0:
        assert slow == pytest.approx(duty * duration, rel=1e-9, abs=1e-9)
    assert trace.factor_at((3, 2), duration) == 1.0


@pytest.mark.slow
@given(seed=st.integers(0, 2**32), slow=st.floats(1.0, 100.0), fast=st.floats(1.0, 100.0), low=st.floats(0.01, 1.0))
def test_markov_traces_are_seeded_sorted_and_in_range(seed: int, slow: float, fast: float, low: float) -> None:
    """The same seed gives the same trace; every burst's factor lies in the range; the trace ends nominal."""
    high = min(1.0, low * 3)
    first = markov_trace(seed, slow, fast, (low, high), 2000.0, [(0, 1)])
    assert first == markov_trace(seed, slow, fast, (low, high), 2000.0, [(0, 1)])
    assert bandwidth_trace_from_json(bandwidth_trace_to_json(first)) == first
    assert all(s.factor == 1.0 or low <= s.factor <= high for s in first.steps)
    assert first.factor_at((0, 1), 2000.0) == 1.0


def test_markov_seeds_differ_and_means_hold_roughly() -> None:
    """Two seeds give different traces; over a long trace the slow share is near mean_slow / (mean_slow + mean_fast)."""
    a = markov_trace(1, 50.0, 150.0, (0.2, 0.4), 200_000.0)
    assert a != markov_trace(2, 50.0, 150.0, (0.2, 0.4), 200_000.0)
    times, factors = a.segments((0, 1))
    ends = (*times[1:], 200_000.0)
    slow = sum(e - s for s, e, f in zip(times, ends, factors, strict=True) if f < 1.0)
    assert slow / 200_000.0 == pytest.approx(0.25, abs=0.03)


def test_replay_divides_by_the_nominal_clips_and_scales_time() -> None:
    """Values 5, 10, 0 against nominal 10 at half speed: factors 0.5, 1, min_factor at 0, 500, 1000 ms."""
    trace = replay_trace([3.0, 4.0, 5.0], [5.0, 20.0, 0.0], 10.0, 0.5, [(0, 1)], min_factor=0.05)
    assert trace.segments((0, 1)) == ((0.0, 500.0, 1000.0), (0.5, 1.0, 0.05))


def test_the_checked_in_series_reads_with_its_source() -> None:
    """The Norway 3G train log: 233 samples in Mbit/s over 299 s, its dataset, source and license named in the comments."""
    series = read_series(DATA)
    assert len(series.times_s) == 233 and series.times_s[:2] == (0.0, 2.74) and series.value_name == "mbit_per_s"
    assert series.times_s[-1] == 298.81 and min(series.values) == 0.261 and max(series.values) == 4.176
    text = " ".join(series.comments)
    for name in ("Riiser", "MMSys 2013", "hongzimao/pensieve", "norway_train_1", "a49b2ac17f4e", "MIT license"):
        assert name in text
    trace = replay_trace(series.times_s, series.values, 2.7, 1.0, None)
    assert min(s.factor for s in trace.steps) == pytest.approx(0.261 / 2.7) and max(s.factor for s in trace.steps) == 1.0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("time_s,v\n0,1\n1,2\n1,3\n", r"line 4: time 1 s is not after the previous row's 1 s \(rows must be sorted\)"),
        ("0,1\n1,-2\n", r"line 2: value must be a finite number >= 0, got '-2'"),
        ("0,1\n1,nan\n", r"line 2: value must be a finite number >= 0, got 'nan'"),
        ("0,1,2\n", r"line 1: expected two columns time_s,value"),
        ("t,v\nx,1\n", r"line 2: time 'x' is not a number"),
        ("# only a comment\n", r"no rows of time_s,value"),
    ],
)
def test_bad_series_raise_cost_error_naming_line_and_value(tmp_path: Path, text: str, message: str) -> None:
    """Unsorted, negative, NaN and malformed rows are CostErrors naming the file's line and value."""
    path = tmp_path / "series.csv"
    path.write_text(text)
    with pytest.raises(CostError, match=message):
        read_series(path)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: periodic_trace(0.0, 0.5, 0.5, 10.0), r"period_ms must be a finite number > 0, got 0.0"),
        (lambda: periodic_trace(10.0, 1.5, 0.5, 10.0), r"duty must be a finite number > 0 and <= 1, got 1.5"),
        (lambda: periodic_trace(10.0, 0.5, -1.0, 10.0), r"factor must be a finite number > 0, got -1.0"),
        (lambda: periodic_trace(1e-6, 0.5, 0.5, 1e6), r"gives more than 1,000,000 steps"),
        (lambda: markov_trace(-1, 1.0, 1.0, (0.1, 0.2), 10.0), r"seed must be an integer >= 0, got -1"),
        (lambda: markov_trace(1, 1.0, 1.0, (0.5, 0.2), 10.0), r"factor range must be low <= high, got 0.5,0.2"),
        (lambda: replay_trace([0.0], [1.0], 0.0), r"nominal must be a finite number > 0, got 0.0"),
        (lambda: replay_trace([1.0, 0.5], [1.0, 1.0], 1.0), r"sample 1: time 0.5 s is not after the previous one"),
        (lambda: replay_trace([0.0], [1.0], 1.0, min_factor=2.0), r"min_factor 2 must not exceed max_factor 1"),
    ],
)
def test_bad_generator_parameters_raise_cost_error(build: object, message: str) -> None:
    """Each bad parameter is a CostError naming it and its value."""
    with pytest.raises(CostError, match=message):
        build()  # type: ignore[operator]


@pytest.mark.parametrize(
    ("scale", "message"),
    [
        (1e306, r"time_scale 1e\+306 puts series sample 1 \(at 1 s\) at inf ms, beyond 1e\+15 ms: 2 of 3 samples would be lost"),
        (1e12, r"time_scale 1e\+12 puts series sample 1 \(at 1 s\) at 1e\+15 ms|beyond"),
        (1e-321, r"time_scale \S+ puts series samples 1 and 2 at the same time .*: 1 of 3 samples would merge"),
    ],
)
def test_a_time_scale_that_loses_samples_is_refused_naming_how_many(scale: float, message: str) -> None:
    """Overflow to infinity (or beyond 1e15 ms) and rounding onto one time are refused, not silently dropped."""
    with pytest.raises(CostError, match=message):
        replay_trace([0.0, 1.0, 1.0 + 1e-7], [1.0, 0.5, 0.25], 1.0, time_scale=scale)


def test_the_largest_and_smallest_usable_time_scales_keep_every_sample() -> None:
    """Just inside both edges every sample keeps its own step: the last at its scaled time."""
    kept = replay_trace([0.0, 1.0, 2.0], [1.0, 0.5, 0.25], 1.0, time_scale=5e11)
    assert [s.t_ms for s in kept.steps] == [0.0, 5e14, 1e15]
    tiny = replay_trace([0.0, 1.0, 2.0], [1.0, 0.5, 0.25], 1.0, time_scale=1e-300)
    assert len(tiny.steps) == 3 and tiny.steps[1].t_ms < tiny.steps[2].t_ms


def test_trace_replay_names_the_flag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """trace replay --time-scale 1e306: exit 2, one line naming --time-scale, nothing written."""
    from cli_runner import run

    series = tmp_path / "s.csv"
    series.write_text("t_s,value\n0,1\n1,2\n")
    out = tmp_path / "r.json"
    code, _, err = run(monkeypatch, capsys, "trace", "replay", str(series), "--nominal", "2", "--time-scale", "1e306",
                       "--out", str(out))  # fmt: skip
    assert code == 2 and err.startswith("error: CostError: --time-scale 1e+306 puts series sample 1")
    assert len(err.strip().splitlines()) == 1 and not out.exists()
