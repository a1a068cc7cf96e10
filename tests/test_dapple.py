"""Tests of the dapple baseline's plans on pipeplan requests: scale caps, replication, memory, determinism."""

from __future__ import annotations

import pytest

from pipeplan.core.errors import PlanError
from pipeplan.io.cluster_json import cluster_from_json, cluster_to_json
from pipeplan.planner.baselines.dapple.baseline import plan_dapple, planning_model
from pipeplan.planner.baselines.dapple.comm_times import rates_of
from pipeplan.planner.baselines.dapple.gpus import machines_of
from pipeplan.planner.baselines.dapple.ranking import FAITHFUL_GPUS, Links, candidates
from pipeplan.planner.request import PlanRequest
from pipeplan.presets.resolve import load_cluster, load_profile
from pipeplan.sim.cost.memory import check_fits


def links_of(request: PlanRequest) -> Links:
    """DAPPLE's view of the request's cluster."""
    return Links(machines_of(request.cluster)[0], rates_of(request.cluster))


def test_machines_and_rates_come_from_the_cluster() -> None:
    """Two DGX-1: machines of 8 GPUs in device order, the slowest link inside a machine and between machines."""
    cluster = load_cluster("v100-8x2-25g")
    machines, device_of = machines_of(cluster)
    assert machines.ends == (8, 16) and device_of == tuple(range(16))
    rates = rates_of(cluster)
    assert rates.remote_p2p == rates.remote_collective < rates.local


def test_every_pipeline_count_is_a_candidate_on_a_small_cluster() -> None:
    """On 16 GPUs DAPPLE tries p = 1..16 with floor(16/p) replicas (idle GPUs allowed: p = 5 has 3 replicas)."""
    request = PlanRequest(load_profile("dapple/bert-24"), load_cluster("v100-8x2-25g"), 128)
    links = links_of(request)
    model, _ = planning_model(request, links)
    labels = {c.label for c in candidates(model, links)}
    assert {f"p={p} rp={16 // p}" for p in range(1, 17)} <= labels
    assert "straight p=5 rp=3" in labels and any(label.startswith("two stages") for label in labels)


def test_large_cluster_keeps_only_placement_free_pipelines_up_to_the_cap() -> None:
    """Above FAITHFUL_GPUS (1,024 H100): p up to 64, each with more replicas than a machine has GPUs."""
    request = PlanRequest(load_profile("dapple/bert-48"), load_cluster("h100-8x128"), 2048)
    links = links_of(request)
    assert links.machines.gpus > FAITHFUL_GPUS
    model, _ = planning_model(request, links)
    found = candidates(model, links)
    hybrid = [c for c in found if c.label.startswith("p=")]
    assert {c.label for c in hybrid} == {f"p={p} rp={1024 // p}" for p in range(1, 65)}
    assert all(c.replicas > 8 for c in hybrid)


def test_a_graph_too_big_for_the_set_dp_is_planned_over_blocks() -> None:
    """resnet50 (240 states) on two DGX-1: the GPU-set DP would be slow, so its layers are merged into 48 blocks;
    on one machine the placement-free DP takes the graph's own 240 states."""
    profile = load_profile("pipedream/resnet50")
    two = PlanRequest(profile, load_cluster("v100-8x2-25g"), 256)
    model, blocks = planning_model(two, links_of(two))
    assert blocks is not None and model.count <= 48
    one = PlanRequest(profile, load_cluster("v100-8x1"), 256)
    model, blocks = planning_model(one, links_of(one))
    assert blocks is None and model.count == 240


def test_dapple_plan_of_a_dag_fits_and_covers_every_layer() -> None:
    """gnmt (a DAG) on 8 V100s: a plan that fits, whose stages hold every layer once."""
    request = PlanRequest(load_profile("pipedream/gnmt"), load_cluster("v100-8x1"), 256)
    result = plan_dapple(request)
    check_fits(result.plan, request.model)
    covered = sum(s.last_layer - s.first_layer + 1 for s in result.plan.stages)
    assert covered == request.profile.num_layers and result.extra["states"] == 99


def test_replication_none_keeps_one_straight_pipeline() -> None:
    """With --replication none the plan is one pipeline of one-GPU stages."""
    request = PlanRequest(load_profile("dapple/bert-48"), load_cluster("v100-8x1"), 64, replication="none")
    plan = plan_dapple(request).plan
    assert plan.pipeline_replicas == 1 and all(len(s.devices) == 1 for s in plan.stages)


def test_no_plan_in_memory_names_the_best_candidate_and_its_overflow() -> None:
    """vgg16 on GPUs of 0.5 GiB: no candidate fits; the message names the best-ranked one and by how much."""
    small = cluster_to_json(load_cluster("v100-8x1"))
    for device in small["devices"]:
        device["memory_gb"] = 0.5
    request = PlanRequest(load_profile("pipedream/vgg16"), cluster_from_json(small, "small"), 64)
    with pytest.raises(PlanError, match=r"planner 'dapple' found no plan .* no candidate fits in memory; the best-ranked: .*GiB"):
        plan_dapple(request)


def test_no_straight_pipeline_for_more_devices_than_states() -> None:
    """Replication none on 1,024 GPUs with 55 states: no candidate, and the message says why."""
    request = PlanRequest(load_profile("dapple/bert-48"), load_cluster("h100-8x128"), 1024, replication="none")
    with pytest.raises(PlanError, match="has no candidate under replication 'none' on 1024 GPUs"):
        plan_dapple(request)
