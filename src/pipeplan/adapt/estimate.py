"""Estimates from measurements: each link's effective bandwidth and each stage's compute, smoothed over iterations."""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import groupby
from operator import attrgetter, itemgetter

from pipeplan.adapt.observation import Collective, Link, Transfer
from pipeplan.adapt.pipeline import PipelineModel
from pipeplan.core.errors import AdaptError

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
    append = samples.append
    on_link: dict[Link, list[Transfer]] = {}  # each link's transfers in the given order: sorted by link, then by time
    for t in transfers:
        queue = on_link.get(t.link)
        if queue is None:
            on_link[t.link] = [t]
        else:
            queue.append(t)
    for link in sorted(on_link):
        if link not in rates:
            pipeline.nominal_ms(link, 0.0)  # raises, naming the pipeline's links
        per_byte, latency = rates[link]
        free = -math.inf
        for t in sorted(on_link[link], key=_TIMES):  # stable, as one sort by (link, start, end) is
            end = t.end_ms
            start = t.start_ms if t.start_ms > free else free
            if end > free:
                free = end
            measured = end - start - latency
            nominal = t.nbytes * per_byte
            if nominal > 0 and measured > 0:
                append((link, nominal, measured, end))
    return samples


def collective_samples(pipeline: PipelineModel, collectives: Sequence[Collective]) -> list[Sample]:
    """Each measured all-reduce as a rate of its ring: nominal work ms against measured ms less its latency,
    given to every link of the stage's ring that no transfer of the pipeline uses.

    A ring runs at its slowest link, so a collective tells the ring's rate, not which link held it: a link a
    transfer also crosses keeps the transfers' estimate (per link). A collective whose time does not exceed its
    latency, or of a stage without a ring or work, gives no sample.

    Raises:
        AdaptError: a collective of a stage the pipeline does not have.
    """
    stages = pipeline.costs.stages
    samples: list[Sample] = []
    for c in collectives:
        if c.stage >= len(stages):
            raise AdaptError(f"collective of stage {c.stage}, but the pipeline has stages 0..{len(stages) - 1}")
        cost = stages[c.stage]
        nominal = cost.allreduce_work_ms
        measured = c.end_ms - c.start_ms - cost.allreduce_latency_ms
        if nominal > 0 and measured > 0:
            samples.extend((link, nominal, measured, c.end_ms) for link in cost.allreduce_links if link not in pipeline.flows)
    return samples


_LINK = itemgetter(0)
"""A sample's link (wire_samples gives each link's samples in one run)."""

_TIMES = attrgetter("start_ms", "end_ms")
"""A transfer's place among its link's in wire_samples' reading order: by start, then end."""


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
        for link, run in groupby(samples, key=_LINK):  # a link's samples in their order: the same sums, one lookup a run
            nominal_total = nominal_sum.get(link, 0.0)
            measured_total = measured_sum.get(link, 0.0)
            for _, nominal, measured, t_end in run:
                weight = exp(-(end_ms - t_end) * per_ms) if t_end < end_ms else 1.0
                nominal_total += weight * nominal
                measured_total += weight * measured
            nominal_sum[link] = nominal_total
            measured_sum[link] = measured_total

    @staticmethod
    def of(samples: Sequence[Sample]) -> dict[Link, float]:
        """Each link's factor over these samples alone, unweighted (what one iteration measured)."""
        nominal: dict[Link, float] = {}
        measured: dict[Link, float] = {}
        for link, run in groupby(samples, key=_LINK):
            nominal_total = nominal.get(link, 0.0)
            measured_total = measured.get(link, 0.0)
            for _, n, m, _ in run:
                nominal_total += n
                measured_total += m
            nominal[link] = nominal_total
            measured[link] = measured_total
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


