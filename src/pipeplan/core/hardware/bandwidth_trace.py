"""Bandwidth traces: piecewise-constant multipliers of each link's nominal rate over time (the value; its file format
is io.bandwidth_trace_json), and `finish_time`, the end of work under such a factor."""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from pipeplan.core.errors import CostError
from pipeplan.core.hardware.links import Link, is_link
from pipeplan.core.limits import MAX_FACTOR, MIN_FACTOR, TRACE_STEPS


@dataclass(frozen=True, slots=True)
class TraceStep:
    """From `t_ms` on, `link` (an ordered device pair, or None for every link) runs at `factor` x nominal."""

    t_ms: float
    link: Link | None
    factor: float


@dataclass(frozen=True, slots=True)
class BandwidthTrace:
    """A list of steps in time order; at time t a link runs at the factor of the latest step at or before t that names
    it (or "all").

    The clock runs from the start of a run, across iterations (an iteration
    simulated from `offset_ms` on sees the trace from there). Steps with equal
    `t_ms` apply in list order (the later one wins). Before a link's first
    step its factor is 1.0.
    """

    steps: tuple[TraceStep, ...]
    _segments: dict[Link, tuple[tuple[float, ...], tuple[float, ...]]] = field(
        default_factory=dict, init=False, repr=False, compare=False, hash=False
    )
    _named: set[Link | bool | None] = field(default_factory=set, init=False, repr=False, compare=False, hash=False)
    _fastest: dict[Link, float] = field(default_factory=dict, init=False, repr=False, compare=False, hash=False)
    _rings: dict[tuple[tuple[Link, ...], bool], tuple[tuple[float, ...], tuple[float, ...]]] = field(
        default_factory=dict, init=False, repr=False, compare=False, hash=False
    )

    def __post_init__(self) -> None:
        TRACE_STEPS.check(CostError, "bandwidth trace", len(self.steps))
        previous = 0.0
        for i, step in enumerate(self.steps):
            check_step(i, step.t_ms, step.link, step.factor)
            if step.t_ms < previous:
                raise CostError(
                    f"bandwidth trace entry {i}: t_ms {step.t_ms!r} is before the previous entry's {previous!r} "
                    "(steps must be sorted by time)"
                )
            previous = step.t_ms

    def check_devices(self, count: int, what: str) -> None:
        """Raise CostError for the first step naming a device beyond `count` devices (`what` says whose, e.g. the cluster)."""
        for i, step in enumerate(self.steps):
            if step.link is not None and max(step.link) >= count:
                raise CostError(
                    f"bandwidth trace step {i}: link {list(step.link)} names device {max(step.link)}, but {what} has "
                    f"{count} devices (0..{count - 1})"
                )

    def _names(self) -> set[Link | bool | None]:
        """The links the steps name, None when a step names "all" (filled once)."""
        if not self._named:
            self._named.update(s.link for s in self.steps)
            self._named.add(False)  # marks the set as filled (an empty trace names nothing)
        return self._named

    def affects(self, link: Link) -> bool:
        """True when some step changes `link` (by name or through "all")."""
        named = self._names()
        return None in named or link in named

    def representatives(self, links: Iterable[Link]) -> tuple[Link, ...]:
        """The links of `links` that some step changes, each once, and of those that only "all" steps change, the
        first alone: they all run at the same factors at every moment (so a ring of thousands of devices under a
        trace of "all" steps reads one link's segments, not thousands)."""
        named = self._names()
        everything = None in named
        out: dict[Link, None] = {}
        unnamed = False
        for link in links:
            if link in named:
                out[link] = None
            elif everything and not unnamed:
                out[link] = None
                unnamed = True
        return tuple(out)

    def ring_segments(self, links: tuple[Link, ...]) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
        """The factor a ring over `links` runs at, as breakpoints (segments' form): at every moment the smallest
        of its links' factors (a ring moves its data through every link in turn, so it runs at its slowest one),
        or None when no step changes any of them (the ring runs at its nominal rate). Cached per set of links."""
        reps = self.representatives(links)
        if not reps:
            return None
        named = self._names()
        capped = None not in named and len(reps) < len(links) and any(link not in named for link in links)
        key = (reps, capped)
        cached = self._rings.get(key)
        if cached is not None:
            return cached
        if len(reps) == 1 and not capped:
            ring = self.segments(reps[0])
        else:
            ring = _lower_envelope([self.segments(link) for link in reps], capped)
        self._rings[key] = ring
        return ring

    def ring_max_factor(self, links: tuple[Link, ...]) -> float:
        """The largest factor the ring over `links` ever runs at (ring_segments; 1.0 when no step changes its links):
        its all-reduce's work divided by this is a lower bound on the work's time under the trace."""
        ring = self.ring_segments(links)
        return 1.0 if ring is None else max(ring[1])

    def segments(self, link: Link) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """The factor of `link` as breakpoints: (times, factors), factor[i] holding from times[i] until times[i+1].

        times[0] is 0.0; the factor before any step is 1.0. Computed once per link (a trace is immutable).
        """
        cached = self._segments.get(link)
        if cached is not None:
            return cached
        times = [0.0]
        factors = [1.0]
        for step in self.steps:
            if step.link is not None and step.link != link:
                continue
            if step.t_ms == times[-1]:
                factors[-1] = step.factor
            else:
                times.append(step.t_ms)
                factors.append(step.factor)
        segments = (tuple(times), tuple(factors))
        self._segments[link] = segments
        return segments

    def factor_at(self, link: Link, t_ms: float) -> float:
        """The multiplier of `link` at time `t_ms`."""
        times, factors = self.segments(link)
        return factors[bisect_right(times, t_ms) - 1] if t_ms >= 0 else 1.0

    def max_factor(self, link: Link) -> float:
        """The largest multiplier `link` ever runs at (for lower bounds; computed once per link: every simulation's
        bound asks, and a trace may hold a million steps)."""
        fastest = self._fastest.get(link)
        if fastest is None:
            fastest = self._fastest[link] = max(self.segments(link)[1])
        return fastest

    def min_factor(self, link: Link) -> float:
        """The smallest multiplier `link` ever runs at (1.0 when no step slows it)."""
        return min(self.segments(link)[1])

    def changes(self, links: Iterable[Link]) -> tuple[float, ...]:
        """The times (ascending, each once) at which the factor of one of `links` changes value: between two of
        them every one of these links runs at a constant factor. A step that repeats a link's factor is no change."""
        times: set[float] = set()
        for link in links:
            at, factors = self.segments(link)
            times.update(at[i] for i in range(1, len(at)) if factors[i] != factors[i - 1])
        return tuple(sorted(times))

    def shifted(self, offset_ms: float) -> BandwidthTrace:
        """The trace as seen from time `offset_ms` (which becomes 0): for simulating a later iteration.

        Steps at or before the offset all move to t=0, keeping their order, so the
        latest of them still wins.
        """
        return BandwidthTrace(tuple(TraceStep(max(0.0, s.t_ms - offset_ms), s.link, s.factor) for s in self.steps))

    def links(self) -> tuple[Link, ...]:
        """The ordered device pairs the steps name (not "all"), in first-named order."""
        return tuple(dict.fromkeys(s.link for s in self.steps if s.link is not None))

    @property
    def end_ms(self) -> float:
        """The time of the last step (0.0 for an empty trace): after it every factor holds forever."""
        return self.steps[-1].t_ms if self.steps else 0.0


