"""Tests of core.partition, the one contiguous-partition solver: exact where it claims to be, and the same answers
the partitioners it replaced gave (recorded before the move on the 26 shared profiles and seeded random weights:
tests/data/partition_golden.json)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeplan.core.errors import PlanError
from pipeplan.core.partition import (
    blocks_needed,
    bottleneck,
    prefix_sums,
    quantile_ends,
    quantile_starts,
    replica_split,
    solve,
    solve_scaled,
    split_evenly,
    splits_evenly,
)
from pipeplan.planner.baselines.layer_groups import merge_layers
from pipeplan.planner.search.blocks import make_blocks
from pipeplan.presets.resolve import load_profile

GOLDEN = json.loads((Path(__file__).parent / "data" / "partition_golden.json").read_text())


def brute_bottleneck(costs: list[float], parts: int) -> float:
    """Smallest largest block sum over every split of costs into exactly `parts` contiguous blocks."""
    best = float("inf")
    for cuts in itertools.combinations(range(1, len(costs)), parts - 1):
        bounds = [0, *cuts, len(costs)]
        best = min(best, max(sum(costs[a:b]) for a, b in itertools.pairwise(bounds)))
    return best


def test_solve_hand_case() -> None:
    """[1, 2, 3, 4, 5] in 3 blocks: the best bottleneck is 6 ([1,2,3] [4] [5]) and bounds cover all layers."""
    bounds = solve([1, 2, 3, 4, 5], 3)
    assert bounds == [0, 3, 4, 5]
    assert bottleneck([1, 2, 3, 4, 5], 3) == 6


def test_blocks_needed_counts_greedy_blocks() -> None:
    """A bound below the largest element is infeasible; a bound of the total needs one block."""
    prefix = prefix_sums([1, 2, 3, 4, 5])
    assert blocks_needed(prefix, 15) == 1
    assert blocks_needed(prefix, 6) == 3
    assert blocks_needed(prefix, 4) > 5


@given(
    costs=st.lists(st.floats(min_value=0.0, max_value=100.0, allow_nan=False), min_size=1, max_size=9),
    parts=st.integers(min_value=1, max_value=9),
)
def test_solve_matches_brute_force(costs: list[float], parts: int) -> None:
    """The partition has exactly `parts` non-empty blocks and the brute-force optimal bottleneck."""
    parts = min(parts, len(costs))
    bounds = solve(costs, parts)
    assert bounds[0] == 0 and bounds[-1] == len(costs) and len(bounds) == parts + 1
    assert all(b > a for a, b in itertools.pairwise(bounds))
    worst = max(sum(costs[a:b]) for a, b in itertools.pairwise(bounds))
    assert worst == pytest.approx(brute_bottleneck(costs, parts), rel=1e-12, abs=1e-12)


def test_solve_rejects_more_parts_than_layers() -> None:
    """Asking for more stages than layers names both counts."""
    with pytest.raises(PlanError, match="cannot split 2 layers into 3"):
        solve([1.0, 2.0], 3)


def test_split_evenly_puts_larger_runs_first() -> None:
    """Nine layers in four stages: 3, 2, 2, 2 layers; seven samples over three replicas: 3, 2, 2."""
    assert split_evenly(9, 4) == [(0, 3), (3, 5), (5, 7), (7, 9)]
    assert split_evenly(7, 3) == [(0, 3), (3, 5), (5, 7)]


@given(count=st.integers(0, 200), parts=st.integers(1, 40))
def test_split_evenly_covers_every_item_once_within_one_of_even(count: int, parts: int) -> None:
    """The runs are consecutive, cover 0..count and differ in size by at most one, larger first."""
    ranges = split_evenly(count, parts)
    assert len(ranges) == parts and ranges[0][0] == 0 and ranges[-1][1] == count
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    sizes = [hi - lo for lo, hi in ranges]
    assert sizes == sorted(sizes, reverse=True) and max(sizes) - min(sizes) <= 1


@given(weights=st.lists(st.floats(0.0, 50.0, allow_nan=False), min_size=1, max_size=40), parts=st.integers(1, 12))
def test_quantile_starts_are_increasing_and_at_most_parts(weights: list[float], parts: int) -> None:
    """Starts begin at 0, strictly increase, stay inside the weights and number min(parts, len)."""
    starts = quantile_starts(weights, parts)
    assert starts[0] == 0 and all(b > a for a, b in itertools.pairwise(starts)) and starts[-1] < len(weights)
    assert len(starts) == min(parts, len(weights))


@pytest.mark.parametrize("index", range(len(GOLDEN["records"])))
def test_solvers_give_what_the_replaced_partitioners_gave(index: int) -> None:
    """solve (balanced_partition), bottleneck (min_bottleneck), solve_scaled (chunk_partition) and split_evenly
    (even_split, replica_ranges) give, bit for bit, the outputs recorded from the functions they replaced."""
    record = GOLDEN["records"][index]
    weights = record["weights"]
    for parts, bounds in record["balanced"].items():
        assert solve(weights, int(parts)) == bounds
        assert bottleneck(weights, int(parts)) == record["bottleneck"][parts]
        assert [[lo, hi - 1] for lo, hi in split_evenly(len(weights), int(parts))] == record["even"][parts]
        factors = [1.0 + (k % 3) * 0.5 for k in range(int(parts))]
        got = solve_scaled(weights, factors)
        assert (None if got is None else [list(b) for b in got]) == record["chunks"][parts]


@pytest.mark.parametrize("name", sorted(GOLDEN["profiles"]))
def test_layer_blockers_give_what_they_gave_on_every_shared_profile(name: str) -> None:
    """merge_layers (now core.partition.quantile_starts) and make_blocks cut each shared profile where they did."""
    profile = load_profile(name)
    recorded = GOLDEN["profiles"][name]
    for blocks, starts in recorded["merge_starts"].items():
        assert list(merge_layers(profile, int(blocks)).starts) == starts
        assert quantile_starts([x.fwd_ms + x.bwd_ms for x in profile.layers], int(blocks)) == starts
    for blocks, ranges in recorded["make_blocks"].items():
        assert [list(r) for r in make_blocks(profile, int(blocks))] == ranges


def test_replica_split_is_the_runtimes_rows_and_the_simulators_share_when_even() -> None:
    """Twelve samples over three replicas: rows 0-3, 4-7, 8-11 (12 / 3 each, as the simulator prices them); seven
    over three: 3, 2, 2 rows (the runtime runs it; the simulator refuses to price it)."""
    assert replica_split(12, 3) == [(0, 4), (4, 8), (8, 12)]
    assert replica_split(7, 3) == [(0, 3), (3, 5), (5, 7)]
    assert splits_evenly(12, 3) and not splits_evenly(7, 3) and not splits_evenly(1, 2)


@given(st.lists(st.floats(0, 100), min_size=2, max_size=80), st.integers(2, 70))
def test_quantile_ends_are_nondecreasing_and_inside(weights: list[float], parts: int) -> None:
    """Every quantile's end is a valid index (or -1 for the even positions of an all-zero list), in order."""
    ends = quantile_ends(weights, parts)
    assert len(ends) == parts - 1
    assert ends == sorted(ends)
    assert all(-1 <= e < len(weights) for e in ends)
