"""Tests of planner/search/partition_dp, the search's dynamic programme over (layer suffix, devices used, stages
after), run directly on real profiles and clusters: what it returns, in what order, and what it refuses."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pipeplan.planner.search.partition_dp as partition_module
from pipeplan.core.hardware.cluster import Cluster
from pipeplan.planner.request import PlanRequest
from pipeplan.planner.search.candidates import MAX_STAGES, Candidates
from pipeplan.planner.search.mapping import Layout
from pipeplan.planner.search.partition_dp import (
    DpCache,
    DpInputs,
    DpSolution,
    DpStage,
    Tables,
    partition_dp,
    partition_dp_each,
    solve_tables,
)
from pipeplan.presets.resolve import load_cluster, load_profile

CASES = [
    ("dapple/bert-48", "v100-8x1", 64, 8),
    ("pipedream/vgg16", "pcie-4x4-10g", 32, 4),
    ("dapple/gnmt-16", "v100-8x2-25g", 128, 16),
]
"""(profile, cluster, global batch, microbatch size b): one pipeline over the whole cluster."""


def dp_run(profile: str, cluster: str | Cluster, batch: int, b: int, keep: int = 4) -> tuple[list[DpSolution], Layout, DpInputs]:
    """The DP's solutions for one pipeline (no pipeline replicas) in the search's first device order."""
    machines = cluster if isinstance(cluster, Cluster) else load_cluster(cluster)
    cand = Candidates(PlanRequest(load_profile(profile), machines, batch, b))
    unit, _, choices = cand.units(1, b)
    sums = {rho * unit: cand.block_sums(b, rho * unit) for rho in choices}
    inputs = DpInputs(
        sums, cand.cluster, cand.bandwidth, cand.latency, batch // b, cand.request.model.optimizer_factor, choices, MAX_STAGES
    )
    layout = Layout(cand.orders[0], 1, machines.num_devices, unit, True)
    return partition_dp(inputs, layout, keep=keep), layout, inputs


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}")
def test_every_solution_covers_every_layer_once_in_order(case: tuple[str, str, int, int]) -> None:
    """Each solution's stages run from layer 0 to the last layer, each starting where the one before ended."""
    solutions, _, inputs = dp_run(*case)
    assert solutions
    last = inputs.blocks[-1][1]
    for solution in solutions:
        stages = solution.stages
        assert stages[0].first_layer == 0 and stages[-1].last_layer == last
        assert all(b.first_layer == a.last_layer + 1 for a, b in itertools.pairwise(stages))


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}")
def test_solutions_come_best_estimate_first_and_fit_the_layout(case: tuple[str, str, int, int]) -> None:
    """At most `keep` solutions, by rising estimate; each stage's units are an allowed width and the stages' units
    tile positions downwards from the pipeline's first stage (the last stage ends at position 0)."""
    solutions, layout, inputs = dp_run(*case, keep=3)
    assert 1 <= len(solutions) <= 3
    estimates = [s.estimate_ms for s in solutions]
    assert estimates == sorted(estimates) and all(e > 0 for e in estimates)
    for solution in solutions:
        for stage in solution.stages:
            assert stage.units in inputs.unit_choices
        assert solution.stages[-1].first_unit == 0
        for a, b in itertools.pairwise(solution.stages):
            assert a.first_unit == b.first_unit + b.units
        assert solution.stages[0].first_unit + solution.stages[0].units <= layout.units


def test_more_solutions_kept_start_with_the_same_best() -> None:
    """Keeping more solutions adds worse ones after the same best solution."""
    one, _, _ = dp_run(*CASES[0], keep=1)
    four, _, _ = dp_run(*CASES[0], keep=4)
    assert four[0] == one[0]


def test_devices_too_small_for_any_stage_give_no_solution() -> None:
    """With 1 MB per device no stage holds its weights: the DP returns nothing rather than a plan that cannot fit."""
    cluster = load_cluster("v100-8x1")
    tiny = dataclasses.replace(cluster, devices=tuple(dataclasses.replace(d, memory_bytes=1e6) for d in cluster.devices))
    solutions, _, _ = dp_run("dapple/bert-48", tiny, 64, 8)
    assert solutions == []


