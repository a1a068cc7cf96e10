"""Tests of NIC sharing between pipeline replicas in the cost model."""

from __future__ import annotations

import pytest

from models import linear_model
from pipeplan.core.cluster import Cluster, Device
from pipeplan.core.plan import Plan, Stage
from pipeplan.core.profile import LayerProfile, ModelProfile
from pipeplan.sim.cost.plan_costs import plan_costs

GB = 1e9


def two_nodes(nic: float | None) -> Cluster:
    """2 nodes x 2 GPUs: 100 GB/s inside a node, 10 GB/s between nodes, no latency, optional NIC cap."""
    devices = tuple(Device(i, "gpu", 16 * 2**30, 1.0, i // 2) for i in range(4))
    bw = tuple(tuple(0.0 if a == b else (100 * GB if a // 2 == b // 2 else 10 * GB) for b in range(4)) for a in range(4))
    zero = tuple(tuple(0.0 for _ in range(4)) for _ in range(4))
    return Cluster("two-nodes", devices, bw, zero, nic)


def two_layers() -> ModelProfile:
    """Two layers of batch 4; the cut between them carries 4e9 bytes per profile batch."""
    layers = (LayerProfile("a", 1.0, 2.0, 4e9, 1e6), LayerProfile("b", 1.0, 2.0, 1e6, 1e6))
    return ModelProfile("two", 4, layers)


def crossing_plan(stage0: tuple[int, ...], stage1: tuple[int, ...]) -> Plan:
    """Two stages, two pipeline replicas, microbatch size 1 (1e9 bytes cross the cut)."""
    return Plan((Stage(0, 0, stage0), Stage(1, 1, stage1)), 2, 2, 1, "1f1b")


def test_two_replicas_crossing_one_nic_each_get_half_of_it() -> None:
    """Both pipelines send node 0 -> node 1 at once, so each flow runs at nic/2: 1e9 B / 0.5 GB/s = 2000 ms."""
    costs = plan_costs(crossing_plan((0, 1), (2, 3)), linear_model(two_layers(), two_nodes(nic=1 * GB)))
    (flow,) = costs.forward[0]
    assert flow.work_ms == pytest.approx(2000.0)
    (grad,) = costs.backward[0]
    assert grad.work_ms == pytest.approx(2000.0)


def test_replicas_on_different_nics_do_not_share() -> None:
    """Replica 0 sends 0 -> 2 (node 0 -> 1), replica 1 sends 3 -> 1 (node 1 -> 0): one flow per NIC, 1000 ms."""
    costs = plan_costs(crossing_plan((0, 3), (2, 1)), linear_model(two_layers(), two_nodes(nic=1 * GB)))
    (flow,) = costs.forward[0]
    assert flow.work_ms == pytest.approx(1000.0)


def test_without_nic_the_pair_rate_holds() -> None:
    """With no NIC declared, each flow runs at its pair's 10 GB/s: 100 ms."""
    costs = plan_costs(crossing_plan((0, 1), (2, 3)), linear_model(two_layers(), two_nodes(nic=None)))
    (flow,) = costs.forward[0]
    assert flow.work_ms == pytest.approx(100.0)
