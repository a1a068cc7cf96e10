"""Tests of the pipedream baseline: its DP (pipedream_dp), levels (pipedream_levels), graph and request path."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipedream_cases import case, graph
from pipeplan.core.errors import PlanError
from pipeplan.core.hardware.cluster import Cluster, Device
from pipeplan.io.profile_json import profile_from_json
from pipeplan.planner.baselines import pipedream_dp
from pipeplan.planner.baselines.pipedream import plan_pipedream
from pipeplan.planner.baselines.pipedream_dp import LevelInputs, LevelOptions, level_dp, unwind
from pipeplan.planner.baselines.pipedream_graph import graph_of_profile
from pipeplan.planner.baselines.pipedream_levels import levels_of
from pipeplan.planner.baselines.pipedream_planner import plan_graph
from pipeplan.planner.request import PlanRequest
from pipeplan.presets.resolve import load_cluster, load_profile
from pipeplan.sim.cost.memory import check_fits


def chain_inputs(work: list[float], params: list[float], cut: list[float]) -> LevelInputs:
    """Level tables of a chain whose states are its prefixes (state i = layers 0..i)."""
    n = len(work)
    valid = np.vstack([np.ones((1, n), dtype=bool), np.triu(np.ones((n, n), dtype=bool), 1)])
    w, p = np.cumsum(work), np.cumsum(params)

    def table(values: np.ndarray, missing: float) -> np.ndarray:
        return np.where(valid, np.vstack([values[None, :], values[None, :] - values[:, None]]), missing)

    return LevelInputs(
        table(w, np.inf), table(np.zeros(n), 0.0), table(p, 0.0), np.asarray(cut, dtype=float), [np.arange(j) for j in range(n)]
    )


def test_level_dp_hand_case() -> None:
    """Costly replication (big weights, slow link) makes PipeDream split [4 | 1, 1] over 2 units; cheap weights
    make one stage on both units (6 / 2) best."""
    heavy = chain_inputs([4.0, 1.0, 1.0], [1e6, 0.0, 0.0], [0.0, 0.0, 0.0])
    opt = LevelOptions(units=2, bandwidth_bytes_per_s=1e6, within=1, final=True)
    time = level_dp(heavy, opt)
    assert time[0, 2, 1] == pytest.approx(4.0)
    assert unwind(time, heavy, opt, 0, 2) == ([(0, 0, 1), (1, 2, 1)], True)
    cheap = chain_inputs([4.0, 1.0, 1.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0])
    assert level_dp(cheap, opt)[0, 2, 1] == pytest.approx(3.0)
    assert unwind(level_dp(cheap, opt), cheap, opt, 0, 2)[0] == [(0, 2, 2)]


def test_activation_transfers_count_only_with_a_compression_ratio() -> None:
    """A 1 GB cut at 1 GB/s costs 2 s each way on a split only when a ratio is given; ratio 4 divides it by 4."""
    inputs = chain_inputs([1000.0, 1000.0], [0.0, 0.0], [1e9, 0.0])
    base = LevelOptions(units=2, bandwidth_bytes_per_s=1e9, within=1, final=True, straight=True)
    assert level_dp(inputs, base)[0, 1, 1] == pytest.approx(1000.0)
    assert level_dp(inputs, replace(base, compression=1.0))[0, 1, 1] == pytest.approx(2000.0)
    assert level_dp(inputs, replace(base, compression=4.0))[0, 1, 1] == pytest.approx(1000.0)


def test_fast_search_equals_the_scan_of_every_replica_count() -> None:
    """Above BRUTE_UNITS the binary search gives the same floats as scanning every m' (random chains, switches)."""
    rng = np.random.default_rng(7)
    for _ in range(40):
        n = int(rng.integers(2, 9))
        inputs = chain_inputs(
            list(rng.uniform(0, 10, n)), list(rng.uniform(0, 1e8, n) * (rng.random(n) < 0.5)), list(rng.uniform(0, 1e8, n))
        )
        opt = LevelOptions(
            units=int(rng.integers(2, 40)),
            bandwidth_bytes_per_s=float(rng.choice([3e8, 1e9, 1e10])),
            within=int(rng.integers(1, 4)),
            final=bool(rng.random() < 0.5),
            straight=bool(rng.random() < 0.2),
            fewer=bool(rng.random() < 0.5),
            compression=None if rng.random() < 0.5 else 1.0,
            allowed=None if rng.random() < 0.5 else frozenset({1, 2, 4, 8, 16, 32}),
        )
        scanned = level_dp(inputs, opt)
        try:
            pipedream_dp.BRUTE_UNITS, saved = 1, pipedream_dp.BRUTE_UNITS
            searched = level_dp(inputs, opt)
        finally:
            pipedream_dp.BRUTE_UNITS = saved
        assert np.array_equal(scanned, searched)