def plain_solutions(
    tables: Tables, blocks: tuple[tuple[int, int], ...], k_units: int, max_stages: int, m: int, keep: int
) -> list[DpSolution]:
    """The recurrence as it was before the windowed step: every (i, j, k') cell of every stage count at once, masks
    applied to the whole table (the reference solve_tables must equal, ties included)."""
    nb = len(blocks)
    shape = (max_stages + 1, nb + 1, k_units + 1)
    value, filled = np.full(shape, np.inf), np.full(shape, np.inf)
    choice_j = np.full(shape, -1, dtype=np.int64)
    choice_rho = np.zeros(shape, dtype=np.int64)
    value[0, nb, 0] = filled[0, nb, 0] = 0.0
    rows = np.arange(nb)[:, None]
    for cnt in range(1, max_stages + 1):
        if not np.isfinite(value[cnt - 1]).any():
            break
        best = value[cnt] + filled[cnt]
        for rho, (u, fill, room, _) in tables.items():
            positions = k_units - rho + 1
            obj = np.maximum(value[cnt - 1][None, 1:, :positions], u) + filled[cnt - 1][None, 1:, :positions] + fill
            obj[room < min(cnt, m)] = np.inf
            j_best = np.argmin(obj, axis=1)
            obj_best = obj[rows, j_best, np.arange(positions)[None, :]]
            better = obj_best < best[:nb, rho : rho + positions]
            idx_i, idx_k = np.nonzero(better)
            idx_j = j_best[idx_i, idx_k]
            value[cnt, idx_i, idx_k + rho] = np.maximum(value[cnt - 1, idx_j + 1, idx_k], u[idx_i, idx_j, idx_k])
            filled[cnt, idx_i, idx_k + rho] = filled[cnt - 1, idx_j + 1, idx_k] + fill[idx_i, idx_j, idx_k]
            choice_j[cnt, idx_i, idx_k + rho] = idx_j
            choice_rho[cnt, idx_i, idx_k + rho] = rho
            best[idx_i, idx_k + rho] = obj_best[idx_i, idx_k]
    total = value[:, 0, :] + filled[:, 0, :]
    flat = sorted(
        (float(total[c, k]), c, k) for c in range(1, max_stages + 1) for k in range(1, k_units + 1) if total[c, k] < np.inf
    )
    out = []
    for estimate, cnt, k in flat[:keep]:
        stages, i = [], 0
        while cnt > 0:
            j, rho = int(choice_j[cnt, i, k]), int(choice_rho[cnt, i, k])
            stages.append(DpStage(blocks[i][0], blocks[j][1], k - rho, rho))
            i, k, cnt = j + 1, k - rho, cnt - 1
        out.append(DpSolution(tuple(stages), estimate))
    return out


@st.composite
def drawn_tables(draw: st.DrawFn) -> tuple[Tables, tuple[tuple[int, int], ...], int, int, int]:
    """Stage tables of 1-20 blocks and 1-12 units, costs from a few distinct values (many ties), room from -1 to 5
    microbatches or unlimited, some cells inf; widths in a drawn order."""
    nb = draw(st.integers(1, 20))
    k_units = draw(st.integers(1, 12))
    widths = draw(st.lists(st.integers(1, k_units), min_size=1, max_size=4, unique=True))
    m = draw(st.integers(1, 6))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    upper = np.triu(np.ones((nb, nb), dtype=bool))[:, :, None]
    tables: Tables = {}
    for rho in widths:
        shape = (nb, nb, k_units - rho + 1)
        u = rng.choice([1.0, 2.0, 3.0, np.inf], size=shape, p=[0.35, 0.3, 0.3, 0.05])
        fill = rng.choice([0.5, 1.0, 1.5], size=shape)
        u, fill = np.where(upper, u, np.inf), np.where(upper, fill, np.inf)  # inf work where j < i
        room = rng.choice([-1.0, 0.5, 1.0, 2.5, 4.0, 5.0, np.inf], size=shape)
        tables[rho] = (u, fill, room, np.where(upper[:, :, 0], room.min(axis=2), np.inf))
    blocks = tuple((2 * i, 2 * i + 1) for i in range(nb))
    return tables, blocks, k_units, min(nb, k_units, draw(st.integers(1, 32))), m


@settings(max_examples=150, deadline=None)
@given(drawn_tables(), st.integers(1, 5), st.sampled_from([1, 3, partition_module.I_BLOCK]))
def test_windowed_recurrence_equals_the_whole_table_one(
    case: tuple[Tables, tuple[tuple[int, int], ...], int, int, int], keep: int, block: int
) -> None:
    """solve_tables (only the cells the previous stage count reached, first blocks `block` at a time) returns the
    same solutions, stages and estimates as the plain recurrence over whole tables, on tables with many ties."""
    tables, blocks, k_units, max_stages, m = case
    saved = partition_module.I_BLOCK
    try:
        partition_module.I_BLOCK = block
        got = solve_tables(tables, blocks, k_units, max_stages, m, keep)
    finally:
        partition_module.I_BLOCK = saved
    assert got == plain_solutions(tables, blocks, k_units, max_stages, m, keep)


