"""Tests of planner.search.schedule_choice: the schedules a partition is tried under, and interleaving's re-cut."""

from __future__ import annotations

import pytest

from pipeplan.core.plan import Plan, Stage
from pipeplan.planner.search.schedule_choice import INTERLEAVE_CHUNKS, KFKB_GROUPS, interleave, schedule_variants
from pipeplan.presets.resolve import load_cluster, load_profile
from pipeplan.schedules.registry import GENERATED
from pipeplan.sim.cost.model import CostModel


@pytest.fixture(scope="module")
def model() -> CostModel:
    """BERT-48 on one 8-GPU node."""
    return CostModel.build(load_profile("dapple/bert-48"), load_cluster("v100-8x1"), "auto", "adam")


def straight(model: CostModel, ranks: int = 4, microbatches: int = 8) -> Plan:
    """A straight 1F1B pipeline of `ranks` equal stages, one device each."""
    n = model.profile.num_layers
    bounds = [n * r // ranks for r in range(ranks + 1)]
    stages = tuple(Stage(bounds[r], bounds[r + 1] - 1, (r,)) for r in range(ranks))
    return Plan(stages, 1, microbatches, 4, "1f1b")


def test_auto_tries_every_generated_schedule_1f1b_first(model: CostModel) -> None:
    """auto gives 1f1b first, then every generated schedule; kfkb once per k below m, interleaved once per v."""
    variants = schedule_variants(straight(model), model)
    assert variants[0].schedule == "1f1b"
    assert {v.schedule for v in variants} == set(GENERATED)
    assert sorted(v.k for v in variants if v.schedule == "kfkb") == [k for k in KFKB_GROUPS if k < 8]
    assert sorted(v.chunks for v in variants if v.schedule == "interleaved-1f1b") == list(INTERLEAVE_CHUNKS)


def test_one_schedule_asked_gives_only_it(model: CostModel) -> None:
    """only='zb-h1' gives the one zb-h1 variant; a name that does not apply to an interleaved plan gives none."""
    assert [v.schedule for v in schedule_variants(straight(model), model, "zb-h1")] == ["zb-h1"]
    chunked = interleave(straight(model), model, 2)
    assert chunked is not None
    assert schedule_variants(chunked, model, "1f1b") == []
    assert schedule_variants(chunked, model) == [chunked]


def test_interleave_puts_chunk_c_on_rank_c_mod_p_and_covers_every_layer(model: CostModel) -> None:
    """v = 3 on 4 ranks: 12 chunk-stages in layer order, chunk c on rank c mod 4's devices."""
    plan = straight(model)
    chunked = interleave(plan, model, 3)
    assert chunked is not None and chunked.chunks == 3 and chunked.schedule == "interleaved-1f1b"
    assert len(chunked.stages) == 12
    assert chunked.stages[0].first_layer == 0 and chunked.stages[-1].last_layer == model.profile.num_layers - 1
    for c, stage in enumerate(chunked.stages):
        assert stage.devices == plan.stages[c % 4].devices


def test_interleave_refuses_what_it_cannot_apply(model: CostModel) -> None:
    """One rank, or m not a multiple of p: None."""
    assert interleave(straight(model, ranks=1), model, 2) is None
    assert interleave(straight(model, microbatches=6), model, 2) is None
