"""adapt.estimate's view "now" (SegmentEstimator) and the guide that orders a decision's search (adapt.predict)."""

from __future__ import annotations

import math
import random

import pytest

from adapt_cases import numbers
from pipeplan.adapt import AdaptiveController, Collective, ControllerConfig, IterationObservation, PipelineModel, Transfer
from pipeplan.adapt.estimate import LinkEstimator, SegmentEstimator, collective_samples, wire_samples
from pipeplan.adapt.predict import Predictor, fitting_ks
from pipeplan.core.errors import AdaptError

LINK = (0, 1)


def _feed(estimator: SegmentEstimator, factors: list[float], nominal: float = 1.0) -> None:
    """One iteration of transfers on LINK, each `nominal` ms at the nominal rate, measured at these factors in order."""
    estimator.add_iteration([(LINK, nominal, nominal / f, float(i)) for i, f in enumerate(factors)], 10.0, 10.0)


def test_segment_reads_a_constant_rate_exactly() -> None:
    """Transfers at a constant factor give that factor, whatever their sizes."""
    estimator = SegmentEstimator(1.25, 2.0, 2)
    estimator.add_iteration([(LINK, n, n / 0.5, 0.0) for n in (1.0, 3.0, 0.5)], 10.0, 10.0)
    assert estimator.factors() == {LINK: pytest.approx(0.5)}


def test_a_confirmed_step_drops_what_came_before() -> None:
    """At 0.5, then 0.25: one slow transfer is pending (still 0.5), the second confirms the change (exactly 0.25)."""
    estimator = SegmentEstimator(1.25, 2.0, 2)
    _feed(estimator, [0.5, 0.5, 0.5])
    _feed(estimator, [0.25])
    assert estimator.factors()[LINK] == pytest.approx(0.5)
    _feed(estimator, [0.25])
    assert estimator.factors()[LINK] == pytest.approx(0.25)


def test_a_lone_outlier_is_folded_back_into_the_segment() -> None:
    """0.5, 0.5, then one at 1.0 and back to 0.5: the segment keeps every transfer, (1+1+1+1) / (2+2+1+2) = 4/7."""
    estimator = SegmentEstimator(1.25, 1e9, 2)  # no ageing: the closed form holds exactly
    _feed(estimator, [0.5, 0.5, 1.0, 0.5])
    assert estimator.factors()[LINK] == pytest.approx(4 / 7)


def test_a_segment_ages_with_its_half_life() -> None:
    """A factor drifting within the change ratio is followed: an old iteration weighs half after one half-life."""
    estimator = SegmentEstimator(1.25, 1.0, 2)
    _feed(estimator, [1.0])  # nominal 1, measured 1; aged once below: weight 1/2
    _feed(estimator, [0.9])  # nominal 1, measured 1/0.9
    assert estimator.factors()[LINK] == pytest.approx((0.5 + 1.0) / (0.5 + 1 / 0.9))


def test_guide_ranks_the_candidates_by_their_simulated_time_at_the_slowest_link() -> None:
    """At a guide factor the ranking is the simulated order of T(k) there; above nominal it is the nominal order."""
    pipeline = PipelineModel.from_measurements(**numbers(p=4, m=16))
    schedules, _ = fitting_ks(pipeline)
    predictor = Predictor(pipeline, schedules)
    predictor.seed_guide((0.25,))
    slow = dict.fromkeys(pipeline.links, 0.25)
    times = {k: predictor.time(k, slow) for k in schedules}
    assert predictor.ranked({pipeline.links[0]: 0.25, pipeline.links[1]: 0.9}) == sorted(times, key=lambda k: (times[k], k))
    nominal = {k: predictor.time(k, {}) for k in schedules}
    assert predictor.ranked({pipeline.links[0]: 1.5}) == sorted(nominal, key=lambda k: (nominal[k], k))
    assert predictor.ranked({})[0] == 2  # T(2) = 63 ms is the fastest at nominal bandwidth (issue 20)


def test_change_points_give_the_durations_the_age_and_the_rate_before() -> None:
    """A link at 0.5, then 0.25 from the transfer ending at 13 ms, then 0.5 again from 27 ms: two finished segments
    (10 ms from its first transfer at 3 ms to 13 ms, then 14 ms), the current one 3 ms old at the iteration's 30 ms end,
    and the rate before the latest change 0.25."""
    estimator = SegmentEstimator(1.25, 2.0, 2)
    rates = [0.5] * 5 + [0.25] * 7 + [0.5] * 2
    estimator.add_iteration([(LINK, 1.0, 1.0 / f, 3.0 + 2 * i) for i, f in enumerate(rates)], 30.0, 30.0)
    assert estimator.durations_ms == [10.0, 14.0]
    assert estimator.age_ms() == 3.0 and estimator.links == 1
    assert estimator.previous_factors() == {LINK: pytest.approx(0.25)} and estimator.factors() == {LINK: pytest.approx(0.5)}