@pytest.mark.parametrize("case", [*CASES, ("pipedream/resnet101", "h100-8x4", 256, 8)], ids=lambda c: f"{c[0]}-{c[1]}")
def test_windowed_recurrence_equals_the_whole_table_one_on_real_tables(
    case: tuple[str, str, int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the tables partition_dp builds for real profiles (both all-reduce estimates), the same solutions."""
    seen: list[tuple[object, ...]] = []

    def recording(*args: object) -> list[DpSolution]:
        seen.append(args)
        return solve_tables(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(partition_module, "solve_tables", recording)
    solutions, layout, inputs = dp_run(*case)
    hidden = partition_module.partition_dp(dataclasses.replace(inputs, hide_allreduce=True), layout, keep=4)
    assert len(seen) == 2 and solutions
    for args, got in zip(seen, (solutions, hidden), strict=True):
        assert got == plain_solutions(*args)  # type: ignore[arg-type]


EACH_CASES = [*CASES, ("pipedream/resnet101", "h100-8x4", 256, 8)]


@pytest.mark.parametrize("case", EACH_CASES, ids=lambda c: f"{c[0]}-{c[1]}")
def test_both_estimates_at_once_equal_one_run_per_estimate(case: tuple[str, str, int, int]) -> None:
    """partition_dp_each (one build of the shared tables for both all-reduce estimates) returns, per estimate, what
    a partition_dp run with that hide_allreduce returns, in the order asked."""
    _, layout, inputs = dp_run(*case)
    for hides in [(False, True), (True, False), (True,)]:
        got = partition_dp_each(inputs, layout, hides, keep=3)
        want = [partition_dp(dataclasses.replace(inputs, hide_allreduce=h), layout, keep=3) for h in hides]
        assert got == want and all(want)


@pytest.mark.parametrize("case", [("pipedream/resnet50", "v100-8x2-25g", 256), ("dapple/bert-48", "pcie-4x4-10g", 2048)])
def test_a_shared_cache_returns_what_fresh_runs_return_on_every_layout(case: tuple[str, str, int]) -> None:
    """With one DpCache over every (pipeline replicas, microbatch size) and layout the search tries, every answer
    equals a run without a cache; mirror-image orders on these symmetric clusters are answered from the cache
    (fewer solved entries than calls)."""
    profile, cluster, batch = case
    cand = Candidates(PlanRequest(load_profile(profile), load_cluster(cluster), batch))
    cache, calls = DpCache(), 0
    for rp in cand.replica_counts()[:3]:
        for b in cand.microbatch_sizes(rp)[:3]:
            unit, _, choices = cand.units(rp, b)
            if not choices:
                continue
            sums = {rho * unit: cand.block_sums(b, rho * unit) for rho in choices}
            m = batch // (rp * b)
            inputs = DpInputs(sums, cand.cluster, cand.bandwidth, cand.latency, m, cand.request.model.optimizer_factor,
                              choices, MAX_STAGES)  # fmt: skip
            n = cand.cluster.num_devices // rp
            for order in cand.orders:
                for major in (True, False) if rp > 1 else (True,):
                    layout = Layout(order, rp, n, unit, major)
                    calls += 1
                    got = partition_dp_each(inputs, layout, (False, True), keep=3, cache=cache)
                    assert got == partition_dp_each(inputs, layout, (False, True), keep=3)
    assert len(cache.solved) < calls


def test_the_cache_tells_layouts_apart_whose_links_differ() -> None:
    """Two layouts whose stages see different links (the chain order and the order alternating between the two
    nodes) are solved separately: the cache does not hand one the other's solutions."""
    cand = Candidates(PlanRequest(load_profile("dapple/gnmt-16"), load_cluster("v100-8x2-25g"), 128, 16))
    unit, _, choices = cand.units(1, 16)
    sums = {rho * unit: cand.block_sums(16, rho * unit) for rho in choices}
    inputs = DpInputs(sums, cand.cluster, cand.bandwidth, cand.latency, 8, cand.request.model.optimizer_factor, choices,
                      MAX_STAGES)  # fmt: skip
    chain = cand.orders[0]
    mixed = tuple(itertools.chain.from_iterable(zip(chain[:8], chain[8:], strict=True)))
    cache = DpCache()
    for order in (chain, mixed):
        layout = Layout(order, 1, 16, unit, True)
        assert partition_dp_each(inputs, layout, (False,), cache=cache) == partition_dp_each(inputs, layout, (False,))
    assert len(cache.solved) == 2
