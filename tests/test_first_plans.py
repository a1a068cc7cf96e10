"""exact.first_plans: the splits exact seeds with and the moves it polishes by, against plain enumeration."""

from __future__ import annotations

import random

from pipeplan.planner.bound.shape_bounds import ShapeBounds
from pipeplan.planner.exact.first_plans import POLISH_STEPS, even_splits, moves, place_split, straight_split
from pipeplan.planner.exact.stages import StageCosts, holds_one
from pipeplan.planner.request import PlanRequest
from planner_instances import random_cluster, random_profile


def covers(split: list[tuple[int, int, int]], layers: int) -> bool:
    """Whether the stages take layers 0..layers - 1 in order, each at least one."""
    return (
        [first for first, _, _ in split] == [0, *(last + 1 for _, last, _ in split[:-1])]
        and split[-1][1] == layers - 1
        and all(first <= last for first, last, _ in split)
    )


def test_straight_and_even_splits_cover_every_layer_once() -> None:
    """straight_split: min(layers, devices // rp) one-device stages whose layer counts differ by at most one;
    even_splits: per stage width r, min(layers, devices // (rp r)) stages of r devices, every layer once."""
    rng = random.Random(7)
    for trial in range(40):
        layers, devices = rng.randint(2, 12), rng.randint(2, 8)
        rp = rng.choice([r for r in (1, 2) if r <= devices])
        split = straight_split(layers, devices, rp)
        assert len(split) == min(layers, devices // rp) and covers(split, layers)
        sizes = [last - first + 1 for first, last, _ in split]
        assert max(sizes) - min(sizes) <= 1 and {r for _, _, r in split} == {1}
        request = PlanRequest(random_profile(trial, layers), random_cluster(trial, devices), 16)
        bounds = ShapeBounds(request)
        widths = bounds.widths(rp, 16 // rp)
        splits = list(even_splits(bounds, devices, rp, 16 // rp))
        assert len(splits) == len(widths)
        for r, split in zip(widths, splits, strict=True):
            assert len(split) == min(layers, devices // (rp * r)) and covers(split, layers)
            assert {w for _, _, w in split} == {r}


def test_moves_are_every_single_cut_move_that_holds_in_order() -> None:
    """moves yields, in order of cut and then POLISH_STEPS, every plan one cut away by a step (the cuts kept in
    order, each stage on its devices) whose stages all hold a microbatch: the enumeration written out plainly."""
    rng = random.Random(5)
    checked = 0
    for trial in range(30):
        layers, devices = rng.randint(3, 10), rng.randint(2, 5)
        request = PlanRequest(random_profile(trial, layers), random_cluster(trial, devices), 16)
        costs = StageCosts(request)
        count = rng.randint(2, min(layers, devices))
        cuts = sorted(rng.sample(range(1, layers), count - 1))
        split = [(a, b - 1, 1) for a, b in zip([0, *cuts], [*cuts, layers], strict=True)]
        stages = place_split(costs, tuple(range(devices)), split, 1, 4)
        expected = []
        for i in range(count - 1):
            for step in POLISH_STEPS:
                moved = [*cuts[:i], cuts[i] + step, *cuts[i + 1 :]]
                if moved != sorted(set(moved)) or moved[0] < 1 or moved[-1] > layers - 1:
                    continue
                trial_split = [(a, b - 1, 1) for a, b in zip([0, *moved], [*moved, layers], strict=True)]
                placed = place_split(costs, tuple(range(devices)), trial_split, 1, 4)
                if all(holds_one(st) for st in placed):
                    expected.append([(st.first, st.last, st.devices) for st in placed])
        got = [[(st.first, st.last, st.devices) for st in plan] for plan in moves(costs, stages, 1, 4)]
        assert got == expected
        checked += len(got)
    assert checked > 50
