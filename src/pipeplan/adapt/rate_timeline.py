"""The measured rate of each link over the last few iterations, within iterations: a piecewise-constant timeline
rebuilt from the transfers' spans, replayed as a bandwidth trace to price k under the network's recent process."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from itertools import groupby
from operator import itemgetter

from pipeplan.adapt.estimate import MAX_FACTOR, MIN_FACTOR, Sample
from pipeplan.adapt.observation import Link
from pipeplan.core.hardware.bandwidth_trace import BandwidthTrace, TraceStep

Steps = tuple[tuple[float, float], ...]
"""A link's timeline: (from ms, factor) in time order, each factor holding until the next one's time."""


class RateTimeline:
    """Each link's measured rate over the last `window` iterations, as it moved within them.

    Every sample (a transfer's or a collective's span: nominal wire ms, measured wire ms, end ms) says that its link
    ran at factor = nominal / measured over its wire time [end - measured, end]. Between two samples of a link the
    rate is not seen: it is taken to change half-way through the gap (at the first sample's end when they overlap).
    Before a link's first sample in the window its first factor holds from the window's start; after the last, the
    last one to the window's end. Only ended iterations are held, so a timeline never looks ahead.
    """

    def __init__(self, window: int, merge_ratio: float = 1.0) -> None:
        self.window = window
        self._merge = math.log(merge_ratio)
        self._iterations: deque[list] = deque(maxlen=window)  # [start, end, samples, their runs or None, change] each
        self._steps: dict[Link, Steps] | None = None
        self._added = 0  # iterations ever added
        self._scanned = 0  # of those, how many straddled() has read (its bookkeeping is incremental)
        self._carry: dict[Link, list[float]] = {}  # each link's latest run [first start, nominal, measured, last end]

    def add_iteration(self, samples: Sequence[Sample], start_ms: float, end_ms: float) -> None:
        """Keep one ended iteration's samples (its start and end on the transfers' clock); the oldest beyond the
        window is dropped. Nothing is computed until steps() asks (most networks never need it)."""
        self._iterations.append([start_ms, end_ms, samples, None, 0.0])
        self._added += 1
        self._steps = None

    def _by_link(self, held: list) -> dict[Link, list[list[float]]]:
        """The held iteration's runs per link (computed once): [first start, nominal, measured, last end] of
        consecutive samples (by end) within merge_ratio of their run's factor, in time order."""
        if held[3] is None:
            by_link: dict[Link, list[Sample]] = {}
            for link, group in groupby(held[2], key=_LINK):  # the transfers' samples come grouped by link
                found = by_link.get(link)
                if found is None:
                    by_link[link] = list(group)
                else:
                    found.extend(group)
            held[3] = {link: self._runs(samples) for link, samples in by_link.items()}
            held[2] = ()
        return held[3]

    def _runs(self, samples: list[Sample]) -> list[list[float]]:
        """One iteration's samples of one link as runs (_by_link), a sample joining the run before it when its factor
        lies within merge_ratio of the run's (a ratio test: no logarithm per sample)."""
        samples.sort(key=_END)
        high = math.exp(self._merge)
        low = 1.0 / high
        runs: list[list[float]] = []
        first = nominal_sum = measured_sum = last = 0.0
        for _, nominal, measured, end in samples:
            if runs and low * nominal_sum * measured <= nominal * measured_sum <= high * nominal_sum * measured:
                nominal_sum += nominal
                measured_sum += measured
                last = end
                continue
            if runs:
                runs[-1] = [first, nominal_sum, measured_sum, last]
            first, nominal_sum, measured_sum, last = end - measured, nominal, measured, end
            runs.append([])
        if runs:
            runs[-1] = [first, nominal_sum, measured_sum, last]
        return runs

    def span_ms(self) -> tuple[float, float]:
        """The window's (start, end) on the transfers' clock ((0, 0) when empty)."""
        if not self._iterations:
            return (0.0, 0.0)
        return (self._iterations[0][0], self._iterations[-1][1])

    def bounds(self) -> tuple[tuple[float, float], ...]:
        """Each held iteration's (start, end), oldest first."""
        return tuple((held[0], held[1]) for held in self._iterations)

    def steps(self) -> dict[Link, Steps]:
        """Each link's piecewise-constant factor over the window (class docstring), the first step at the window's
        start. Consecutive samples whose factors lie within `merge_ratio` of their run's make one step, at the run's
        factor (its nominal wire ms over its measured wire ms); a sample off by more starts the next step."""
        if self._steps is not None:
            return self._steps
        begin, _ = self.span_ms()
        merge = self._merge
        joined: dict[Link, list[list[float]]] = {}
        for held in self._iterations:
            for link, runs in self._by_link(held).items():
                out = joined.setdefault(link, [])
                for first, nominal, measured, last in runs:
                    if out:
                        run = out[-1]
                        if abs(math.log(nominal / measured * run[2] / run[1])) <= merge:
                            run[1] += nominal
                            run[2] += measured
                            run[3] = last
                            continue
                        at = (run[3] + max(run[3], first)) / 2.0
                    else:
                        at = begin
                    out.append([at, nominal, measured, last])
        self._steps = {
            link: tuple((at, min(MAX_FACTOR, max(MIN_FACTOR, n / m))) for at, n, m, _ in runs) for link, runs in joined.items()
        }
        return self._steps

    def straddled(self, change_ratio: float, last: int | None = None) -> int:
        """How many held iterations (of the `last` newest; all by default) saw some link's rate change by more than
        `change_ratio` inside them: a change between two consecutive runs of a link's samples (runs as in steps(),
        one iteration's runs joined to the link's run before them, which may lie before the window), placed
        half-way through the gap between the runs (as in steps()) strictly inside the iteration.

        Incremental: each iteration is read once, the first time a call finds it held (amortised O(its samples)),
        and keeps the largest |log| factor ratio of the changes inside it; a call then costs O(window)."""
        self._scan()
        tolerance = math.log(change_ratio)
        held = list(self._iterations)
        if last is not None:
            held = held[len(held) - last :]
        return sum(entry[4] > tolerance for entry in held)

    def _scan(self) -> None:
        """Read the iterations added since the last call: each run's change from the link's run before it, dated
        half-way through their gap and kept (as its |log| ratio) by the held iteration that holds the date."""
        held = self._iterations
        first = self._added - len(held)
        if self._scanned < first:  # iterations left the window unread: the links' runs before them are unknown
            self._carry = {}
            self._scanned = first
        merge = self._merge
        carry = self._carry
        for index in range(self._scanned - first, len(held)):
            for link, runs in self._by_link(held[index]).items():
                before = carry.get(link)
                for run in runs:
                    if before is not None:
                        jump = abs(math.log(run[1] / run[2] * before[2] / before[1]))
                        if jump <= merge:  # only the run that continues the link's last one can merge with it
                            before = [before[0], before[1] + run[1], before[2] + run[2], run[3]]
                            continue
                        self._date(((before[3] + max(before[3], run[0])) / 2.0), jump, index)
                    before = list(run)
                carry[link] = before  # type: ignore[assignment]
        self._scanned = self._added

    def _date(self, at: float, jump: float, newest: int) -> None:
        """Keep `jump` on the held iteration (at or before position `newest`) that holds `at` strictly inside it."""
        held = self._iterations
        for index in range(newest, -1, -1):
            start, end = held[index][0], held[index][1]
            if end <= at:
                return
            if start < at:
                held[index][4] = max(held[index][4], jump)
                return

    def replay(self, copies: int) -> tuple[BandwidthTrace, float]:
        """The window's timeline as a trace from 0, repeated `copies` times back to back (a later phase of the same
        process), and the window's length: simulating from offset o in [0, length) sees the window from o on."""
        begin, end = self.span_ms()
        length = end - begin
        timeline = self.steps()
        steps = [
            TraceStep(c * length + (t - begin), link, float(f))
            for c in range(copies)
            for link, series in timeline.items()
            for t, f in series
        ]
        steps.sort(key=lambda s: s.t_ms)
        return BandwidthTrace(tuple(steps)), length


_LINK = itemgetter(0)
_END = itemgetter(3)
