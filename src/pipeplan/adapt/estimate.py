"""Estimates from measurements: each link's effective bandwidth and each stage's compute, smoothed over iterations."""

from __future__ import annotations

import math
from collections.abc import Sequence

from pipeplan.adapt.observation import Link, Transfer
from pipeplan.adapt.pipeline import PipelineModel

Sample = tuple[Link, float, float, float]
"""(link, wire ms at the nominal rate, measured wire ms, end ms) of one transfer."""

MIN_FACTOR = 1e-3
MAX_FACTOR = 1e3
"""Bounds on an estimated factor: a transfer that measured (almost) no wire time says little about the rate."""


def wire_samples(pipeline: PipelineModel, transfers: Sequence[Transfer]) -> list[Sample]:
    """Each transfer's wire time measured against its nominal wire time, latency taken off.

    Transfers on one link queue first-come first-served, so a transfer handed
    over while an earlier one still held the link starts on the wire when
    that one ends. A transfer whose measured time does not exceed the link's
    latency, or that moves no bytes, gives no sample.

    Raises:
        AdaptError: a transfer on a link no stage boundary of the pipeline uses.
    """
    rates = pipeline.wire_rates
    samples: list[Sample] = []
    link: Link | None = None
    per_byte = latency = free = 0.0
    for t in sorted(transfers, key=_order):
        if t.link != link:
            link = t.link
            if link not in rates:
                pipeline.nominal_ms(link, 0.0)  # raises, naming the pipeline's links
            per_byte, latency = rates[link]
            free = -math.inf
        start = t.start_ms if t.start_ms > free else free
        if t.end_ms > free:
            free = t.end_ms
        measured = t.end_ms - start - latency
        nominal = t.nbytes * per_byte
        if nominal > 0 and measured > 0:
            samples.append((link, nominal, measured, t.end_ms))
    return samples


def _order(t: Transfer) -> tuple[Link, float, float]:
    return (t.link, t.start_ms, t.end_ms)


class LinkEstimator:
    """Each link's effective rate as a factor of its nominal rate, over transfers weighted by their age.

    factor = sum(w * nominal wire ms) / sum(w * measured wire ms), w =
    2^(-age / half_life) with age in iterations before the end of the latest
    iteration: the rate the link moved bytes at lately, as a ratio of times,
    so a slow transfer weighs by how long it held the link.
    """

    def __init__(self, half_life: float) -> None:
        self.half_life = half_life
        self._nominal: dict[Link, float] = {}
        self._measured: dict[Link, float] = {}

    def add_iteration(self, samples: Sequence[Sample], end_ms: float, iteration_ms: float) -> None:
        """Age what was seen by one iteration, then add this iteration's samples (ending at end_ms)."""
        rate = math.log(2.0) / self.half_life
        decay = math.exp(-rate)
        nominal_sum, measured_sum = self._nominal, self._measured
        for link in nominal_sum:
            nominal_sum[link] *= decay
            measured_sum[link] *= decay
        per_ms = rate / iteration_ms
        exp = math.exp
        for link, nominal, measured, t_end in samples:
            weight = exp(-(end_ms - t_end) * per_ms) if t_end < end_ms else 1.0
            nominal_sum[link] = nominal_sum.get(link, 0.0) + weight * nominal
            measured_sum[link] = measured_sum.get(link, 0.0) + weight * measured

    @staticmethod
    def of(samples: Sequence[Sample]) -> dict[Link, float]:
        """Each link's factor over these samples alone, unweighted (what one iteration measured)."""
        nominal: dict[Link, float] = {}
        measured: dict[Link, float] = {}
        for link, n, m, _ in samples:
            nominal[link] = nominal.get(link, 0.0) + n
            measured[link] = measured.get(link, 0.0) + m
        return {link: min(MAX_FACTOR, max(MIN_FACTOR, nominal[link] / m)) for link, m in measured.items()}

    def factors(self) -> dict[Link, float]:
        """The current factor of every link seen so far (links never seen are absent: nominal)."""
        return {
            link: min(MAX_FACTOR, max(MIN_FACTOR, self._nominal[link] / measured))
            for link, measured in self._measured.items()
            if measured > 0
        }


class ComputeEstimator:
    """Per-stage forward and backward ms, each an exponential average over iterations with the given half-life."""

    def __init__(self, fwd_ms: Sequence[float], bwd_ms: Sequence[float], half_life: float) -> None:
        self.fwd_ms = list(fwd_ms)
        self.bwd_ms = list(bwd_ms)
        self.measured = False
        self._alpha = 1.0 - 2.0 ** (-1.0 / half_life)

    def add_iteration(self, fwd_ms: Sequence[float], bwd_ms: Sequence[float]) -> None:
        """Blend in one iteration's per-stage means (the first measurement replaces the model's numbers)."""
        if not fwd_ms:
            return
        a = 1.0 if not self.measured else self._alpha
        self.fwd_ms = [(1 - a) * old + a * new for old, new in zip(self.fwd_ms, fwd_ms, strict=True)]
        self.bwd_ms = [(1 - a) * old + a * new for old, new in zip(self.bwd_ms, bwd_ms, strict=True)]
        self.measured = True
