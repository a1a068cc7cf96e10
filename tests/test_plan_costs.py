"""Tests of sim.cost.plan_costs, the cost model of a plan: closed forms for compute, transfers, all-reduce and memory."""

from __future__ import annotations

import dataclasses

import pytest

from models import linear_model
from pipeplan.core.errors import ClusterError, PlanError
from pipeplan.core.hardware.cluster import Cluster, Device
from pipeplan.core.plan import Plan, Stage
from pipeplan.core.profile import LayerProfile, ModelProfile
from pipeplan.schedules.plan_schedule import plan_schedule
from pipeplan.sim.cost.link_model import ring_allreduce_ms, ring_allreduce_parts
from pipeplan.sim.cost.memory import check_fits, memory_per_device
from pipeplan.sim.cost.plan_costs import plan_costs
from pipeplan.sim.cost.types import ring_links

GB = 1e9


def profile(n: int = 4, batch: int = 8) -> ModelProfile:
    """Layer i: fwd i+1 ms, bwd 2(i+1) ms, output 1e6*(i+1) bytes, params 1e8 bytes, saved 2e6 bytes."""
    layers = tuple(LayerProfile(f"l{i}", float(i + 1), 2.0 * (i + 1), 1e6 * (i + 1), 1e8, 2e6) for i in range(n))
    return ModelProfile("toy", batch, layers)


