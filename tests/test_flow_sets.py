"""Tests of sim/flow_sets.py: a plan's flows as the cost model defines them, and their reduction by symmetry
changing no simulated time."""

from __future__ import annotations

import dataclasses
import random
import sys
from collections.abc import Collection

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from models import linear_model
from pipeplan.core.hardware.bandwidth_trace import BandwidthTrace, TraceStep
from pipeplan.core.hardware.cluster import Cluster, Device
from pipeplan.core.plan import Plan, Stage
from pipeplan.core.profile import LayerProfile, ModelProfile
from pipeplan.planner.planners import run_planner
from pipeplan.planner.request import PlanRequest
from pipeplan.presets.resolve import load_cluster, load_profile
from pipeplan.schedules.plan_schedule import plan_schedule
from pipeplan.sim import simulate
from pipeplan.sim.cost import plan_costs as plan_costs_module
from pipeplan.sim.cost.flow_sets import REDUCE_FROM, FlowMemo, _flows, _representatives, plan_flows, transfer_pairs
from pipeplan.sim.cost.plan_costs import plan_costs
from pipeplan.sim.cost.types import Costs, Flow

GB = 1e9


def profile(layers: int) -> ModelProfile:
    """Layers with growing compute and cut sizes."""
    return ModelProfile("p", 12, tuple(LayerProfile(f"l{i}", 1.0 + i, 2.0 + i, 3e6 * (i + 1), 1e7, 1e6) for i in range(layers)))


