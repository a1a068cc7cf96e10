"""Planners and bounds with shared parameters: exact still exact, bounds still below it, the exchange chosen or
avoided on its price, and a group no device can hold refused before planning."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from bound_exact import exact_ms
from cli_runner import run
from pipeplan.core.errors import PlanError
from pipeplan.core.hardware.cluster import Cluster, Device
from pipeplan.core.profile import LayerProfile, ModelProfile, SharedGroup
from pipeplan.core.shared_params import overlap_bytes
from pipeplan.io.profile_json import write_profile_json
from pipeplan.planner.baselines.layer_groups import merge_layers
from pipeplan.planner.bound.shape_bounds import lower_bound
from pipeplan.planner.exact import plan_exact
from pipeplan.planner.planners import PLANNERS
from pipeplan.planner.request import PlanRequest
from pipeplan.planner.search.partition_dp import shared_overlap
from pipeplan.sim.cost.memory import check_fits
from pipeplan.sim.plan_sim import simulate_plan
from planner_instances import random_cluster, random_profile
from test_exact import brute_force

GIB = float(1 << 30)
GB = 1e9


def with_group(profile: ModelProfile, members: tuple[int, ...]) -> ModelProfile:
    """`profile` whose layers `members` hold one weight as large as the smallest of their parameters."""
    tie = min(profile.layers[u].param_bytes for u in members)
    return dataclasses.replace(profile, shared_params=(SharedGroup("w", members, tie),))


def tied_chain(tie: float, compute_ms: float = 50.0) -> ModelProfile:
    """Embedding, two blocks, head; the head holds the embedding's `tie`-byte weight."""
    params = (tie, 0.05 * GIB, 0.05 * GIB, tie + 1e6)
    layers = tuple(LayerProfile(f"l{i}", compute_ms, 2 * compute_ms, 1e6, p) for i, p in enumerate(params))
    return ModelProfile("tied", 8, layers, "V100", shared_params=(SharedGroup("l0.weight", (0, 3), tie),))


def two_devices(bandwidth: float, memory: float = 32 * GIB) -> Cluster:
    """Two V100-kind devices on one link of `bandwidth` bytes/s, 10 us."""
    devices = tuple(Device(i, "V100", memory, 1.0, i) for i in range(2))
    return Cluster("pair", devices, ((0.0, bandwidth), (bandwidth, 0.0)), ((0.0, 1e-2), (1e-2, 0.0)))


@pytest.mark.parametrize("seed", [0, 1])
def test_exact_equals_brute_force_with_a_tied_pair(seed: int) -> None:
    """4 layers on 3 devices, layers 0 and 3 tied: branch and bound finds the brute-force optimum of the cost model
    that prices the exchange and holds the weight once per stage."""
    request = PlanRequest(with_group(random_profile(seed, 4), (0, 3)), random_cluster(seed, 3, memory_gib=4.0), 4)
    best = brute_force(request)
    assert math.isfinite(best)
    assert plan_exact(request).iteration_time == pytest.approx(best, rel=1e-12)


def test_dedup_makes_a_plan_fit_that_would_not_with_the_weight_counted_twice() -> None:
    """A 2 GiB tied weight on one 12 GiB device: the one-stage plan holds (2 + 0.1) GiB x 4 = 8.4 GiB and fits (it
    would need 16.4 GiB counted twice); exact finds it."""
    profile = tied_chain(2 * GIB)
    cluster = Cluster("one", (Device(0, "V100", 12 * GIB, 1.0, 0),), ((0.0,),), ((0.0,),))
    result = plan_exact(PlanRequest(profile, cluster, 8))
    assert len(result.plan.stages) == 1
    assert max(result.memory_per_device) < 12 * GIB
    untied = dataclasses.replace(profile, shared_params=())
    with pytest.raises(PlanError, match="no plan that fits in memory"):
        plan_exact(PlanRequest(untied, cluster, 8))


