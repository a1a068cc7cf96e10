"""Estimates from measurements: each link's effective bandwidth and each stage's compute, smoothed over iterations."""

from __future__ import annotations

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
    by_link: dict[Link, list[Transfer]] = {}
    for t in transfers:
        by_link.setdefault(t.link, []).append(t)
    samples: list[Sample] = []
    for link, items in by_link.items():
        latency = pipeline.latency_ms(link) if link in pipeline.flows else 0.0
        free = -float("inf")
        for t in sorted(items, key=lambda t: (t.start_ms, t.end_ms)):
            nominal = pipeline.nominal_ms(link, t.nbytes)
            start = max(t.start_ms, free)
            free = max(free, t.end_ms)
            measured = t.end_ms - start - latency
            if nominal > 0 and measured > 0:
                samples.append((link, nominal, measured, t.end_ms))
    return samples


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
        decay = 2.0 ** (-1.0 / self.half_life)
        for link in self._nominal:
            self._nominal[link] *= decay
            self._measured[link] *= decay
        for link, nominal, measured, t_end in samples:
            age = max(0.0, (end_ms - t_end) / iteration_ms)
            weight = 2.0 ** (-age / self.half_life)
            self._nominal[link] = self._nominal.get(link, 0.0) + weight * nominal
            self._measured[link] = self._measured.get(link, 0.0) + weight * measured

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