def random_cluster(rng: random.Random, nodes: int, per_node: int) -> Cluster:
    """Two-level links with a few random overrides, a NIC or none, a message latency or none."""
    n = nodes * per_node
    devices = tuple(Device(i, "gpu", 64 * 2**30, 1.0, i // per_node) for i in range(n))
    bw = [[0.0 if a == b else (100 * GB if a // per_node == b // per_node else 10 * GB) for b in range(n)] for a in range(n)]
    lat = [[0.0 if a == b else (1e-3 if a // per_node == b // per_node else 1e-2) for b in range(n)] for a in range(n)]  # ms
    for _ in range(rng.randrange(3) if n > 1 else 0):
        a, b = rng.sample(range(n), 2)
        bw[a][b] = rng.choice((2 * GB, 40 * GB))
    nic = rng.choice((None, 5 * GB, 20 * GB))
    return Cluster("r", devices, tuple(map(tuple, bw)), tuple(map(tuple, lat)), nic, message_latency_ms=rng.choice((0.0, 2e-3)))


def random_plan(rng: random.Random, cluster: Cluster) -> Plan | None:
    """2-4 stages of 1-4 replicas, 1-3 pipeline replicas, on random or consecutive devices; None when they do not fit."""
    stages = rng.randrange(2, 5)
    replicas = [rng.choice((1, 2, 3, 4)) for _ in range(stages)]
    rp = rng.randrange(1, 4)
    need = rp * sum(replicas)
    if need > cluster.num_devices:
        return None
    devices = list(range(need)) if rng.random() < 0.5 else rng.sample(range(cluster.num_devices), need)
    cuts = sorted(rng.sample(range(1, 8), stages - 1))
    bounds = [0, *cuts, 8]
    out, at = [], 0
    for s in range(stages):
        out.append(Stage(bounds[s], bounds[s + 1] - 1, tuple(devices[at : at + rp * replicas[s]])))
        at += rp * replicas[s]
    return Plan(tuple(out), rp, rng.choice((2, 5)), 12, rng.choice(("1f1b", "gpipe")))


def reference_flows(plan: Plan, cluster: Cluster, src_stage: int, dst_stage: int, nbytes: float) -> tuple[Flow, ...]:
    """The cost model's definition, pair by pair in Python: the slowest pipeline replica's q pairs, each carrying
    nbytes / q over its pair (and both NICs across nodes), cross-node flows slowed by the other replicas' NIC share."""
    rp = plan.pipeline_replicas
    nic = cluster.nic_bytes_per_s
    q = min(plan.replicas_of(src_stage), plan.replicas_of(dst_stage))
    node = [d.node for d in cluster.devices]

    def pairs(t: int) -> list[tuple[int, int]]:
        return list(zip(plan.replica_devices(src_stage, t)[:q], plan.replica_devices(dst_stage, t)[:q], strict=True))

    def pair_time(a: int, b: int) -> float:
        return 0.0 if a == b else cluster.link_latency(a, b) + nbytes / q / cluster.link_bandwidth(a, b) * 1000.0

    best = max(range(rp), key=lambda t: (max(pair_time(a, b) for a, b in pairs(t)), -t))
    flows = []
    for a, b in pairs(best):
        if a == b:
            continue
        crossing = nic is not None and node[a] != node[b]
        resources = (f"pair:{a}->{b}",) + ((f"nic_out:{node[a]}", f"nic_in:{node[b]}") if crossing else ())
        flows.append(Flow(resources, (a, b), cluster.link_latency(a, b), nbytes / q / cluster.link_bandwidth(a, b) * 1000.0))
    if rp == 1 or nic is None:
        return tuple(flows)
    out_load: dict[int, int] = {}
    in_load: dict[int, int] = {}
    for t in range(rp):
        for a, b in pairs(t):
            if a != b and node[a] != node[b]:
                out_load[node[a]] = out_load.get(node[a], 0) + 1
                in_load[node[b]] = in_load.get(node[b], 0) + 1
    own_out = {x: sum(1 for f in flows if len(f.resources) > 1 and node[f.link[0]] == x) for x in set(node)}
    own_in = {x: sum(1 for f in flows if len(f.resources) > 1 and node[f.link[1]] == x) for x in set(node)}
    shared = []
    for f in flows:
        a, b = f.link
        if len(f.resources) > 1:
            share = max(out_load[node[a]] / own_out[node[a]], in_load[node[b]] / own_in[node[b]])
            if share > 1.0:
                moved = f.work_ms / 1000.0 * cluster.link_bandwidth(a, b)
                f = Flow(
                    f.resources, f.link, f.latency_ms, moved / min(cluster.bandwidth_bytes_per_s.at(a, b), nic / share) * 1000.0
                )
        shared.append(f)
    return tuple(shared)


@pytest.mark.slow
@given(st.integers(1, 5), st.integers(1, 4), st.randoms(use_true_random=False))
@settings(max_examples=120, deadline=None)
def test_flows_follow_the_definition_and_their_reduction_changes_no_time(nodes: int, per_node: int, rng: random.Random) -> None:
    """Unreduced flows equal the pair-by-pair definition exactly; the reduced ones give the same iteration time, to
    the bit, on random plans over random two-level clusters."""
    cluster = random_cluster(rng, nodes, per_node)
    plan = random_plan(rng, cluster)
    if plan is None:
        return
    model = linear_model(profile(8), cluster)
    cuts = [model.layers.cut_bytes(plan.stages[s].last_layer, plan.microbatch_size) for s in range(len(plan.stages) - 1)]
    forward, backward = plan_flows(plan, cluster, cuts, reduce_from=sys.maxsize)
    for s in range(len(plan.stages) - 1):
        assert forward[s] == reference_flows(plan, cluster, s, s + 1, cuts[s])
        assert backward[s] == reference_flows(plan, cluster, s + 1, s, cuts[s])
    stages = plan_costs(plan, model).stages  # no message overhead: the plain stage costs
    reduced = Costs(stages, *plan_flows(plan, cluster, cuts, reduce_from=0))
    full = Costs(stages, forward, backward)
    schedule = plan_schedule(plan)
    assert simulate(schedule, reduced).iteration_time == simulate(schedule, full).iteration_time
    assert sum(map(len, reduced.forward + reduced.backward)) <= sum(map(len, forward + backward))


def two_level(nodes: int, per_node: int, nic: float | None) -> Cluster:
    """nodes x per_node devices, 100 GB/s inside a node, 10 between."""
    n = nodes * per_node
    devices = tuple(Device(i, "gpu", 64 * 2**30, 1.0, i // per_node) for i in range(n))
    bw = tuple(
        tuple(0.0 if a == b else (100 * GB if a // per_node == b // per_node else 10 * GB) for b in range(n)) for a in range(n)
    )
    lat = tuple(tuple(0.0 if a == b else 5e-3 for b in range(n)) for a in range(n))
    return Cluster("two-level", devices, bw, lat, nic)


def test_a_stage_replicated_over_many_nodes_keeps_one_group_of_flows() -> None:
    """Two stages on 8 nodes each (64 pairs per transfer): one node pair's 8 flows stand for all 64, same time."""
    cluster = two_level(16, 8, 50 * GB)
    plan = Plan((Stage(0, 3, tuple(range(64))), Stage(4, 7, tuple(range(64, 128)))), 1, 4, 64, "1f1b")
    model = linear_model(profile(8), cluster)
    costs = plan_costs(plan, model)
    forward, backward = plan_flows(plan, cluster, [model.layers.cut_bytes(3, 64)], reduce_from=sys.maxsize)
    assert (len(forward[0]), len(backward[0])) == (64, 64)
    assert (len(costs.forward[0]), len(costs.backward[0])) == (8, 8)
    assert {f.link[0] // 8 for f in costs.forward[0]} == {0}  # the first node pair's group
    schedule = plan_schedule(plan)
    assert simulate(schedule, costs).iteration_time == simulate(schedule, Costs(costs.stages, forward, backward)).iteration_time


def test_flows_on_traced_links_are_kept() -> None:
    """A bandwidth trace on a link of a dropped copy: that link's group is kept and the time is the unreduced one."""
    cluster = two_level(16, 8, 50 * GB)
    plan = Plan((Stage(0, 3, tuple(range(64))), Stage(4, 7, tuple(range(64, 128)))), 1, 4, 64, "1f1b")
    model = linear_model(profile(8), cluster)
    trace = BandwidthTrace((TraceStep(0.0, (40, 104), 0.1),))
    costs = plan_costs(plan, model, trace)
    assert (40, 104) in {f.link for f in costs.forward[0]} and len(costs.forward[0]) == 16
    forward, backward = plan_flows(plan, cluster, [model.layers.cut_bytes(3, 64)], reduce_from=sys.maxsize)
    schedule = plan_schedule(plan)
    slowed = simulate(schedule, costs, trace=trace).iteration_time
    assert slowed == simulate(schedule, Costs(costs.stages, forward, backward), trace=trace).iteration_time
    assert slowed > simulate(schedule, costs).iteration_time
    assert np.isfinite(slowed)


def plain_plan_flows(
    plan: Plan,
    cluster: Cluster,
    cut_bytes: list[float],
    keep_links: Collection[tuple[int, int]] = (),
    reduce_from: int = REDUCE_FROM,
) -> tuple[tuple[tuple[Flow, ...], ...], tuple[tuple[Flow, ...], ...]]:
    """plan_flows as it was before FlowMemo: every transfer built anew, the reduction run on every plan of at least
    `reduce_from` flows (no shortcut for one flow per boundary). The reference the memo and the shortcut must equal."""
    count = len(plan.stages) - 1
    arrays = [transfer_pairs(plan, cluster, s, s + 1, cut_bytes[s]) for s in range(count)]
    arrays += [transfer_pairs(plan, cluster, s + 1, s, cut_bytes[s]) for s in range(count)]
    total = sum(len(a.src) for a in arrays)
    kept = _representatives(arrays, cluster, keep_links) if total and total >= reduce_from else None
    out, start = [], 0
    for pairs in arrays:
        end = start + len(pairs.src)
        chosen = np.arange(len(pairs.src)) if kept is None else np.flatnonzero(kept[start:end])
        out.append(_flows(cluster, pairs, chosen))
        start = end
    return tuple(out[:count]), tuple(out[count:])


def moved(rng: random.Random, plan: Plan, cluster: Cluster) -> Plan:
    """`plan` with one boundary shifted or two stages' devices swapped (what a search tries next), when it can."""
    stages = list(plan.stages)
    s = rng.randrange(len(stages) - 1)
    a, b = stages[s], stages[s + 1]
    if rng.random() < 0.5 and a.last_layer > a.first_layer:
        stages[s], stages[s + 1] = (
            Stage(a.first_layer, a.last_layer - 1, a.devices),
            Stage(b.first_layer - 1, b.last_layer, b.devices),
        )
    elif len(a.devices) == len(b.devices):
        stages[s], stages[s + 1] = Stage(a.first_layer, a.last_layer, b.devices), Stage(b.first_layer, b.last_layer, a.devices)
    return dataclasses.replace(plan, stages=tuple(stages))


@pytest.mark.slow
@given(st.integers(1, 5), st.integers(1, 4), st.randoms(use_true_random=False), st.sampled_from((0, 8, REDUCE_FROM)))
@settings(max_examples=80, deadline=None)
def test_a_memo_gives_the_plain_flows_over_a_walk_of_plans(
    nodes: int, per_node: int, rng: random.Random, reduce_from: int
) -> None:
    """Plans one move apart priced with one FlowMemo (the memo serves most transfers) give the same flows, equal
    field by field, as the plain build, with and without the reduction, with a traced link or none."""
    cluster = random_cluster(rng, nodes, per_node)
    plan = random_plan(rng, cluster)
    if plan is None:
        return
    model = linear_model(profile(8), cluster)
    memo = FlowMemo(cluster)
    keep = {(plan.stages[0].devices[0], plan.stages[1].devices[0])} if rng.random() < 0.3 else set()
    for _ in range(6):
        cuts = [model.layers.cut_bytes(plan.stages[s].last_layer, plan.microbatch_size) for s in range(len(plan.stages) - 1)]
        expected = plain_plan_flows(plan, cluster, cuts, keep, reduce_from)
        assert plan_flows(plan, cluster, cuts, keep, reduce_from, memo=memo) == expected
        assert plan_flows(plan, cluster, cuts, keep, reduce_from) == expected
        plan = moved(rng, plan, cluster)
    assert len(memo) >= 2 * (len(plan.stages) - 1)


def test_a_memo_for_another_cluster_is_not_read() -> None:
    """A FlowMemo of one cluster holds nothing a plan on another (same shape, other links) may take."""
    plan = Plan((Stage(0, 3, (0, 1)), Stage(4, 7, (2, 3))), 1, 4, 64, "1f1b")
    fast, slow = two_level(2, 2, None), two_level(1, 4, None)
    memo = FlowMemo(fast)
    plan_flows(plan, fast, [1e6], memo=memo)
    assert plan_flows(plan, slow, [1e6], memo=memo) == plain_plan_flows(plan, slow, [1e6]) != plain_plan_flows(plan, fast, [1e6])
    assert len(memo) == 2


def test_one_flow_per_boundary_keeps_every_flow() -> None:
    """A straight pipeline of 40 stages (78 flows, above REDUCE_FROM, one per boundary) keeps all: the shortcut
    gives what the reduction gives."""
    cluster = two_level(5, 8, 20 * GB)
    plan = Plan(tuple(Stage(s, s, (s,)) for s in range(40)), 1, 4, 64, "1f1b")
    cuts = [1e6 + s for s in range(39)]
    forward, backward = plan_flows(plan, cluster, cuts)
    assert sum(map(len, forward + backward)) == 78 >= REDUCE_FROM
    assert (forward, backward) == plain_plan_flows(plan, cluster, cuts)


SEARCHED = [("pipedream/resnet50", "a100-8x2", 2048), ("dapple/amoeba-18", "hetero-a100-v100", 256)]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "cluster_name", "batch"), SEARCHED)
def test_the_search_on_shared_profiles_prices_the_plain_flows(
    monkeypatch: pytest.MonkeyPatch, name: str, cluster_name: str, batch: int
) -> None:
    """pipeplan's search on shared profiles and presets: every plan it prices gets, through its Evaluator's memo,
    exactly the flows the plain build gives (so the plan is the one the plain build chooses); the memo is read."""
    seen = {"plans": 0, "served": 0}

    def checked(
        plan: Plan,
        cluster: Cluster,
        cut_bytes: list[float],
        keep: Collection[tuple[int, int]] = (),
        reduce_from: int = REDUCE_FROM,
        memo: FlowMemo | None = None,
    ) -> object:
        before = 0 if memo is None else len(memo)
        got = plan_flows(plan, cluster, cut_bytes, keep, reduce_from, memo)
        assert got == plain_plan_flows(plan, cluster, cut_bytes, keep, reduce_from)
        seen["plans"] += 1
        seen["served"] += memo is not None and len(memo) - before < 2 * (len(plan.stages) - 1)
        return got

    monkeypatch.setattr(plan_costs_module, "plan_flows", checked)
    request = PlanRequest(load_profile(name), load_cluster(cluster_name), batch)
    run_planner("pipeplan", request)
    assert seen["plans"] > 10 and seen["served"] > 0