class SegmentEstimator:
    """Each link's rate since its latest change point: a ratio of times over the newest run of consistent transfers.

    Transfers are read in order. One whose factor lies within `change_ratio`
    of the current segment's joins it; `confirm` consecutive ones that agree
    with each other but not with the segment start a new segment (a change
    point), and the old one is dropped; a lone deviating transfer (a transfer
    that straddled the change, or noise) is folded into the segment when the
    next one agrees with the segment again. Each iteration ages the segment by
    `half_life` (iterations), so a rate that drifts without a jump is tracked too.

    It also keeps what the dwell model (adapt.dwell) reads: `durations_ms`,
    every finished segment's duration on every link (from a link's first
    transfer or change point to its next change point; a change is dated at
    the end of its first deviating transfer), `age_ms()`, how long ago the
    latest change on any link began, and `previous_factors()`, each link's
    rate before its latest change (the network a short state returns to).
    """

    def __init__(self, change_ratio: float, half_life: float, confirm: int = 2) -> None:
        self._high = change_ratio  # a factor within [1 / change_ratio, change_ratio] of another agrees with it
        self._low = 1.0 / change_ratio
        self._decay = 2.0 ** (-1.0 / half_life)
        self._confirm = confirm
        self._segment: dict[Link, list[float]] = {}  # [nominal ms, measured ms] summed over the segment
        self._pending: dict[Link, list[float]] = {}  # [nominal, measured, count, first end ms] of unconfirmed deviants
        self._began_ms: dict[Link, float] = {}  # when each link's current segment began
        self._previous: dict[Link, float] = {}  # each link's factor over the segment before its current one
        self._now_ms = 0.0
        self.durations_ms: list[float] = []

    def add_iteration(self, samples: Sequence[Sample], end_ms: float, iteration_ms: float) -> None:
        """Age the segments by one iteration, then read this iteration's samples in order."""
        decay = self._decay
        for sums in self._segment.values():
            sums[0] *= decay
            sums[1] *= decay
        segments, pending, add = self._segment, self._pending, self._add
        high, low = self._high, self._low
        for sample in samples:
            link, nominal, measured, _ = sample
            segment = segments.get(link)  # the common case inline (_add's first test): agrees, nothing pending
            if (
                segment is not None
                and link not in pending
                and low * segment[0] * measured <= nominal * segment[1] <= high * segment[0] * measured
            ):
                segment[0] += nominal
                segment[1] += measured
                continue
            add(*sample)
        self._now_ms = max(self._now_ms, end_ms)

    def age_ms(self) -> float:
        """Time from the start of the newest segment on any link to the latest iteration's end (0: nothing seen)."""
        return max(0.0, self._now_ms - max(self._began_ms.values(), default=self._now_ms))

    @property
    def links(self) -> int:
        """Links measured so far."""
        return len(self._began_ms)

    def previous_factors(self) -> dict[Link, float]:
        """Each link's factor over the segment before its current one (its current factor before any change)."""
        return {**self.factors(), **self._previous}

    def _add(self, link: Link, nominal: float, measured: float, t_end: float) -> None:
        segment = self._segment.get(link)
        if segment is None:
            self._segment[link] = [nominal, measured]
            self._began_ms[link] = t_end
            return
        high, low = self._high, self._low  # ratio tests, no logarithm per transfer
        pending = self._pending.get(link)
        if low * segment[0] * measured <= nominal * segment[1] <= high * segment[0] * measured:
            if pending is not None:
                segment[0] += pending[0]
                segment[1] += pending[1]
                del self._pending[link]
            segment[0] += nominal
            segment[1] += measured
            return
        if pending is not None and low * pending[0] * measured <= nominal * pending[1] <= high * pending[0] * measured:
            pending[0] += nominal
            pending[1] += measured
            pending[2] += 1
            if pending[2] >= self._confirm:
                self._confirmed(link, pending)
            return
        if pending is not None:
            segment[0] += pending[0]
            segment[1] += pending[1]
        self._pending[link] = [nominal, measured, 1, t_end]

    def _confirmed(self, link: Link, pending: list[float]) -> None:
        """The deviating transfers become the link's segment: a change point, dated at the first one's end."""
        old = self._segment[link]
        if old[1] > 0:
            self._previous[link] = min(MAX_FACTOR, max(MIN_FACTOR, old[0] / old[1]))
        self._segment[link] = pending[:2]
        del self._pending[link]
        began = pending[3]
        self.durations_ms.append(max(0.0, began - self._began_ms[link]))
        self._began_ms[link] = began

    def factors(self) -> dict[Link, float]:
        """The factor of every link seen so far over its current segment."""
        return {
            link: min(MAX_FACTOR, max(MIN_FACTOR, nominal / measured))
            for link, (nominal, measured) in self._segment.items()
            if measured > 0
        }
