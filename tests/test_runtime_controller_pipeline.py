"""The runtime controller's pipeline: each boundary's flows are the runtime's pieces, one per process pair."""

from __future__ import annotations

import dataclasses

import pytest

from pipeplan.adapt import AdaptiveController, ControllerConfig, PipelineModel
from pipeplan.core.plan import Plan
from pipeplan.io.plan_json import plan_from_json
from pipeplan.runtime.measurement.controller_pipeline import measured_pipeline, pieces, plan_pipeline, runtime_pipeline
from pipeplan.runtime.placement import Topology
from pipeplan.runtime.transport.link_emulation import EmulatedLinks, LinkRate
from pipeplan.schedules.registry import make_schedule
from pipeplan.sim.cost.types import StageCost


def plan_of(devices: list[list[int]], copies: int, microbatch_size: int) -> Plan:
    """A kfkb plan (k = 2, m = 4) of two 2-layer stages on `devices`."""
    plan, _ = plan_from_json({
        "format": "pipeplan.plan/1", "profile": "p.json", "cluster": "c.json", "pipeline_replicas": copies,
        "microbatches": 4, "microbatch_size": microbatch_size, "schedule": "kfkb", "k": 2, "chunks": 1, "order": None,
        "stages": [{"first_layer": 0, "last_layer": 1, "devices": devices[0]},
                   {"first_layer": 2, "last_layer": 3, "devices": devices[1]}],
    })  # fmt: skip
    return plan


def topology_of(plan: Plan) -> Topology:
    return Topology(plan, make_schedule("kfkb", 2, plan.microbatches, k=plan.k), len(plan.all_devices))


def test_a_stage_on_two_replicas_sends_each_half_of_a_microbatch_on_its_own_link() -> None:
    """Stage 0 on devices 0 and 1, stage 1 on device 5: activations 0->5 and 1->5, gradients back, half each."""
    forward, backward = pieces(topology_of(plan_of([[0, 1], [5]], 1, 8)))
    assert forward == [[((0, 5), 0.5), ((1, 5), 0.5)]]
    assert sorted(backward[0]) == [((5, 0), 0.5), ((5, 1), 0.5)]


def test_uneven_replicas_cut_a_microbatch_where_the_runtime_cuts_it() -> None:
    """2 -> 3 replicas of a 6-sample microbatch: rows 0-2 | 3-5 against 0-1 | 2-3 | 4-5 give four pieces."""
    forward, _ = pieces(topology_of(plan_of([[0, 1], [2, 3, 4]], 1, 6)))
    assert sorted(forward[0]) == [((0, 2), 2 / 6), ((0, 3), 1 / 6), ((1, 3), 1 / 6), ((1, 4), 2 / 6)]


def test_every_pipeline_copy_s_pairs_are_flows_of_the_one_simulated_pipeline() -> None:
    """Two copies (devices 0->1 and 2->3): each boundary holds both copies' links, whole microbatches each."""
    forward, backward = pieces(topology_of(plan_of([[0, 2], [1, 3]], 2, 4)))
    assert sorted(forward[0]) == [((0, 1), 1.0), ((2, 3), 1.0)]
    assert sorted(backward[0]) == [((1, 0), 1.0), ((3, 2), 1.0)]


def test_a_flow_takes_its_piece_s_bytes_at_its_link_s_rate_plus_latency() -> None:
    """1,000 bytes at 1 MB/s: 1 ms of work, 0.2 ms latency, on each pair; a transfer's nominal time reads it back."""
    topology = topology_of(plan_of([[0, 1], [5]], 1, 8))
    stages = [StageCost(fwd_ms=1.0, bwd_ms=2.0), StageCost(fwd_ms=3.0, bwd_ms=4.0)]
    links = [(0, 5), (1, 5), (5, 0), (5, 1)]
    pipeline = runtime_pipeline(topology, stages, [1e9, 1e9], dict.fromkeys(links, 1000.0), dict.fromkeys(links, (1e6, 0.2)))
    assert sorted(pipeline.links) == sorted(links)
    for boundary in pipeline.costs.forward + pipeline.costs.backward:
        assert [(f.work_ms, f.latency_ms) for f in boundary] == [(pytest.approx(1.0), 0.2)] * 2
    assert pipeline.nominal_ms((1, 5), 500.0) == pytest.approx(0.5)


def test_a_measured_stage_is_its_slowest_replica_and_its_least_memory() -> None:
    """Stage 0's replicas measured 2 and 3 ms forwards, limits 8 and 6 GB: the pipeline holds 3 ms and 6 GB."""

    def slot(fwd: float, limit: float) -> dict[str, float]:
        return {"fwd_ms": fwd, "bwd_ms": 2 * fwd, "activation_bytes": 100.0, "static_bytes": 10.0, "optimizer_ms": 0.5,
                "memory_limit_bytes": limit}  # fmt: skip

    topology = topology_of(plan_of([[0, 1], [5]], 1, 8))
    links = [(0, 5), (1, 5), (5, 0), (5, 1)]
    by_stage = {0: [slot(2.0, 8e9), slot(3.0, 6e9)], 1: [slot(1.0, 9e9)]}
    pipeline = measured_pipeline(topology, by_stage, dict.fromkeys(links, 64.0), dict.fromkeys(links, (1e6, 0.0)), None)
    assert [c.fwd_ms for c in pipeline.costs.stages] == [3.0, 1.0]
    assert [c.bwd_ms for c in pipeline.costs.stages] == [6.0, 2.0]
    assert pipeline.memory_limit_bytes == (6e9, 9e9)