def test_bounds_count_a_tied_weight_once_so_a_plan_that_fits_only_deduped_is_not_bounded_away() -> None:
    """The instance above, and the same on two such devices (data parallelism all-reduces the weight once): both
    bounds stay at most exact's optimum (counting the weight twice, they would call every plan too large)."""
    one = Cluster("one", (Device(0, "V100", 12 * GIB, 1.0, 0),), ((0.0,),), ((0.0,),))
    for cluster in (one, two_devices(10 * GB, 12 * GIB)):
        request = PlanRequest(tied_chain(2 * GIB), cluster, 8)
        best = exact_ms(request)
        assert lower_bound(request).ms <= best * (1 + 1e-12)
        assert lower_bound(request, stages=True).ms <= best * (1 + 1e-12)


@settings(max_examples=15, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    layers=st.integers(2, 5),
    devices=st.integers(1, 3),
    batch=st.sampled_from([1, 2, 4]),
    data=st.data(),
)
def test_bounds_stay_below_exact_with_groups(seed: int, layers: int, devices: int, batch: int, data: st.DataObject) -> None:
    """On random small instances with a random tied group, both bounds are at most exact's (unpruned) optimum."""
    members = tuple(sorted(data.draw(st.sets(st.integers(0, layers - 1), min_size=2, max_size=min(3, layers)))))
    memory = data.draw(st.sampled_from([3.0, 6.0, 16.0]))  # tight memory: dedup decides what fits
    request = PlanRequest(with_group(random_profile(seed, layers), members), random_cluster(seed, devices, memory), batch)
    try:
        best = exact_ms(request)
    except PlanError:
        assume(False)  # nothing fits: no optimum to bound
    assert lower_bound(request).ms <= best * (1 + 1e-12)
    assert lower_bound(request, stages=True).ms <= best * (1 + 1e-12)


def test_the_planner_keeps_the_pair_together_when_the_exchange_costs_more_than_splitting_saves() -> None:
    """A 1 GiB tied weight over a 0.5 GB/s link: the exchange (2.1 s) dwarfs the compute, so both planners keep
    every layer on one device; the same model counted once (nothing to exchange) is split over both devices."""
    tied, slow = tied_chain(GIB), two_devices(0.5 * GB)
    untied = dataclasses.replace(
        tied, layers=(*tied.layers[:3], dataclasses.replace(tied.layers[3], param_bytes=1e6)), shared_params=()
    )
    for name in ("pipeplan", "exact"):
        together = PLANNERS[name](PlanRequest(tied, slow, 8))
        assert len({d for s in together.plan.stages for d in s.devices}) == 1, name
        assert together.costs.shared == ()
        apart = PLANNERS[name](PlanRequest(untied, slow, 8))
        assert len({d for s in apart.plan.stages for d in s.devices}) == 2, name


def test_the_planner_splits_and_pays_the_exchange_on_a_fast_link() -> None:
    """On a 100 GB/s link the 1 GiB exchange takes ~21.5 ms, less than pipelining saves over one device (data
    parallelism ruled out): the plan splits the pair, its simulated time includes the exchange, `plan --json` says so."""
    request = PlanRequest(tied_chain(GIB), two_devices(100 * GB), 8, replication="none")
    result = PLANNERS["pipeplan"](request)
    (x,) = result.costs.shared
    assert x.exchange_ms == pytest.approx(GIB / (100 * GB) * 1000 + 2 * 1e-5 * 1000, rel=1e-12)
    assert result.iteration_time == simulate_plan(result.plan, request.model, record=False).iteration_time
    (entry,) = result.to_json("tied", "pair", request.profile)["shared_parameters"]
    assert entry["layers"] == [0, 3] and entry["exchange_ms"] == x.exchange_ms and len(entry["stages"]) == 2


def test_every_planner_returns_a_plan_that_fits_and_is_timed_with_the_exchange() -> None:
    """Each registered planner on an 8-layer random model with layers 0 and 7 tied, 4 devices: its plan fits and its
    reported time is the simulator's (exchange included)."""
    request = PlanRequest(with_group(random_profile(5, 8), (0, 7)), random_cluster(5, 4), 16)
    for name, planner in PLANNERS.items():
        if name == "exact":
            continue
        result = planner(request)
        check_fits(result.plan, request.model)
        assert result.iteration_time == pytest.approx(
            simulate_plan(result.plan, request.model, record=False).iteration_time, rel=1e-12
        ), name


