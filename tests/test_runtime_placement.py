"""runtime.placement with tensor-parallel stages (no torch): every process's role, and the messages between stages of
any tp and replica counts, checked against a brute-force count of the rows each process must receive."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeplan.core.plan import Plan, Stage
from pipeplan.core.schedule import Action
from pipeplan.runtime.placement import Topology
from pipeplan.schedules import make_schedule


def _topology(shape: list[tuple[int, int]], pipelines: int, microbatch_size: int) -> Topology:
    """Stage s (one layer each) with shape[s] = (replicas, tp) in each of `pipelines` pipeline replicas, 1F1B over 2
    microbatches; devices numbered in the plan's order."""
    stages, device = [], 0
    for s, (replicas, tp) in enumerate(shape):
        count = pipelines * replicas * tp
        stages.append(Stage(s, s, tuple(range(device, device + count)), tp))
        device += count
    plan = Plan(tuple(stages), pipelines, 2, microbatch_size, "1f1b")
    return Topology(plan, make_schedule("1f1b", len(shape), 2), device)


SHAPES = st.lists(st.tuples(st.integers(1, 2), st.integers(1, 3)), min_size=2, max_size=3)


@settings(max_examples=60, deadline=None)
@given(shape=SHAPES, pipelines=st.integers(1, 2), microbatch_size=st.integers(2, 4))
def test_every_tp_rank_receives_each_of_its_rows_once_from_the_matching_tp_rank(
    shape: list[tuple[int, int]], pipelines: int, microbatch_size: int
) -> None:
    """Each process of a stage gets every row of its replica's share of a microbatch exactly once (activations going
    forward, gradients going back), from the same pipeline replica and from TP rank (its TP rank mod the sender's
    tp); what senders send is exactly what receivers expect."""
    topo = _topology(shape, pipelines, microbatch_size)
    roles = topo.roles
    keys = {(r.sched_rank, r.pipeline_replica, r.replica, r.tp_rank) for r in roles}
    assert len(keys) == len(roles) == topo.world_size  # one process per (stage, pipeline replica, replica, TP rank)
    for role in roles:
        assert role.tp == shape[role.sched_rank][1] and 0 <= role.tp_rank < role.tp
    last = len(shape) - 1
    sent, received = [], []
    for role in roles:
        s = role.sched_rank
        for op, boundary_stage in (("F", s - 1), ("B", s + 1)):
            if not 0 <= boundary_stage <= last:
                continue
            lo, hi = topo.sample_range(role, 0, s)
            rows = []
            for m in topo.recvs(role, _action(s, op)):
                sender = roles[m.src]
                assert sender.sched_rank == boundary_stage and sender.pipeline_replica == role.pipeline_replica
                assert sender.tp_rank == role.tp_rank % sender.tp
                first = topo.sample_range(sender, 0, boundary_stage)[0] + m.src_lo
                rows += range(first, first + m.src_hi - m.src_lo)
                assert first == lo + m.dst_lo
            assert sorted(rows) == list(range(lo, hi))
            received += topo.recvs(role, _action(s, op))
        for op in ("F", "B"):
            sent += topo.sends(role, _action(s, op))
    assert sorted(sent, key=repr) == sorted(received, key=repr)


def test_data_parallel_groups_hold_one_tp_rank_each() -> None:
    """A stage of 2 replicas x tp 2 all-reduces its gradients in one group per TP rank (the copies of one shard), and
    its TP groups are each replica's processes."""
    topo = _topology([(2, 2), (1, 1)], 1, 2)
    assert [topo.stage_group(0, k) for k in range(2)] == [(0, 2), (1, 3)]
    assert topo.tp_groups(0) == ((0, 1), (2, 3)) and topo.tp_groups(1) == ((4,),)


def _action(stage: int, op: str) -> Action:
    """Action `op` of microbatch 0 on `stage`."""
    return Action(stage, op, 0)
