"""adapt.dwell: the expected remaining time of the network's current state (mean residual life with a prior)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeplan.adapt.dwell import expected_dwell_ms


def test_states_of_one_to_two_units_leave_half_a_unit_after_one() -> None:
    """Durations 1, 1.5, 2 and a state 1 old: (0.5 + 1) / 2 more (the one of length 1 has ended); no prior weight."""
    assert expected_dwell_ms([1.0, 1.5, 2.0], 1.0, 8.0, 0.0) == pytest.approx(0.75)


def test_the_prior_counts_as_states_of_its_length() -> None:
    """Before any change point: the prior less the age; with durations, the prior weighs `prior_weight` of them."""
    assert expected_dwell_ms([], 3.0, 8.0, 2.0) == pytest.approx(5.0)
    assert expected_dwell_ms([4.0, 6.0], 2.0, 8.0, 2.0) == pytest.approx((2 * 6.0 + 2.0 + 4.0) / 4)


def test_a_state_older_than_all_seen_is_expected_to_last_as_long_again() -> None:
    """No duration and no prior exceed the age: R = age."""
    assert expected_dwell_ms([1.0, 2.0], 5.0, 3.0, 1.0) == 5.0


@given(
    st.lists(st.floats(0.0, 1e4), max_size=20),
    st.floats(0.0, 1e4),
    st.floats(0.0, 1e4),
    st.floats(0.0, 10.0),
)
def test_the_dwell_matches_a_brute_force_mean_over_the_longer_states(
    durations: list[float], age: float, prior: float, weight: float
) -> None:
    """Equals the weighted mean of L - age over the states longer than the age (the prior as `weight` states), else age."""
    states = [(length, 1.0) for length in durations] + [(prior, weight)]
    longer = [(length - age, w) for length, w in states if length > age and w > 0]
    total = sum(w for _, w in longer)
    expected = sum(r * w for r, w in longer) / total if total > 0 else age
    assert expected_dwell_ms(durations, age, prior, weight) == pytest.approx(expected, rel=1e-9, abs=1e-9)