def test_a_group_no_device_can_hold_is_refused_before_planning() -> None:
    """A 5 GiB tied weight with Adam needs 20 GiB on any device holding a copy; 16 GiB devices: one PlanError saying so."""
    with pytest.raises(
        PlanError, match=r"shared parameter 'l0.weight' of tied \(5.00 GiB, held by layers 0, 3\) needs 20.00 GiB"
    ):
        PlanRequest(tied_chain(5 * GIB), two_devices(10 * GB, 16 * GIB), 8)
    PlanRequest(tied_chain(5 * GIB), two_devices(10 * GB, 16 * GIB), 8, optimizer="sgd")  # 10 GiB: fits


def test_the_cli_refuses_an_unplaceable_group_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`pipeplan plan` on such a profile: exit 2, one stderr line naming the parameter and the way out, no stdout."""
    path = tmp_path / "tied.json"
    write_profile_json(tied_chain(5 * GIB), path)
    code, out, err = run(monkeypatch, capsys, "plan", "--profile", str(path), "--cluster", "v100-8x1", "--global-batch", "8")
    assert code == 2 and out == ""
    assert err.count("\n") == 1
    assert err.startswith("error: PlanError: no plan fits in memory: shared parameter 'l0.weight'")
    assert "--optimizer sgd" in err
    code, out, _ = run(
        monkeypatch,
        capsys,
        "plan",
        "--profile",
        str(path),
        "--cluster",
        "v100-8x1",
        "--global-batch",
        "8",
        "--optimizer",
        "sgd",
        "--json",
    )
    assert code == 0
    assert [g["name"] for g in json.loads(out)["shared_parameters"]] == ["l0.weight"]


def test_no_plan_fits_says_which_stages_hold_a_copy_of_the_shared_weight() -> None:
    """A 3.9 GiB tied weight (15.6 GiB with Adam) in a 4.1 GiB embedding on 16 GiB devices: no stage holding the
    embedding fits; pipeplan's refusal names the group, its size and the stages holding copies, exact's the group."""
    layers = (
        LayerProfile("emb", 1.0, 2.0, 1e3, 4.1 * GIB),
        LayerProfile("block", 5.0, 10.0, 1e3, 0.5 * GIB),
        LayerProfile("head", 1.0, 2.0, 1e3, 3.9 * GIB),
    )
    profile = ModelProfile("tight", 8, layers, "V100", shared_params=(SharedGroup("emb.weight", (0, 2), 3.9 * GIB),))
    request = PlanRequest(profile, two_devices(10 * GB, 16 * GIB), 8)
    with pytest.raises(
        PlanError, match=r"GiB too much .*\(shared parameters: 'emb.weight' takes 15.60 GiB on stages 0, 1, a copy each\)"
    ):
        PLANNERS["pipeplan"](request)
    with pytest.raises(PlanError, match=r"keeps a whole copy: 'emb.weight' 15.60 GiB\); try more devices"):
        plan_exact(request)


def test_partition_dp_overlap_matches_the_set_rule_on_every_block_span() -> None:
    """The DP's [i, j] overlap over blocks equals core.shared_params.overlap_bytes of the blocks' layers."""
    groups = (SharedGroup("a", (0, 3, 6), 5.0), SharedGroup("b", (2, 7), 3.0))
    blocks = ((0, 1), (2, 3), (4, 5), (6, 7))
    got = shared_overlap(groups, blocks)
    assert isinstance(got, np.ndarray)
    for i in range(4):
        for j in range(i, 4):
            assert got[i, j] == overlap_bytes(groups, set(range(blocks[i][0], blocks[j][1] + 1)))


def test_merged_blocks_keep_groups_between_blocks_and_hold_each_weight_once_inside_one() -> None:
    """Merging 8 layers into 2 blocks: a group inside block 0 is deduped there; one across blocks names both."""
    layers = tuple(LayerProfile(f"l{i}", 1.0, 2.0, 8.0, 10.0) for i in range(8))
    profile = ModelProfile("p", 2, layers, shared_params=(SharedGroup("in", (0, 1), 4.0), SharedGroup("across", (2, 6), 6.0)))
    merged = merge_layers(profile, 2).profile
    assert [x.param_bytes for x in merged.layers] == [36.0, 40.0]
    assert merged.shared_params == (SharedGroup("across", (0, 1), 6.0),)
    assert merged.total_param_bytes == profile.total_param_bytes == 70.0