def cluster(
    n: int = 4,
    gpus_per_node: int = 2,
    intra: float = 100 * GB,
    inter: float = 10 * GB,
    nic: float | None = None,
    speeds: tuple[float, ...] | None = None,
    mem: float = 16 * 2**30,
) -> Cluster:
    """n devices, gpus_per_node per node, intra/inter bandwidth, 1 us intra and 10 us inter latency."""
    devices = tuple(Device(i, "gpu", mem, speeds[i] if speeds else 1.0, i // gpus_per_node) for i in range(n))
    bw = tuple(
        tuple(0.0 if a == b else (intra if a // gpus_per_node == b // gpus_per_node else inter) for b in range(n))
        for a in range(n)
    )
    lat = tuple(
        tuple(0.0 if a == b else (1e-3 if a // gpus_per_node == b // gpus_per_node else 1e-2) for b in range(n)) for a in range(n)
    )
    return Cluster("c", devices, bw, lat, nic)


def test_compute_scales_with_microbatch_replicas_and_speed() -> None:
    """F_s = sum fwd * (b/P) / (r_s * min speed), B likewise."""
    plan = Plan((Stage(0, 1, (0,)), Stage(2, 3, (1, 2))), 1, 4, 4, "1f1b")
    costs = plan_costs(plan, linear_model(profile(), cluster(speeds=(1.0, 2.0, 0.5, 1.0))))
    assert costs.stages[0].fwd_ms == pytest.approx((1 + 2) * 0.5)
    assert costs.stages[0].bwd_ms == pytest.approx((2 + 4) * 0.5)
    # stage 1: layers 2..3 fwd 3+4=7, b/P=0.5, r=2, min speed 0.5 -> 7*0.5/(2*0.5) = 3.5
    assert costs.stages[1].fwd_ms == pytest.approx(3.5)
    assert costs.stages[1].bwd_ms == pytest.approx(7.0)
    assert costs.stages[1].bwd_input_ms == pytest.approx(3.5)


def test_stage_memo_gives_the_same_costs_and_reuses_stages_priced_before() -> None:
    """With a stage memo, costs equal those without; a second plan sharing a stage takes that stage's cost from it."""
    model = linear_model(profile(), cluster(speeds=(1.0, 2.0, 0.5, 1.0)))
    first = Plan((Stage(0, 1, (0,)), Stage(2, 3, (1, 2))), 1, 4, 4, "1f1b")
    second = Plan((Stage(0, 1, (0,)), Stage(2, 3, (3, 1))), 1, 4, 4, "1f1b")
    memo: dict = {}
    assert plan_costs(first, model, stage_memo=memo) == plan_costs(first, model)
    assert len(memo) == 2
    costs = plan_costs(second, model, stage_memo=memo)
    assert costs == plan_costs(second, model) and len(memo) == 3
    assert costs.stages[0] is memo[(0, 1, (0,), 1, 4)]


def test_bwd_split_sets_input_and_weight_fractions() -> None:
    """bwd_split=(0.6, 0.4) splits each backward 60/40."""
    plan = Plan((Stage(0, 3, (0,)),), 1, 1, 8, "zb-h1")
    cost = plan_costs(plan, linear_model(profile(), cluster(), bwd_split=(0.6, 0.4))).stages[0]
    assert cost.bwd_ms == pytest.approx(20.0)
    assert (cost.bwd_input_ms, cost.bwd_weight_ms) == (pytest.approx(12.0), pytest.approx(8.0))


def test_transfer_between_single_devices() -> None:
    """One flow: latency + cut_bytes*(b/P)/bandwidth, on the ordered pair, same size both ways."""
    plan = Plan((Stage(0, 0, (0,)), Stage(1, 3, (1,))), 1, 2, 8, "1f1b")
    costs = plan_costs(plan, linear_model(profile(), cluster()))
    (fwd,) = costs.forward[0]
    assert fwd.resources == ("pair:0->1",)
    assert fwd.link == (0, 1)
    assert fwd.latency_ms == pytest.approx(1e-3)
    assert fwd.work_ms == pytest.approx(1e6 / (100 * GB) * 1000)
    (bwd,) = costs.backward[0]
    assert bwd.resources == ("pair:1->0",)
    assert bwd.work_ms == pytest.approx(fwd.work_ms)


def test_transfer_with_replicas_uses_q_min_pairs() -> None:
    """r=2 -> r=1: q=1 pair (first replica), carrying all bytes; r=2 -> r=2: two pairs of half each."""
    prof = profile()
    plan = Plan((Stage(0, 1, (0, 1)), Stage(2, 3, (2,))), 1, 2, 8, "1f1b")
    flows = plan_costs(plan, linear_model(prof, cluster())).forward[0]
    assert [f.link for f in flows] == [(0, 2)]
    assert flows[0].work_ms == pytest.approx(2e6 / (10 * GB) * 1000)
    plan = Plan((Stage(0, 1, (0, 1)), Stage(2, 3, (2, 3))), 1, 2, 8, "1f1b")
    flows = plan_costs(plan, linear_model(prof, cluster())).forward[0]
    assert [f.link for f in flows] == [(0, 2), (1, 3)]
    assert all(f.work_ms == pytest.approx(1e6 / (10 * GB) * 1000) for f in flows)


def test_nic_resources_and_rate_cap_across_nodes() -> None:
    """Crossing nodes with a NIC: the flow holds nic_out/nic_in and runs at min(pair, NIC)."""
    plan = Plan((Stage(0, 1, (1,)), Stage(2, 3, (2,))), 1, 2, 8, "1f1b")
    (flow,) = plan_costs(plan, linear_model(profile(), cluster(nic=5 * GB))).forward[0]
    assert flow.resources == ("pair:1->2", "nic_out:0", "nic_in:1")
    assert flow.work_ms == pytest.approx(2e6 / (5 * GB) * 1000)
    assert flow.latency_ms == pytest.approx(1e-2)


def test_same_device_boundary_has_no_flows() -> None:
    """Interleaved chunk-stages on one rank (p=1) transfer nothing."""
    plan = Plan((Stage(0, 1, (0,)), Stage(2, 3, (0,))), 1, 2, 8, "interleaved-1f1b", chunks=2)
    costs = plan_costs(plan, linear_model(profile(), cluster()))
    assert costs.forward == ((),) and costs.backward == ((),)


def test_zero_bandwidth_link_raises_cluster_error() -> None:
    """A needed link with zero bandwidth is a ClusterError naming the pair."""
    c = cluster()
    bw = [list(row) for row in c.bandwidth_bytes_per_s]
    bw[0][1] = 0.0
    c = Cluster("c", c.devices, tuple(tuple(r) for r in bw), c.latency_ms)
    plan = Plan((Stage(0, 1, (0,)), Stage(2, 3, (1,))), 1, 2, 8, "1f1b")
    with pytest.raises(ClusterError, match=r"bandwidth\[0\]\[1\] is 0"):
        plan_costs(plan, linear_model(profile(), c))


def test_allreduce_ring_formula() -> None:
    """2(n-1)/n * params / min ring bandwidth + 2(n-1) * max ring latency, over r_s * rp devices."""
    c = cluster()
    # ring 0->1->2->3->0 crosses nodes: min bandwidth 10 GB/s, max latency 10 us.
    expected = 2 * 3 / 4 * 2e8 / (10 * GB) * 1000 + 2 * 3 * 1e-2
    assert ring_allreduce_ms(c, (0, 1, 2, 3), 2e8) == pytest.approx(expected)
    assert ring_allreduce_ms(c, (0, 1), 2e8) == pytest.approx(2e8 / (100 * GB) * 1000 + 2e-3)
    assert ring_allreduce_ms(c, (3,), 2e8) == 0.0
    # two pipeline replicas of a one-device stage: the all-reduce spans both.
    plan = Plan((Stage(0, 1, (0, 2)), Stage(2, 3, (1, 3))), 2, 2, 4, "1f1b")
    costs = plan_costs(plan, linear_model(profile(), c))
    assert costs.stages[0].allreduce_ms == pytest.approx(2e8 / (10 * GB) * 1000 + 2e-2)


def test_allreduce_knows_its_ring_links_latency_and_work() -> None:
    """Each stage's all-reduce carries its ring's ordered pairs (device order, wrapping) and its latency part; the total
    is ring_allreduce_ms's float, and the work is the bytes over the slowest ring link (as the formula splits)."""
    c = cluster()
    assert ring_links((0, 1, 2, 3)) == ((0, 1), (1, 2), (2, 3), (3, 0))
    assert ring_links((2, 0)) == ((2, 0), (0, 2)) and ring_links((3,)) == ()
    for devices in ((0, 1, 2, 3), (0, 1), (1, 3, 0), (3,)):
        total, latency = ring_allreduce_parts(c, devices, 2e8)
        assert total == ring_allreduce_ms(c, devices, 2e8)
    total, latency = ring_allreduce_parts(c, (0, 1, 2, 3), 2e8)
    assert latency == pytest.approx(2 * 3 * 1e-2) and total - latency == pytest.approx(2 * 3 / 4 * 2e8 / (10 * GB) * 1000)
    plan = Plan((Stage(0, 1, (0, 2)), Stage(2, 3, (1,))), 1, 2, 4, "1f1b")
    costs = plan_costs(plan, linear_model(profile(), c))
    first, second = costs.stages
    assert first.allreduce_links == ((0, 2), (2, 0)) and second.allreduce_links == () == second.allreduce_ring
    assert first.allreduce_latency_ms == pytest.approx(2e-2)
    assert first.allreduce_work_ms == pytest.approx(2e8 / (10 * GB) * 1000)
    assert second.allreduce_ms == second.allreduce_latency_ms == 0.0
    # a measured all-reduce: the same ring's links, its bus rate and per-step latency
    measured = dataclasses.replace(c, allreduce_bytes_per_s=5 * GB, allreduce_latency_ms=2e-2)
    total, latency = ring_allreduce_parts(measured, (0, 1, 2, 3), 2e8)
    assert latency == pytest.approx(2 * 3 * 2e-2) and total - latency == pytest.approx(2 * 3 / 4 * 2e8 / (5 * GB) * 1000)
    assert plan_costs(plan, linear_model(profile(), measured)).stages[0].allreduce_links == ((0, 2), (2, 0))


def test_pipeline_replicas_use_slowest_replica_transfer() -> None:
    """With rp=2 the boundary takes the flows of the replica whose transfer is slowest."""
    plan = Plan((Stage(0, 1, (0, 2)), Stage(2, 3, (1, 3))), 2, 2, 4, "1f1b")
    c = cluster(gpus_per_node=4)
    bw = [list(row) for row in c.bandwidth_bytes_per_s]
    bw[2][3] = 1 * GB
    c = Cluster("c", c.devices, tuple(tuple(r) for r in bw), c.latency_ms)
    (flow,) = plan_costs(plan, linear_model(profile(), c)).forward[0]
    assert flow.link == (2, 3)


def test_memory_formula_per_device() -> None:
    """Memory = params*(2+opt) + peak in-flight * saved*(b/P)/r; 1f1b holds p-r microbatches on stage r."""
    plan = Plan((Stage(0, 1, (0, 1)), Stage(2, 3, (2,))), 1, 4, 4, "1f1b")
    mem = memory_per_device(plan, linear_model(profile(), cluster(), optimizer_factor=2.0))
    # stage 0: params 2e8*4, saved 4e6*0.5/2 = 1e6, in flight 2 -> 8e8 + 2e6
    assert mem[0] == pytest.approx(8e8 + 2e6)
    assert mem[1] == pytest.approx(8e8 + 2e6)
    # stage 1: saved 4e6*0.5 = 2e6, in flight 1
    assert mem[2] == pytest.approx(8e8 + 2e6)
    assert mem[3] == 0.0
    gpipe = Plan(plan.stages, 1, 4, 4, "gpipe")
    assert memory_per_device(gpipe, linear_model(profile(), cluster()))[2] == pytest.approx(8e8 + 4 * 2e6)


def test_interleaved_memory_sums_chunks_on_a_rank() -> None:
    """Each rank holds the weights of all its chunks."""
    stages = (Stage(0, 0, (0,)), Stage(1, 1, (1,)), Stage(2, 2, (0,)), Stage(3, 3, (1,)))
    plan = Plan(stages, 1, 2, 8, "interleaved-1f1b", chunks=2)
    mem = memory_per_device(plan, linear_model(profile(), cluster(), optimizer_factor=0.0))
    assert mem[0] >= 2 * 2e8 and mem[0] <= 2 * 2e8 + 4 * 2e6


def test_check_fits_names_stage_device_and_excess() -> None:
    """An overflowing device raises PlanError with need, capacity and excess in GiB."""
    plan = Plan((Stage(0, 3, (0,)),), 1, 1, 8, "1f1b")
    small = cluster(mem=1 * 2**30)
    with pytest.raises(PlanError, match=r"stage 0 needs 1\.50 GiB on device 0 .*1\.00 GiB\): 0\.50 GiB too much"):
        check_fits(plan, linear_model(profile(), small))
    assert check_fits(plan, linear_model(profile(), cluster()))[0] == pytest.approx(4e8 * 4 + 8e6)


def test_plan_must_match_profile_and_cluster() -> None:
    """Wrong layer count (saying which layers no stage holds, or which the profile lacks) or unknown devices are
    PlanErrors."""
    with pytest.raises(PlanError, match="covers 2 layers but profile 'toy' has 4: layers 2-3 are in no stage"):
        plan_costs(Plan((Stage(0, 1, (0,)),), 1, 1, 1, "1f1b"), linear_model(profile(), cluster()))
    with pytest.raises(PlanError, match="covers 3 layers but profile 'toy' has 4: layer 3 is in no stage"):
        plan_costs(Plan((Stage(0, 2, (0,)),), 1, 1, 1, "1f1b"), linear_model(profile(), cluster()))
    with pytest.raises(PlanError, match="covers 6 layers but profile 'toy' has 4: its stages name layers 4-5, which"):
        plan_costs(Plan((Stage(0, 5, (0,)),), 1, 1, 1, "1f1b"), linear_model(profile(), cluster()))
    with pytest.raises(PlanError, match="uses device 7"):
        plan_costs(Plan((Stage(0, 3, (7,)),), 1, 1, 1, "1f1b"), linear_model(profile(), cluster()))


def test_plan_schedule_list_needs_order() -> None:
    """A list plan without an order is a PlanError; generated plans give their generator's schedule."""
    with pytest.raises(PlanError, match="needs an explicit order"):
        plan_schedule(Plan((Stage(0, 3, (0,)),), 1, 1, 1, "list"))
    sched = plan_schedule(Plan((Stage(0, 1, (0,)), Stage(2, 3, (1,))), 1, 3, 1, "1f1b"))
    assert sched.num_ranks == 2 and sched.num_microbatches == 3


def test_microbatch_must_split_evenly_over_replicas() -> None:
    """A stage with 2 replicas cannot take microbatches of 3 samples."""
    plan = Plan((Stage(0, 1, (0, 1)), Stage(2, 3, (2,))), 1, 2, 3, "1f1b")
    with pytest.raises(PlanError, match="stage 0 has 2 replicas but microbatch_size 3 is not a multiple of 2"):
        plan_costs(plan, linear_model(profile(), cluster()))


def test_memory_from_result_matches_order_based() -> None:
    """The simulated per-rank peak memory equals the order-based computation."""
    from pipeplan.sim.plan_sim import simulate_plan

    plan = Plan((Stage(0, 1, (0, 1)), Stage(2, 2, (2,)), Stage(3, 3, (3,))), 1, 6, 4, "kfkb", k=2)
    result = simulate_plan(plan, linear_model(profile(), cluster()))
    assert memory_per_device(plan, linear_model(profile(), cluster()), result) == pytest.approx(
        memory_per_device(plan, linear_model(profile(), cluster()))
    )


def test_message_overhead_is_charged_to_the_consuming_action_and_latency_to_the_flow() -> None:
    """The cluster's message overhead lengthens stage 1's forward and stage 0's backward (and I) by the same ms;
    its message latency lengthens both flows; chunk-stages on one device pay neither."""

    plan = Plan((Stage(0, 1, (0,)), Stage(2, 3, (1,))), 1, 4, 4, "zb-h1")
    base = plan_costs(plan, linear_model(profile(), cluster()))
    priced = dataclasses.replace(cluster(), message_overhead_ms=0.5, message_latency_ms=2.0)
    costs = plan_costs(plan, linear_model(profile(), priced))
    assert costs.stages[0].fwd_ms == base.stages[0].fwd_ms
    assert costs.stages[1].fwd_ms == pytest.approx(base.stages[1].fwd_ms + 0.5)
    assert costs.stages[0].bwd_ms == pytest.approx(base.stages[0].bwd_ms + 0.5)
    assert costs.stages[0].bwd_input_ms == pytest.approx(base.stages[0].bwd_input_ms + 0.5)
    assert costs.stages[0].bwd_weight_ms == base.stages[0].bwd_weight_ms
    assert costs.stages[1].bwd_ms == base.stages[1].bwd_ms
    assert costs.forward[0][0].latency_ms == pytest.approx(base.forward[0][0].latency_ms + 2.0)
    assert costs.backward[0][0].latency_ms == pytest.approx(base.backward[0][0].latency_ms + 2.0)
    same_device = Plan((Stage(0, 1, (0,)), Stage(2, 3, (0,))), 1, 4, 4, "interleaved-1f1b", chunks=2)
    alone = plan_costs(same_device, linear_model(profile(), priced))
    assert alone.stages[1].fwd_ms == pytest.approx(base.stages[1].fwd_ms) and alone.forward[0] == ()


# --- Tests of NIC sharing between pipeline replicas in the cost model. (was test_links_nic.py)

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
