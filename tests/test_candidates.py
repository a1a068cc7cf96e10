"""The search's candidate pool (planner.search.candidates): which baselines seed it; straight pipelines that cannot
beat the best time join it unsimulated (the pool as it was), or end a search that has nothing else."""

from __future__ import annotations

import pytest

from pipeplan.core.errors import PlanError
from pipeplan.core.hardware.cluster import Cluster, Device
from pipeplan.core.profile import LayerProfile, ModelProfile
from pipeplan.planner import baselines
from pipeplan.planner.plan_space import divisors
from pipeplan.planner.request import PlanRequest, PlanResult
from pipeplan.planner.search import candidates
from pipeplan.planner.search.candidates import Candidates
from pipeplan.planner.search.scoring import FLOOR_MARGIN
from pipeplan.planner.search.selection import search_order
from pipeplan.planner.search.time_floor import PassFloor
from pipeplan.presets.resolve import load_cluster


@pytest.mark.parametrize(("layers", "seeded"), [(6, True), (7, False)])
def test_pipedream_seeds_only_models_within_its_state_budget(monkeypatch: pytest.MonkeyPatch, layers: int, seeded: bool) -> None:
    """With a budget of 6 planning states, a 6-layer chain (6 states) asks PipeDream for a seed, a 7-layer one does
    not (its DP and tables grow with the square of the states)."""
    asked: list[str] = []

    def pipedream(request: PlanRequest) -> PlanResult:
        asked.append(request.profile.name)
        raise PlanError("no seed here")

    monkeypatch.setattr(candidates, "SEED_PIPEDREAM_STATES", 6)
    monkeypatch.setitem(baselines.BASELINES, "pipedream", pipedream)
    profile = ModelProfile("chain", 1, tuple(LayerProfile(f"l{i}", 1.0, 2.0, 10.0, 10.0) for i in range(layers)))
    Candidates(PlanRequest(profile, load_cluster("v100-8x1"), 8)).seed_from_baselines()
    assert asked == (["chain"] if seeded else [])


@pytest.mark.parametrize(("layers", "taken"), [(6, True), (7, False)])
def test_a_pipedream_row_from_compare_is_taken_only_within_the_budget(
    monkeypatch: pytest.MonkeyPatch, layers: int, taken: bool
) -> None:
    """compare's PipeDream row seeds the search under the same budget as plan's own call (same inputs, same seeds)."""
    monkeypatch.setattr(candidates, "SEED_PIPEDREAM_STATES", 6)
    profile = ModelProfile("chain", 1, tuple(LayerProfile(f"l{i}", 1.0, 2.0, 10.0, 10.0) for i in range(layers)))
    pool = Candidates(PlanRequest(profile, load_cluster("v100-8x1"), 8), baselines={"pipedream": None})
    pool.seed_from_baselines()
    assert ("pipedream" in pool.reused) == taken


def slow_links(devices: int = 8) -> Cluster:
    """`devices` devices on one node whose every link has 2 ms latency: a deep straight pipeline pays it 2(p - 1)
    times per microbatch."""
    bandwidth = tuple(tuple(0.0 if a == b else 10e9 for b in range(devices)) for a in range(devices))
    latency = tuple(tuple(0.0 if a == b else 2.0 for b in range(devices)) for a in range(devices))
    return Cluster("slow", tuple(Device(i, "gpu", 80 * 2**30) for i in range(devices)), bandwidth, latency)


def old_generate(pool: Candidates) -> None:
    """The pool as it was filled before straight pipelines could join unscored: each one scored, then the DP."""
    for plan in pool.straight_plans():
        pool.add(plan)
    pool.dp_pool()


def test_straight_pipelines_that_cannot_beat_the_best_time_join_the_pool_unsimulated() -> None:
    """With a best time below every straight pipeline's pass floor, the straight pipelines join without a simulation;
    the pool (plans and order), best_time and every score are those of scoring them first, as before."""
    profile = ModelProfile("chain", 1, tuple(LayerProfile(f"l{i}", 1.0, 2.0, 1e6, 1e6) for i in range(8)))
    request = PlanRequest(profile, slow_links(), 8)
    new, old = Candidates(request), Candidates(request)
    straight = new.straight_plans()
    floor = PassFloor(request.model, divisors(8)).at(len(straight[0].stages) - 1) * FLOOR_MARGIN
    for pool in (new, old):
        pool.with_seeds, pool.best_time = False, floor
    assert new.cannot_beat(straight)
    new.generate()
    old_generate(old)
    assert new.pool and new.pool == old.pool and new.best_time == old.best_time and not new.unbeatable
    assert any(p.stages == straight[0].stages for p in new.pool)
    assert new.evaluator.simulations < old.evaluator.simulations  # the straight pipelines were not simulated
    assert [new.evaluator.score(p) for p in new.pool] == [old.evaluator.score(p) for p in old.pool]


def test_a_search_whose_only_candidates_cannot_beat_the_best_time_ends_at_once() -> None:
    """When the DP's bound skips every (rp, b) and no straight pipeline can beat the time to beat, the pool holds only
    the straight pipelines, unsimulated, `unbeatable` is set and the search on that order refuses with a PlanError
    naming the time."""
    profile = ModelProfile("chain", 1, tuple(LayerProfile(f"l{i}", 1.0, 2.0, 1e6, 1e6) for i in range(8)))
    request = PlanRequest(profile, slow_links(), 8)
    pool = Candidates(request)
    pool.with_seeds, pool.best_time = False, 1.0  # one microbatch alone computes 24 ms
    pool.generate()
    assert pool.pool and all(len(p.stages) == 8 for p in pool.pool)
    assert pool.unbeatable and pool.evaluator.simulations == 0
    with pytest.raises(PlanError, match=r"can beat 1\.0 ms"):
        search_order(request, beat_ms=1.0, seeds=False)
