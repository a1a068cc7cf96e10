"""The search's candidate pool (planner.search.candidates): which baselines seed it."""

from __future__ import annotations

import pytest

from pipeplan.core.errors import PlanError
from pipeplan.core.profile import LayerProfile, ModelProfile
from pipeplan.planner import baselines
from pipeplan.planner.request import PlanRequest, PlanResult
from pipeplan.planner.search import candidates
from pipeplan.planner.search.candidates import Candidates
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
