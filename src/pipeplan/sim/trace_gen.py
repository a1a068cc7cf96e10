"""Bandwidth traces over many iterations: periodic preemption, seeded Markov on/off bursts, a replayed measured series.

Every generator is deterministic (the Markov one draws from its seed alone,
with Python's `random.Random`, whose `random()` stream is fixed across
versions) and returns a sorted `BandwidthTrace` whose clock starts at the
run's start. `links` None means every link ("all"); else each ordered device
pair gets its own step at every change. The periodic and Markov traces end
at duration_ms with the links back at nominal rate; a replay holds its last
sample.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from pipeplan.core.errors import CostError
from pipeplan.core.hardware.bandwidth_trace import BandwidthTrace, TraceStep
from pipeplan.core.hardware.links import Link

MAX_STEPS = 1_000_000
"""More changes than this is a mistake in the parameters (a period of microseconds over hours), not a trace."""
MAX_TRACE_MS = 1e15
"""The latest time a replayed sample may land at (about 31,700 years): a series stretched beyond it is a mistake in
time_scale, and ms times beyond 1e15 lose sub-ms resolution in float (ulp 0.125 ms)."""


def _check(name: str, value: float, low: float, high: float = math.inf, low_open: bool = True) -> float:
    bad = not math.isfinite(value) or value > high or (value <= low if low_open else value < low)
    if bad:
        bound = f"{'>' if low_open else '>='} {low:g}" + (f" and <= {high:g}" if math.isfinite(high) else "")
        raise CostError(f"{name} must be a finite number {bound}, got {value!r}")
    return float(value)


def _steps(changes: Sequence[tuple[float, float]], links: Sequence[Link] | None, end_ms: float = math.inf) -> BandwidthTrace:
    """A trace from (time, factor) changes for every link in `links` (None: "all"), dropping repeats of a factor;
    with a finite end_ms, changes from end_ms on are dropped and the links return to nominal there."""
    steps: list[TraceStep] = []
    previous = None
    kept = [(t, f) for t, f in changes if t < end_ms] + ([(end_ms, 1.0)] if math.isfinite(end_ms) else [])
    for t, factor in kept:
        if factor == previous:
            continue
        previous = factor
        for link in links if links is not None else (None,):
            steps.append(TraceStep(t, link, factor))
    if len(steps) > MAX_STEPS:
        raise CostError(f"the trace would hold {len(steps):,} steps (at most {MAX_STEPS:,}); use a longer period or duration")
    return BandwidthTrace(tuple(steps))


def periodic_trace(
    period_ms: float, duty: float, factor: float, duration_ms: float, links: Sequence[Link] | None = None, start_ms: float = 0.0
) -> BandwidthTrace:
    """Preempted for `duty` of every period: from start_ms on, each period begins with duty x period_ms at `factor`;
    nominal from duration_ms on.

    Raises:
        CostError: a period, duration or factor that is not a positive finite number, duty outside (0, 1],
            start_ms < 0, or more than MAX_STEPS changes.
    """
    _check("period_ms", period_ms, 0.0)
    _check("duty", duty, 0.0, 1.0)
    _check("factor", factor, 0.0)
    _check("duration_ms", duration_ms, 0.0)
    _check("start_ms", start_ms, 0.0, low_open=False)
    if duration_ms / period_ms * 2 * max(1, len(links or ())) > MAX_STEPS:
        raise CostError(f"period_ms {period_ms:g} over duration_ms {duration_ms:g} gives more than {MAX_STEPS:,} steps")
    changes: list[tuple[float, float]] = []
    t = start_ms
    while t < duration_ms:
        changes.append((t, factor))
        if duty < 1.0:
            changes.append((t + duty * period_ms, 1.0))
        t += period_ms
    return _steps(changes, links, duration_ms)


def markov_trace(
    seed: int,
    mean_slow_ms: float,
    mean_fast_ms: float,
    factor_range: tuple[float, float],
    duration_ms: float,
    links: Sequence[Link] | None = None,
) -> BandwidthTrace:
    """Seeded on/off bursts: nominal for an exponential time of mean mean_fast_ms, then a burst of mean
    mean_slow_ms at a factor drawn uniformly from factor_range, and so on until duration_ms.

    Raises:
        CostError: a mean or duration that is not a positive finite number, or a factor range not 0 < low <= high.
    """
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise CostError(f"seed must be an integer >= 0, got {seed!r}")
    _check("mean_slow_ms", mean_slow_ms, 0.0)
    _check("mean_fast_ms", mean_fast_ms, 0.0)
    _check("duration_ms", duration_ms, 0.0)
    low, high = factor_range
    _check("factor range low", low, 0.0)
    _check("factor range high", high, 0.0)
    if low > high:
        raise CostError(f"factor range must be low <= high, got {low:g},{high:g}")
    if duration_ms / min(mean_slow_ms, mean_fast_ms) * max(1, len(links or ())) > MAX_STEPS:
        raise CostError(f"mean durations of {min(mean_slow_ms, mean_fast_ms):g} ms over {duration_ms:g} ms give too many steps")
    rng = random.Random(seed)
    changes: list[tuple[float, float]] = [(0.0, 1.0)]
    t = -mean_fast_ms * math.log(1.0 - rng.random())
    while t < duration_ms:
        factor = low + (high - low) * rng.random()
        changes.append((t, factor))
        t += -mean_slow_ms * math.log(1.0 - rng.random())
        if t >= duration_ms:
            break
        changes.append((t, 1.0))
        t += -mean_fast_ms * math.log(1.0 - rng.random())
    return _steps(changes, links, duration_ms)


def replay_trace(
    times_s: Sequence[float],
    values: Sequence[float],
    nominal: float,
    time_scale: float = 1.0,
    links: Sequence[Link] | None = None,
    min_factor: float = 0.05,
    max_factor: float = 1.0,
    scale_name: str = "time_scale",
) -> BandwidthTrace:
    """A measured series as factors: value / nominal from each sample's time on, clipped to [min_factor, max_factor].

    The first sample is time 0; a series second lasts `time_scale` seconds of
    trace time (0.1 replays ten times faster). Values of 0 (an outage in the
    measurement) become min_factor: a link at factor 0 would never deliver.

    Raises:
        CostError: an empty or unsorted series, a negative or non-finite value, or a bad nominal, scale or clip; a
            scale under which samples overflow (beyond MAX_TRACE_MS) or round onto each other (`scale_name` names it).
    """
    _check("nominal", nominal, 0.0)
    _check(scale_name, time_scale, 0.0)
    _check("min_factor", min_factor, 0.0)
    _check("max_factor", max_factor, 0.0)
    if min_factor > max_factor:
        raise CostError(f"min_factor {min_factor:g} must not exceed max_factor {max_factor:g}")
    if not times_s or len(times_s) != len(values):
        raise CostError(f"a series needs as many times as values, at least one: got {len(times_s)} and {len(values)}")
    changes = []
    for i, (t, value) in enumerate(zip(times_s, values, strict=True)):
        if not math.isfinite(t) or (i and t <= times_s[i - 1]):
            raise CostError(f"series sample {i}: time {t!r} s is not after the previous one (times must increase)")
        if not math.isfinite(value) or value < 0:
            raise CostError(f"series sample {i}: value must be a finite number >= 0, got {value!r}")
        factor = min(max_factor, max(min_factor, value / nominal))
        changes.append(((t - times_s[0]) * time_scale * 1000.0, factor))
    _check_scaled(times_s, [t for t, _ in changes], time_scale, scale_name)
    return _steps(changes, links)


def _check_scaled(times_s: Sequence[float], scaled_ms: Sequence[float], time_scale: float, name: str) -> None:
    """Refuse a time_scale under which the series' samples no longer stand apart: a time that overflows to
    infinity (beyond MAX_TRACE_MS) or rounds onto the previous sample's, naming how many samples would be lost."""
    over = [i for i, t in enumerate(scaled_ms) if not t <= MAX_TRACE_MS]
    if over:
        i = over[0]
        raise CostError(
            f"{name} {time_scale:g} puts series sample {i} (at {times_s[i] - times_s[0]:g} s) at {scaled_ms[i]:g} ms, "
            f"beyond {MAX_TRACE_MS:g} ms: {len(over):,} of {len(scaled_ms):,} samples would be lost; use a smaller "
            f"{name}"
        )
    merged = [i for i in range(1, len(scaled_ms)) if scaled_ms[i] <= scaled_ms[i - 1]]
    if merged:
        i = merged[0]
        raise CostError(
            f"{name} {time_scale:g} puts series samples {i - 1} and {i} at the same time ({scaled_ms[i]:g} ms): "
            f"{len(merged):,} of {len(scaled_ms):,} samples would merge into the one before; use a larger {name}"
        )
