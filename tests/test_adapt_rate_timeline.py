"""adapt.rate_timeline: each link's measured rate within iterations, rebuilt from the spans and replayed as a trace."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from pipeplan.adapt.rate_timeline import RateTimeline

LINK = (0, 1)
OTHER = (1, 0)


def _flip_iteration() -> list[tuple[tuple[int, int], float, float, float]]:
    """Iteration [0, 100): 10 ms of nominal work at full rate ending at 20, at half rate ending at 60, full again ending
    at 90 (samples: link, nominal wire ms, measured wire ms, end ms)."""
    return [(LINK, 10.0, 10.0, 20.0), (LINK, 10.0, 20.0, 60.0), (LINK, 10.0, 10.0, 90.0)]


def test_the_rate_changes_half_way_through_each_gap() -> None:
    """Wire spans [10, 20] at 1, [40, 60] at 0.5, [80, 90] at 1: the first factor from the window's start, the change
    to 0.5 at (20 + 40) / 2 = 30 and back to 1 at (60 + 80) / 2 = 70."""
    timeline = RateTimeline(4)
    timeline.add_iteration(_flip_iteration(), 0.0, 100.0)
    assert timeline.steps() == {LINK: ((0.0, 1.0), (30.0, 0.5), (70.0, 1.0))}
    assert timeline.straddled(1.25) == 1
    assert timeline.straddled(2.5) == 0  # a change of 2x is not beyond 2.5x


def test_spans_within_the_merge_ratio_make_one_step_at_their_summed_ratio() -> None:
    """Factors 1.0 and 10/10.5 are within 1.1 of each other: one step at 20 / 20.5; 0.5 is not: a new one, at the
    gap's middle."""
    timeline = RateTimeline(4, merge_ratio=1.1)
    timeline.add_iteration([(LINK, 10.0, 10.0, 20.0), (LINK, 10.0, 10.5, 40.0), (LINK, 10.0, 20.0, 80.0)], 0.0, 100.0)
    assert timeline.steps() == {LINK: ((0.0, 20.0 / 20.5), (50.0, 0.5))}


def test_overlapping_spans_change_at_the_first_one_s_end() -> None:
    """A collective's span [15, 35] overlaps the transfer [10, 20]: its factor starts at 20."""
    timeline = RateTimeline(4)
    timeline.add_iteration([(LINK, 10.0, 10.0, 20.0), (LINK, 5.0, 20.0, 35.0)], 0.0, 50.0)
    assert timeline.steps() == {LINK: ((0.0, 1.0), (20.0, 0.25))}


def test_iterations_join_and_the_oldest_leaves_the_window() -> None:
    """A second iteration at full rate continues the last step; a third pushes the first out of a window of 2, so the
    timeline starts at the second's start (100) with its rate, and only the third iteration straddles a change."""
    timeline = RateTimeline(2)
    timeline.add_iteration(_flip_iteration(), 0.0, 100.0)
    timeline.add_iteration([(LINK, 10.0, 10.0, 150.0), (OTHER, 4.0, 4.0, 160.0)], 100.0, 200.0)
    assert timeline.steps() == {LINK: ((0.0, 1.0), (30.0, 0.5), (70.0, 1.0)), OTHER: ((0.0, 1.0),)}
    assert timeline.straddled(1.25) == 1
    timeline.add_iteration([(LINK, 10.0, 40.0, 250.0)], 200.0, 300.0)
    assert timeline.bounds() == ((100.0, 200.0), (200.0, 300.0))
    assert timeline.steps() == {LINK: ((100.0, 1.0), (180.0, 0.25)), OTHER: ((100.0, 1.0),)}
    assert timeline.straddled(1.25) == 1
    assert timeline.straddled(1.25, last=1) == 0  # the change at 180 lies in the second-last iteration
    assert timeline.straddled(1.25, last=2) == 1


def test_the_replay_is_the_window_from_zero_repeated() -> None:
    """Replayed twice: the window's length is 100 ms; at t and t + 100 every link runs at the factor the timeline held
    at the window's start + t."""
    timeline = RateTimeline(4)
    timeline.add_iteration(_flip_iteration(), 0.0, 100.0)
    trace, length = timeline.replay(2)
    assert length == 100.0
    for t, factor in ((0.0, 1.0), (29.9, 1.0), (30.0, 0.5), (69.9, 0.5), (70.0, 1.0), (99.9, 1.0)):
        assert trace.factor_at(LINK, t) == factor
        assert trace.factor_at(LINK, t + length) == factor
    assert trace.factor_at(LINK, 1e6) == 1.0  # after the last copy the last factor holds


def test_an_empty_timeline() -> None:
    timeline = RateTimeline(3)
    assert timeline.steps() == {} and timeline.bounds() == () and timeline.straddled(1.25) == 0
    assert timeline.span_ms() == (0.0, 0.0)


FACTORS = (1.0, 0.5, 0.25, 0.05)
"""Rates of the property test: any two differ by more than the merge ratio, so a step's factor is its first span's."""


def _straddled_from_steps(timeline: RateTimeline, ratio: float, last: int) -> int:
    """Reference: the held iterations (of the `last` newest) holding, strictly inside, a step of steps() (not the
    first) whose factor is off by more than `ratio` from the one before it."""
    tolerance = math.log(ratio)
    moments = []
    for series in timeline.steps().values():
        changes = zip(series[1:], series[:-1], strict=True)
        moments += [t for (t, f), (_, g) in changes if abs(math.log(f / g)) > tolerance]
    bounds = timeline.bounds()[-last:]
    return sum(any(start < t < end for t in moments) for start, end in bounds)


@given(
    st.lists(
        st.lists(st.tuples(st.sampled_from((LINK, OTHER)), st.sampled_from(FACTORS), st.floats(1.0, 20.0)), max_size=6),
        min_size=1,
        max_size=8,
    ),
    st.sampled_from((1.25, 3.0, 10.0)),
)
def test_the_incremental_straddle_count_is_the_steps_count(iterations: list, ratio: float) -> None:
    """Iterations of 100 ms, each holding spans one after another (link, factor, nominal ms): read after every
    iteration, the incremental count of straddled iterations (each read once) equals the count of the moments of
    steps() rebuilt from scratch, for the whole window and for the last one and two iterations."""
    timeline = RateTimeline(len(iterations), merge_ratio=1.03)
    for index, spans in enumerate(iterations):
        start = 100.0 * index
        t = start
        samples = []
        for link, factor, nominal in spans:
            measured = min(nominal / factor, (start + 99.0 - t) / 2.0)
            if measured <= 0.0:
                break
            t += 2.0 * measured  # a gap as long as the span after it
            samples.append((link, measured * factor, measured, t))
        timeline.add_iteration(samples, start, start + 100.0)
        for last in (1, 2, index + 1):
            assert timeline.straddled(ratio, last) == _straddled_from_steps(timeline, ratio, last)


def test_iterations_that_left_the_window_unread_start_the_links_afresh() -> None:
    """Read only after the first iteration dropped out of a window of 1: the change at 30 and 70 is gone, and the
    second iteration's first span is not counted as a change from the first's last."""
    timeline = RateTimeline(1)
    timeline.add_iteration(_flip_iteration(), 0.0, 100.0)
    timeline.add_iteration([(LINK, 10.0, 40.0, 150.0)], 100.0, 200.0)
    assert timeline.straddled(1.25) == 0
    timeline.add_iteration([(LINK, 10.0, 10.0, 250.0)], 200.0, 300.0)
    assert timeline.straddled(1.25) == 0  # the change lies at (150 + 240) / 2 = 195, in the iteration that left