def test_a_lone_outlier_is_no_change_point() -> None:
    """One deviating transfer folded back into the segment leaves no duration; the previous rate is the current one."""
    estimator = SegmentEstimator(1.25, 2.0, 2)
    _feed(estimator, [0.5, 0.5, 0.1, 0.5, 0.5])
    assert estimator.durations_ms == [] and estimator.previous_factors() == estimator.factors()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("change_ratio", 1.0),
        ("confirm", 0),
        ("dwell_prior", 0.0),
        ("memory_ratio", -1.0),
        ("memory_gain", float("nan")),
        ("segment_half_life", 0.0),
        ("guide_factors", (0.0,)),
    ],
)
def test_bad_estimate_constants_raise_naming_the_field(field: str, value: object) -> None:
    """Each new constant is checked at construction, and the error names it."""
    with pytest.raises(AdaptError, match=field):
        ControllerConfig(**{field: value})  # type: ignore[arg-type]


def test_a_collective_estimates_its_rings_links_that_no_transfer_uses() -> None:
    """factor = nominal work / (measured - latency), given to each ring link no transfer crosses: stage 0's ring
    (0,5),(5,0) takes 0.5; stage 1's ring links (1,0),(0,1) are the boundary's, so they keep the transfers'
    estimate and its collective gives no sample; a stage out of range is refused."""
    base = numbers(p=2, m=4)
    pipeline = PipelineModel.from_measurements(
        **base, allreduce_ms=[5.0, 3.0], allreduce_latency_ms=[1.0, 0.5], ring_links=[((0, 5), (5, 0)), ((1, 0), (0, 1))]
    )
    samples = collective_samples(pipeline, [Collective(0, 10.0, 10.0 + 1.0 + 4.0 / 0.5), Collective(1, 0.0, 20.0)])
    assert samples == [((0, 5), 4.0, 8.0, 19.0), ((5, 0), 4.0, 8.0, 19.0)]
    assert collective_samples(pipeline, [Collective(0, 10.0, 10.5)]) == []  # within its latency: says nothing
    with pytest.raises(AdaptError, match=r"collective of stage 2, but the pipeline has stages 0\.\.1"):
        collective_samples(pipeline, [Collective(2, 0.0, 1.0)])
    controller = AdaptiveController(pipeline)
    controller.observe(IterationObservation(0, 1, 30.0, collectives=(Collective(0, 10.0, 19.0),)))
    assert controller.views["now"].factors() == {(0, 5): pytest.approx(0.5), (5, 0): pytest.approx(0.5)}


def _wire_reference(pipeline: PipelineModel, transfers: list[Transfer]) -> list[tuple]:
    """wire_samples by a plain loop: links in order, each link's transfers by (start, end), first-come first-served."""
    out = []
    for link in sorted({t.link for t in transfers}):
        per_byte, latency = pipeline.wire_rates[link]
        free = -math.inf
        for t in sorted((t for t in transfers if t.link == link), key=lambda t: (t.start_ms, t.end_ms)):
            start = max(t.start_ms, free)
            free = max(free, t.end_ms)
            if t.nbytes * per_byte > 0 and t.end_ms - start - latency > 0:
                out.append((link, t.nbytes * per_byte, t.end_ms - start - latency, t.end_ms))
    return out


def test_wire_samples_of_shuffled_links_and_the_link_estimate_of_interleaved_samples() -> None:
    """Transfers of three links in shuffled order, some queued, some tied: the samples of a plain loop, in its order;
    LinkEstimator's sums over interleaved links' samples are a plain loop's, to the bit."""
    pipeline = PipelineModel.from_measurements(**numbers(p=4, m=8))
    rng = random.Random(5)
    transfers = [
        Transfer(link, rng.choice([0.0, 1e6, 2e6]), start, start + rng.uniform(0.5, 4.0))
        for link in ((0, 1), (1, 2), (2, 3))
        for start in (rng.choice([0.0, 1.0, 2.5, 2.5, 7.0]) for _ in range(12))
    ]
    rng.shuffle(transfers)
    samples = wire_samples(pipeline, transfers)
    assert samples == _wire_reference(pipeline, transfers)
    rng.shuffle(samples)  # links interleaved, as collectives' samples after transfers' may be
    estimator = LinkEstimator(half_life=2.0)
    estimator.add_iteration(samples, 20.0, 10.0)
    per_ms = math.log(2.0) / 2.0 / 10.0
    sums: dict[tuple[int, int], list[float]] = {}
    for link, nominal, measured, end in samples:
        weight = math.exp(-(20.0 - end) * per_ms) if end < 20.0 else 1.0
        acc = sums.setdefault(link, [0.0, 0.0])
        acc[0] += weight * nominal
        acc[1] += weight * measured
    assert estimator.factors() == {link: n / m for link, (n, m) in sums.items()}
    measured = {link: [0.0, 0.0] for link in sums}
    for link, nominal, wire, _ in samples:
        measured[link][0] += nominal
        measured[link][1] += wire
    assert LinkEstimator.of(samples) == {link: n / m for link, (n, m) in measured.items()}
