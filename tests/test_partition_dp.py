"""Tests of planner/search/partition_dp, the search's dynamic programme over (layer suffix, devices used, stages
after), run directly on real profiles and clusters: what it returns, in what order, and what it refuses."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from pipeplan.core.hardware.cluster import Cluster
from pipeplan.planner.request import PlanRequest
from pipeplan.planner.search.candidates import MAX_STAGES, Candidates
from pipeplan.planner.search.mapping import Layout
from pipeplan.planner.search.partition_dp import DpInputs, DpSolution, partition_dp
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
