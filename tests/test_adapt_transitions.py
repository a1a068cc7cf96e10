"""adapt.transitions: the network's states at iteration boundaries and the empirical transitions between them."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeplan.adapt.transitions import StateChain

SLOW, FAST = {(0, 1): 0.05}, {(0, 1): 1.0}


def test_two_states_in_turn_give_the_counts_of_their_transitions() -> None:
    """fast, slow, fast, slow, fast: from fast, 2 moves to slow and none to itself, plus a prior of 1 to stay."""
    chain = StateChain(1.25, prior=1.0)
    ids = [chain.observe(f) for f in (FAST, SLOW, FAST, SLOW, FAST)]
    assert ids == [0, 1, 0, 1, 0] and chain.current == 0
    assert chain.departures(0) == 2 and chain.departures(1) == 2
    assert chain.next_weights(1) == pytest.approx({0: 1 / 3, 1: 2 / 3}, rel=1e-12)
    # two steps: fast -> (1/3 fast, 2/3 slow) -> fast stays 1/3 or leaves; slow returns 2/3 or stays 1/3
    two = {0: 1 / 3 * 1 / 3 + 2 / 3 * 2 / 3, 1: 1 / 3 * 2 / 3 + 2 / 3 * 1 / 3}
    assert chain.next_weights(2) == pytest.approx({s: (one + two[s]) / 2 for s, one in {0: 1 / 3, 1: 2 / 3}.items()})


def test_factors_within_the_ratio_join_a_state_and_the_latest_represents_it() -> None:
    """1.0 then 0.85 (within 1.25 on the only link) is one state, represented by 0.85; 0.6 is another; a link absent
    reads as nominal."""
    chain = StateChain(1.25)
    assert chain.observe({(0, 1): 1.0}) == 0
    assert chain.observe({(0, 1): 0.85}) == 0
    assert chain.representative(0) == {(0, 1): 0.85}
    assert chain.observe({(0, 1): 0.6}) == 1
    assert chain.observe({}) == 0  # nominal: within 1.25 of the first seen 1.0
    assert chain.observe({(0, 1): 1.0, (1, 2): 0.5}) == 2  # another link slow: another state


def test_before_any_transition_the_chain_stays() -> None:
    chain = StateChain(1.25)
    assert chain.next_weights(3) == {}
    chain.observe(SLOW)
    assert chain.next_weights(3) == {0: pytest.approx(1.0)}


def test_the_state_seen_longest_ago_is_dropped_past_the_limit() -> None:
    """limit 2: a third state drops the first with its counts and the transitions into it."""
    chain = StateChain(1.25, limit=2)
    for f in (1.0, 0.5, 1.0, 0.5, 0.1):
        chain.observe({(0, 1): f})
    assert chain.current == 2 and chain.departures(1) == 1  # 0.5 -> 0.1 (0.5 -> 1.0 went with 1.0)
    assert chain.find({(0, 1): 1.0}) is None
    chain.observe({(0, 1): 0.5})
    assert chain.next_weights(1) == pytest.approx({1: 1 / 2, 2: 1 / 2}, rel=1e-12)  # the prior 1 and 0.5 -> 0.1


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from([1.0, 0.5, 0.2, 0.05]), min_size=2, max_size=30), st.integers(1, 4))
def test_weights_are_the_mean_of_the_transition_matrix_powers(levels: list[float], horizon: int) -> None:
    """Against a plain count of the label sequence and matrix powers by loops (the levels are 2.5x apart: one state
    each)."""
    chain = StateChain(1.25, prior=1.0)
    for f in levels:
        chain.observe({(0, 1): f})
    states = list(dict.fromkeys(levels))
    counts = {(a, b): 0 for a in states for b in states}
    for a, b in itertools.pairwise(levels):
        counts[(a, b)] += 1
    matrix = {}
    for a in states:
        n = sum(counts[(a, b)] for b in states) + 1.0
        for b in states:
            matrix[(a, b)] = (counts[(a, b)] + (1.0 if a == b else 0.0)) / n
    row = {s: 1.0 if s == levels[-1] else 0.0 for s in states}
    mean = dict.fromkeys(states, 0.0)
    for _ in range(horizon):
        row = {b: sum(row[a] * matrix[(a, b)] for a in states) for b in states}
        for s in states:
            mean[s] += row[s] / horizon
    weights = chain.next_weights(horizon)
    ids = {f: chain.find({(0, 1): f}) for f in states}
    for f in states:
        assert weights.get(ids[f], 0.0) == pytest.approx(mean[f], rel=1e-12, abs=1e-15)