def test_levels_follow_machines() -> None:
    """Two DGX-1: -n 8 2 at the host path inside and the NIC between; sixteen 1-GPU servers: one level of 16."""
    two = levels_of(load_cluster("v100-8x2-25g"))
    assert two.units == (8, 2) and two.bandwidths_bytes_per_s == (1e10, 3.125e9)
    assert list(two.grid) == list(range(16))
    flat = levels_of(load_cluster("v100-1x16-25g"))
    assert flat.units == (16,) and flat.describe() == "-n 16 -b 3.125e+09"


def test_levels_find_racks_in_the_links() -> None:
    """Four 2-GPU machines in two racks (fast links inside a rack) give three levels, -n 2 2 2."""
    devices = tuple(Device(i, "V100", 16e9, node=i // 2) for i in range(8))
    rack = np.array([i // 4 for i in range(8)])
    machine = np.array([i // 2 for i in range(8)])
    rate = np.where(machine[:, None] == machine[None, :], 100e9, np.where(rack[:, None] == rack[None, :], 20e9, 5e9))
    np.fill_diagonal(rate, 0.0)
    cluster = Cluster("racks", devices, rate, np.zeros((8, 8)))
    levels = levels_of(cluster)
    assert levels.units == (2, 2, 2) and levels.bandwidths_bytes_per_s == (100e9, 20e9, 5e9)


def test_memory_rule_without_a_plan_names_the_rule_and_the_memory() -> None:
    """vgg16 on 4 straight GPUs with 100 MB each: no plan; the message names the rule, the memory and the node."""
    c = case("vgg16-pbs-128__c4straight-mem16__acts")
    with pytest.raises(PlanError, match=r"memory rule \(--use_memory_constraint\) with 0.09 GiB.*heaviest node node\d+"):
        plan_graph(graph(c.profile), replace(c.options, memory_bytes=1e8))


def test_straight_pipeline_on_more_gpus_than_layers_says_so() -> None:
    """A straight pipeline needs a stage per GPU: 64 GPUs for alexnet's 21 planning nodes is refused with why."""
    c = case("alexnet-pbs-256__c4straight__acts")
    with pytest.raises(PlanError, match="straight pipeline over 64 units needs 64 stages"):
        plan_graph(graph(c.profile), replace(c.options, units=(64,), bandwidths_bytes_per_s=(1e10,)))


def test_request_plan_covers_layers_with_disjoint_devices() -> None:
    """PipeDream on two DGX-1: every layer in one stage, each device in at most one stage, 1F1B, and it fits."""
    request = PlanRequest(load_profile("dapple/bert-24"), load_cluster("v100-8x2-25g"), 128)
    result = plan_pipedream(request)
    plan = result.plan
    used = [d for s in plan.stages for d in s.devices]
    assert len(used) == len(set(used)) and plan.num_layers == request.profile.num_layers
    assert plan.schedule == "1f1b" and plan.pipeline_replicas == 1
    assert result.extra["flags"] == "-n 8 2 -b 1e+10 3.125e+09"
    check_fits(plan, request.model)


def test_request_keeps_the_originals_odd_replica_counts_when_the_batch_splits() -> None:
    """alexnet on sixteen 1-GPU servers: the original replicates the first stage 14 times; with a global batch of
    14 x 64 the baseline runs that plan, with 256 it falls back to counts dividing the batch and says so."""
    profile, cluster = load_profile("pipedream/alexnet"), load_cluster("v100-1x16-25g")
    odd = plan_pipedream(PlanRequest(profile, cluster, 14 * 64))
    assert odd.extra["replicas"][0] == 14 and odd.extra["plan"] == "the original's plan"
    even = plan_pipedream(PlanRequest(profile, cluster, 256))
    assert "limited to divisors of 256" in even.extra["plan"]
    assert all(256 % r == 0 for r in even.extra["replicas"])


def test_a_profiles_dag_plans_as_the_original_read_the_file() -> None:
    """resnet50's built-in profile (its DAG in layer_inputs) gives the original's predicted time over two DGX-1s,
    with the original's replica counts [8, 4, 2, 2], as the graph.txt the original read does."""
    c = case("resnet50-pbs-128__b8x2__acts")
    found = plan_graph(graph_of_profile(load_profile("pipedream/resnet50")), c.options)
    assert found.predicted_ms == pytest.approx(c.predicted_ms, rel=1e-9)
    assert [s.replicas for s in found.stages] == [8, 4, 2, 2]


def test_more_states_than_the_limit_are_refused_before_any_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """A chain of STATE_LIMIT + 1 layers is refused naming the limit and the way out, before the per-state
    membership matrix (the first quadratic table) is built."""
    from pipeplan.planner.baselines import downset_tables as downsets
    from pipeplan.planner.baselines.pipedream_planner import STATE_LIMIT

    def no_tables(*args: object) -> None:
        raise AssertionError("a per-state table was built")

    monkeypatch.setattr(downsets, "mask_matrix", no_tables)
    n = STATE_LIMIT + 1
    layers = [{"name": f"l{i}", "fwd_ms": 1.0, "bwd_ms": 2.0, "activation_bytes": 10, "param_bytes": 10} for i in range(n)]
    profile = profile_from_json({"name": "deep", "batch_size": 1, "layers": layers})
    with pytest.raises(PlanError, match=r"more than 8,000 reachable down-sets .* use --planner pipeplan"):
        plan_pipedream(PlanRequest(profile, load_cluster("v100-8x1"), 8))


@st.composite
def downset_inputs(draw: st.DrawFn) -> LevelInputs:
    """Level tables of a random DAG of 1-5 nodes: its non-empty down-sets as states (by size), node costs from a few
    values (ties), rows where a state's down-set is not inside the column's set left undefined (inf / 0)."""
    nodes = draw(st.integers(1, 5))
    edges = [(a, b) for b in range(nodes) for a in range(b) if draw(st.booleans())]
    masks = [s for s in range(1, 1 << nodes) if all(s >> a & 1 for a, b in edges if s >> b & 1)]
    masks.sort(key=lambda s: (bin(s).count("1"), s))
    work = [draw(st.sampled_from([0.5, 1.0, 2.0])) for _ in range(nodes)]
    params = [draw(st.sampled_from([0.0, 1e6, 5e6])) for _ in range(nodes)]
    acts = [draw(st.sampled_from([0.0, 2e6])) for _ in range(nodes)]
    count = len(masks)
    preds = [
        np.array([k for k in range(count) if masks[k] != masks[j] and masks[k] & ~masks[j] == 0], dtype=np.int64)
        for j in range(count)
    ]
    compute = np.full((count + 1, count), np.inf)
    act, par = np.zeros((count + 1, count)), np.zeros((count + 1, count))
    for j in range(count):
        for r in [0, *(k + 1 for k in preds[j])]:
            nodes_in = [i for i in range(nodes) if (masks[j] & ~(masks[r - 1] if r else 0)) >> i & 1]
            compute[r, j] = sum(work[i] for i in nodes_in)
            par[r, j] = sum(params[i] for i in nodes_in)
            act[r, j] = sum(acts[i] for i in nodes_in)
    cut = np.array([draw(st.sampled_from([0.0, 1e6, 3e6])) for _ in range(count)])
    return LevelInputs(compute, act, par, cut, preds)


def plain_level(t: LevelInputs, opt: LevelOptions) -> np.ndarray:
    """The module docstring's recurrence cell by cell: every (row, column, m) over every split k and count m',
    with the module's own stage costs (last_stage_ms, _memory_mask) and single stages (single_stage_ms)."""
    rows = 1 if opt.final else t.compute_ms.shape[0]
    n = opt.units
    time = pipedream_dp.single_stage_ms(t, opt, slice(0, rows), slice(None))
    for j, ks in enumerate(t.preds):
        if len(ks) and n > 1:
            stage = pipedream_dp.last_stage_ms(t, opt, ks, j)
            for r in range(rows):
                for m in range(1, n):
                    top = 1 if opt.straight else m
                    mask = pipedream_dp._memory_mask(t, opt, ks, j, m, top)
                    best = time[r, j, m]
                    for x, k in enumerate(ks):
                        for mp in range(1, top + 1):
                            cost = np.inf if mask[x, mp - 1] else stage[x, mp - 1]
                            best = min(best, max(time[r, k, m - mp], cost))
                    time[r, j, m] = best
        if opt.fewer:
            time[:, j, :] = np.minimum.accumulate(time[:, j, :], axis=1)
    return time


@settings(max_examples=120, deadline=None)
@given(
    downset_inputs(),
    st.integers(1, 5),
    st.booleans(),
    st.booleans(),
    st.booleans(),
    st.sampled_from([None, 1.0]),
    st.sampled_from([None, 3e6, 2e7]),
    st.sampled_from([None, frozenset({1, 2}), frozenset({1, 3})]),
    st.booleans(),
)
def test_level_dp_over_named_pairs_equals_the_plain_recurrence(
    inputs: LevelInputs,
    units: int,
    final: bool,
    straight: bool,
    fewer: bool,
    compression: float | None,
    memory: float | None,
    allowed: frozenset[int] | None,
    search: bool,
) -> None:
    """level_dp (below the top level: only the (row, split) pairs whose row names a node set of the split, then the
    least per row) equals the recurrence evaluated cell by cell, bit for bit, with every switch, and with the binary
    search or the listed counts standing in for the scan (BRUTE_UNITS lowered)."""
    opt = LevelOptions(units, 1e9, 2, final, straight, fewer, compression, memory, allowed)
    saved = pipedream_dp.BRUTE_UNITS
    try:
        pipedream_dp.BRUTE_UNITS = 0 if search else saved
        got = level_dp(inputs, opt)
    finally:
        pipedream_dp.BRUTE_UNITS = saved
    assert np.array_equal(got, plain_level(inputs, opt))
