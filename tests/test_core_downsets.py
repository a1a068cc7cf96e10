"""Tests of core.downsets: the one enumeration of a DAG's down-sets (the DAG search's and PipeDream's states)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeplan.core.downsets import (
    StateLimitError,
    all_downsets,
    ancestor_masks,
    bits,
    consumer_masks,
    downsets,
    maximal,
    membership,
)
from pipeplan.planner.baselines import downset_tables as pipedream_downsets

DIAMOND = ((), (0,), (0,), (1, 2))


def closed_subsets(inputs: tuple[tuple[int, ...], ...]) -> list[int]:
    """Every subset closed under inputs, by brute force."""
    n = len(inputs)
    return sorted(mask for mask in range(1 << n) if all(mask >> u & 1 for v in range(n) if mask >> v & 1 for u in inputs[v]))


def reachable(inputs: tuple[tuple[int, ...], ...], first: int) -> set[int]:
    """The closure of {ancestors(first)} under D -> D | ancestors(v), v outside D consuming a node of D, by fixpoint."""
    anc = ancestor_masks(inputs)
    found = {anc[first]}
    while True:
        grown = {d | anc[v] for d in found for v in range(len(inputs)) if not d >> v & 1 and any(d >> u & 1 for u in inputs[v])}
        if grown <= found:
            return found
        found |= grown


@st.composite
def dags(draw: st.DrawFn, most: int = 9) -> tuple[tuple[int, ...], ...]:
    """A random DAG in index order (every input an earlier node)."""
    n = draw(st.integers(1, most))
    return tuple(tuple(sorted(draw(st.sets(st.integers(0, i - 1), max_size=3)))) if i else () for i in range(n))


def test_a_diamond_has_six_down_sets_and_the_limit_stops_the_count() -> None:
    """a -> {b, c} -> d: {}, a, ab, ac, abc, abcd by size then value; a limit of 5 gives None, downsets raises."""
    assert all_downsets(DIAMOND, 100) == [0b0, 0b1, 0b11, 0b101, 0b111, 0b1111]
    assert all_downsets(DIAMOND, 6) is not None
    assert all_downsets(DIAMOND, 5) is None
    with pytest.raises(StateLimitError, match="graph 'diamond' has more than 3 reachable down-sets"):
        downsets(DIAMOND, 0b1, 0b110, 3, "diamond")


def test_masks_of_a_diamond_name_ancestors_consumers_bits_and_the_antichain() -> None:
    """The diamond's ancestor and consumer masks, the set bits of a mask, and {a, b, c}'s maximal nodes {b, c}."""
    assert ancestor_masks(DIAMOND) == [0b1, 0b11, 0b101, 0b1111]
    assert consumer_masks(DIAMOND) == [0b110, 0b1000, 0b1000, 0]
    assert bits(0b1101) == [0, 2, 3] and bits(0) == []
    assert maximal(0b111, ancestor_masks(DIAMOND)) == 0b110
    assert membership([0b0, 0b101, 0b1111], 4).tolist() == [
        [False, False, False, False],
        [True, False, True, False],
        [True, True, True, True],
    ]


@settings(max_examples=150, deadline=None)
@given(dags())
def test_every_down_set_is_found_by_size_then_value(inputs: tuple[tuple[int, ...], ...]) -> None:
    """all_downsets equals brute force, sorted by size then value; one limit below the count gives None."""
    found = all_downsets(inputs, 10_000)
    expected = closed_subsets(inputs)
    assert found == sorted(expected, key=lambda m: (m.bit_count(), m))
    assert all_downsets(inputs, len(expected)) == found
    assert all_downsets(inputs, len(expected) - 1) is None


@settings(max_examples=150, deadline=None)
@given(dags())
def test_the_down_sets_reachable_from_a_source_are_pipedreams_closure(inputs: tuple[tuple[int, ...], ...]) -> None:
    """From the first source, downsets finds exactly the closure PipeDream walks, each once, its start first, every
    state a down-set; the baselines' names give the same list."""
    anc, succ = ancestor_masks(inputs), consumer_masks(inputs)
    found = downsets(inputs, anc[0], succ[0])
    assert found[0] == anc[0] and len(found) == len(set(found))
    assert set(found) == reachable(inputs, 0)
    assert set(found) <= set(closed_subsets(inputs))
    assert pipedream_downsets.mask_matrix is membership and pipedream_downsets.bits is bits
