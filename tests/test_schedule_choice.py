"""Tests of planner.search.schedule_choice: the schedules a partition is tried under, and interleaving's re-cut."""

from __future__ import annotations

import itertools

import pytest

from pipeplan.core.plan import Plan, Stage
from pipeplan.planner.search.schedule_choice import (
    INTERLEAVE_CHUNKS,
    KFKB_EVERY_K,
    interleave,
    kfkb_groups,
    schedule_variants,
)
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
    """auto gives 1f1b first, then every generated schedule; kfkb once per k in 2..m-1, interleaved once per v."""
    variants = schedule_variants(straight(model), model)
    assert variants[0].schedule == "1f1b"
    assert {v.schedule for v in variants} == set(GENERATED)
    assert sorted(v.k for v in variants if v.schedule == "kfkb") == [2, 3, 4, 5, 6, 7]
    assert sorted(v.chunks for v in variants if v.schedule == "interleaved-1f1b") == list(INTERLEAVE_CHUNKS)


def test_kfkb_asked_gives_every_k_from_1f1b_to_gpipe(model: CostModel) -> None:
    """only='kfkb' (what plan --adaptive plans) gives k = 1..m: 1F1B's and GPipe's orders are kFkB at k = 1 and m."""
    variants = schedule_variants(straight(model, microbatches=6), model, "kfkb")
    assert [(v.schedule, v.k) for v in variants] == [("kfkb", k) for k in range(1, 7)]


def test_kfkb_groups_are_every_k_up_to_the_dense_limit_then_a_ladder() -> None:
    """Every k up to KFKB_EVERY_K; above it each k at most 1.25 x the one before, the last m - 1, no repeats."""
    assert kfkb_groups(2) == [] and kfkb_groups(3) == [2] and kfkb_groups(1, ends=True) == [1]
    assert kfkb_groups(KFKB_EVERY_K + 1) == list(range(2, KFKB_EVERY_K + 1))
    ks = kfkb_groups(1000)
    assert ks[: KFKB_EVERY_K - 1] == list(range(2, KFKB_EVERY_K + 1)) and ks[-1] == 999
    assert all(a < b <= max(a + 1, round(a * 1.25)) for a, b in itertools.pairwise(ks))
    assert kfkb_groups(10, ends=True) == list(range(1, 11))


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