def warm_up_slot(fwd: float, gradient_bytes: dict[int, float]) -> dict[str, object]:
    return {"fwd_ms": fwd, "bwd_ms": 2 * fwd, "activation_bytes": 100.0, "static_bytes": 10.0, "optimizer_ms": 0.5,
            "memory_limit_bytes": 1e9, "allreduce_bytes": gradient_bytes}  # fmt: skip


def test_the_warm_up_pipeline_prices_a_replicated_stage_s_all_reduce_as_the_emulated_ring() -> None:
    """Stage 0 on devices 0 and 1 measured an 8,000-byte all-reduce; every link at 2 MB/s and 0.25 ms: the ring takes
    2(n-1)/n x 8,000 B / 2 MB/s + 2(n-1) x 0.25 ms = 4.5 ms (0.5 ms of it latency), and the controller predicts
    every k exactly 4.5 ms longer than without it (stage 0's last backward ends the iteration, its optimizer step
    waits for the ring)."""
    topology = topology_of(plan_of([[0, 1], [5]], 1, 8))
    devices = (0, 1, 5)
    wire = EmulatedLinks({(a, b): LinkRate(2e6, 0.25) for a in devices for b in devices if a != b}, None)
    links = [(0, 5), (1, 5), (5, 0), (5, 1)]
    by_stage = {0: [warm_up_slot(2.0, {0: 8000.0}), warm_up_slot(3.0, {0: 8000.0})], 1: [warm_up_slot(1.0, {})]}
    rates = dict.fromkeys(links, (2e6, 0.25))
    ring = measured_pipeline(topology, by_stage, dict.fromkeys(links, 64.0), rates, None, wire.ring_parts)
    plain = measured_pipeline(topology, by_stage, dict.fromkeys(links, 64.0), rates, None)
    stage = ring.costs.stages[0]
    assert (stage.allreduce_ring, stage.allreduce_ms, stage.allreduce_latency_ms) == ((0, 1), pytest.approx(4.5), 0.5)
    assert ring.ring_links == (((0, 1), (1, 0)), ()) and ring.allreduce_bytes == (8000.0, 0.0)
    assert ring.nominal_gb_per_s((0, 1)) == pytest.approx(0.002)
    assert plain.costs.stages[0].allreduce_ms == 0.0  # the real network times no all-reduce
    with_ring = AdaptiveController(ring, ControllerConfig(initial_k=1)).decisions[-1].predicted_ms
    without = AdaptiveController(plain, ControllerConfig(initial_k=1)).decisions[-1].predicted_ms
    assert with_ring.keys() == without.keys()
    assert all(with_ring[k] - without[k] == pytest.approx(4.5) for k in without)


def test_the_plan_s_pipeline_carries_each_replicated_stage_s_ring_priced_as_the_emulated_wire_runs_it() -> None:
    """bert-48 with every stage on a device pair: plan_pipeline keeps each stage's ring over its plan devices; on an
    emulated wire at 0.5 GB/s without latency each ring takes 2(n-1)/n x its gradient bytes / 0.5 GB/s."""
    from adapt_cases import replicated_plan

    plan, model = replicated_plan(8)
    plan = dataclasses.replace(plan, schedule="kfkb", k=1)
    topology = Topology(plan, make_schedule("kfkb", len(plan.stages), plan.microbatches, k=1), len(plan.all_devices))
    rates = {(a, b): (0.5e9, 0.0) for a in plan.all_devices for b in plan.all_devices if a != b}
    priced = PipelineModel.from_plan(plan, model)
    as_planned = plan_pipeline(plan, topology, model, rates, None)
    wire = EmulatedLinks.uniform(plan.all_devices, 0.5)
    emulated = plan_pipeline(plan, topology, model, rates, None, wire.ring_parts)
    for s, stage in enumerate(plan.stages):
        assert as_planned.costs.stages[s].allreduce_ring == emulated.costs.stages[s].allreduce_ring == stage.devices
        assert as_planned.costs.stages[s].allreduce_ms == priced.costs.stages[s].allreduce_ms > 0
        assert emulated.costs.stages[s].allreduce_ms == pytest.approx(priced.allreduce_bytes[s] / 0.5e9 * 1000.0)
    assert emulated.allreduce_bytes == priced.allreduce_bytes
    assert set(emulated.traffic_links) >= {link for ring in emulated.ring_links for link in ring}