def _lower_envelope(
    series: list[tuple[tuple[float, ...], tuple[float, ...]]], capped: bool
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The pointwise minimum of piecewise-constant factor series (each from t = 0), with 1.0 too when `capped`
    (a link of the ring that no step changes); consecutive equal factors merged."""
    times = np.unique(np.concatenate([np.asarray(t, dtype=np.float64) for t, _ in series]))
    low = np.full(len(times), 1.0 if capped else np.inf)
    for at, factors in series:
        index = np.searchsorted(np.asarray(at, dtype=np.float64), times, side="right") - 1
        low = np.minimum(low, np.asarray(factors, dtype=np.float64)[index])
    keep = np.ones(len(times), dtype=bool)
    keep[1:] = low[1:] != low[:-1]
    return tuple(times[keep].tolist()), tuple(low[keep].tolist())


def finish_time(times: tuple[float, ...], factors: tuple[float, ...], start_ms: float, work_ms: float) -> float:
    """When `work_ms` of nominal-rate work started at `start_ms` ends under the piecewise factor (exact integral)."""
    if work_ms <= 0:
        return start_ms
    i = bisect_right(times, start_ms) - 1
    t = start_ms
    remaining = work_ms
    last = len(times) - 1
    while True:
        factor = factors[i]
        end_of_segment = times[i + 1] if i < last else math.inf
        capacity = (end_of_segment - t) * factor
        if capacity >= remaining:
            return t + remaining / factor
        remaining -= capacity
        t = end_of_segment
        i += 1


def check_step(i: int, t_ms: object, link: object, factor: object) -> None:
    """Raise CostError naming bandwidth trace entry `i` when its t_ms, link or factor is bad (the reader and the value
    both check)."""
    if (  # the common case in one expression: a trace at the step limit is checked twice per step (reader, value)
        type(t_ms) is float
        and type(factor) is float
        and 0.0 <= t_ms < math.inf
        and MIN_FACTOR.value <= factor <= MAX_FACTOR.value
        and (
            link is None
            or (
                type(link) is tuple
                and len(link) == 2
                and type(link[0]) is int
                and type(link[1]) is int
                and 0 <= link[0] != link[1] >= 0
            )
        )
    ):
        return
    where = f"bandwidth trace entry {i}"
    if isinstance(t_ms, bool) or not isinstance(t_ms, (int, float)) or not math.isfinite(t_ms) or t_ms < 0:
        raise CostError(f"{where}: t_ms must be a finite number >= 0, got {t_ms!r}")
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not math.isfinite(factor) or factor <= 0:
        raise CostError(f"{where}: factor must be a finite number > 0, got {factor!r}")
    MIN_FACTOR.check(CostError, f"{where}: factor", factor)
    MAX_FACTOR.check(CostError, f"{where}: factor", factor)
    if link is not None and not is_link(link):
        raise CostError(f'{where}: link must be "all" or two different device ids [a, b], got {link!r}')
