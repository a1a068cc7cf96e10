"""Runtime pieces in one process: placement and messages, jobs, data order, the I/W split, faults, checkpoints, launcher env."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pipeplan.core.errors import PlanError  # noqa: E402
from pipeplan.core.partition import split_evenly  # noqa: E402
from pipeplan.core.plan import Plan, Stage  # noqa: E402
from pipeplan.core.schedule import Action  # noqa: E402
from pipeplan.models.stage import StageModule  # noqa: E402
from pipeplan.models.zoo.datasets import batch_indices  # noqa: E402
from pipeplan.runtime.execution.job import ScheduleLayout  # noqa: E402
from pipeplan.runtime.placement import Topology  # noqa: E402
from pipeplan.runtime.rank_errors import TrainConfigError  # noqa: E402
from pipeplan.runtime.state.faults import FaultInjector, InjectedFault  # noqa: E402
from pipeplan.schedules import make_schedule  # noqa: E402

pytestmark = pytest.mark.torch  # every test here needs torch (make test-fast leaves them out)


def two_one_topology(microbatch_size: int = 3) -> Topology:
    """Stage 0 on devices 0 and 1, stage 1 on device 2, 1F1B with 2 microbatches."""
    plan = Plan((Stage(0, 1, (0, 1)), Stage(2, 3, (2,))), 1, 2, microbatch_size, "1f1b")
    return Topology(plan, make_schedule("1f1b", 2, 2), 3)


def test_replica_samples_split_like_tensor_split() -> None:
    """A microbatch's rows over a stage's replicas (core.partition.split_evenly) are what torch.tensor_split gives."""
    for rows in range(1, 12):
        for replicas in range(1, rows + 1):
            sizes = [len(t) for t in torch.tensor_split(torch.arange(rows), replicas)]
            assert [hi - lo for lo, hi in split_evenly(rows, replicas)] == sizes


def test_two_replicas_each_send_their_rows_to_the_single_next_replica() -> None:
    """With stage 0 on two replicas (rows 0-1 and 2) and stage 1 on one, each replica sends its rows to process 2."""
    topo = two_one_topology()
    r0, r1, r2 = topo.roles
    assert (r0.replica, r1.replica, r2.sched_rank) == (0, 1, 1)
    sends = [(m.src, m.dst, m.src_lo, m.src_hi, m.dst_lo) for m in topo.sends(r0, Action(0, "F", 1))]
    assert sends == [(0, 2, 0, 2, 0)]
    sends = [(m.src, m.dst, m.src_lo, m.src_hi, m.dst_lo) for m in topo.sends(r1, Action(0, "F", 1))]
    assert sends == [(1, 2, 0, 1, 2)]
    grads = [(m.src, m.dst, m.src_lo, m.src_hi, m.dst_lo) for m in topo.sends(r2, Action(1, "B", 0))]
    assert grads == [(2, 0, 0, 2, 0), (2, 1, 2, 3, 0)]
    assert [m.src for m in topo.recvs(r2, Action(1, "F", 0))] == [0, 1]


def test_sample_ranges_cover_the_global_batch_once_per_stage() -> None:
    """Every stage's replicas together handle each sample of the global batch exactly once."""
    topo = two_one_topology()
    for stage in (0, 1):
        rows = []
        for role in topo.roles:
            if stage in role.stages:
                for mb in range(2):
                    lo, hi = topo.sample_range(role, mb, stage)
                    rows += range(lo, hi)
        assert sorted(rows) == list(range(topo.plan.global_batch))


def test_send_order_follows_the_senders_actions() -> None:
    """Process 0 sends its activations to process 2 in its F order."""
    topo = two_one_topology()
    assert [(m.kind, m.microbatch) for m in topo.send_order(0, 2)] == [("act", 0), ("act", 1)]
    assert topo.peers(2) == (0, 1)


def test_topology_rejects_a_world_size_other_than_the_plans_devices() -> None:
    """Four processes cannot run a plan on three devices."""
    plan = Plan((Stage(0, 1, (0, 1)), Stage(2, 3, (2,))), 1, 2, 3, "1f1b")
    with pytest.raises(PlanError, match=r"plan uses 3 devices \[0, 1, 2\] but the job has 4 processes"):
        Topology(plan, make_schedule("1f1b", 2, 2), 4)


def test_topology_rejects_more_replicas_than_samples() -> None:
    """Two replicas cannot split a microbatch of one sample."""
    with pytest.raises(PlanError, match="stage 0 has 2 replicas but a microbatch has only 1 samples"):
        two_one_topology(microbatch_size=1)


def test_schedule_layout_places_replicas_and_pipeline_copies() -> None:
    """Replicas 2,1 on six processes give two pipeline copies; stage devices are listed copy by copy."""
    plan, schedule = ScheduleLayout("1f1b", 2, 4, 48, replicas=(2, 1)).build(num_layers=5, world_size=6)
    assert plan.pipeline_replicas == 2 and plan.microbatch_size == 6
    assert plan.stages[0].devices == (0, 1, 3, 4) and plan.stages[1].devices == (2, 5)
    assert (plan.stages[0].first_layer, plan.stages[0].last_layer) == (0, 2)
    assert schedule.name == "1f1b"


def test_schedule_layout_interleaved_places_chunks_round_robin() -> None:
    """interleaved-1f1b with p=2, v=2 puts chunk-stages 0 and 2 on the first device."""
    plan, schedule = ScheduleLayout("interleaved-1f1b", 2, 4, 8, chunks=2).build(num_layers=8, world_size=2)
    assert [s.devices for s in plan.stages] == [(0,), (1,), (0,), (1,)]
    assert plan.chunks == 2 and schedule.stage_to_rank == (0, 1, 0, 1)


def test_schedule_layout_rejects_a_batch_that_does_not_divide() -> None:
    """A global batch of 10 cannot be cut into 4 microbatches."""
    with pytest.raises(TrainConfigError, match="--batch-size 10 must be a multiple of pipeline replicas x microbatches = 1 x 4"):
        ScheduleLayout("gpipe", 2, 4, 10).build(num_layers=4, world_size=2)


def test_schedule_layout_rejects_too_few_layers() -> None:
    """Three layers cannot fill four stages."""
    with pytest.raises(TrainConfigError, match="the model has 3 layers, fewer than the 4 stages"):
        ScheduleLayout("gpipe", 4, 4, 8).build(num_layers=3, world_size=4)


def test_batch_indices_are_a_seeded_permutation_stream() -> None:
    """Two epochs of 10 samples in batches of 4: each epoch is a permutation, and the order depends only on the seed."""
    stream = torch.cat([batch_indices(10, 4, step, seed=1) for step in range(5)])
    assert sorted(stream[:10].tolist()) == list(range(10)) and sorted(stream[10:].tolist()) == list(range(10))
    assert torch.equal(batch_indices(10, 4, 3, seed=1), stream[12:16])
    assert not torch.equal(batch_indices(10, 4, 0, seed=2), stream[:4])


def _stage(split: bool) -> StageModule:
    torch.manual_seed(0)
    layers = [torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Tanh()), torch.nn.LayerNorm(5), torch.nn.Linear(5, 3)]
    return StageModule(1, [layer.double() for layer in layers], is_first=False, is_last=False, split_backward=split)


def test_split_backward_gives_the_same_gradients_as_full_backward() -> None:
    """I then W yield the same input and weight gradients as B, and I alone leaves the weights without gradients."""
    x = torch.randn(6, 4, dtype=torch.float64)
    g = torch.randn(6, 3, dtype=torch.float64)
    full, split = _stage(False), _stage(True)
    full.forward(0, x, None, None, 1.0)
    gin_full = full.backward(0, g)
    split.forward(0, x, None, None, 1.0)
    gin_split = split.backward_input(0, g)
    assert all(p.grad is None for p in split.params)
    split.backward_weight(0)
    torch.testing.assert_close(gin_split, gin_full)
    for a, b in zip(split.params, full.params, strict=True):
        torch.testing.assert_close(a.grad, b.grad)
    assert split.inflight == 0


def test_fault_spec_parses_and_fires_only_at_its_action() -> None:
    """`1:3:1F2:raise` fires on process 1, iteration 3, action 1F2, and nowhere else."""
    fault = FaultInjector.parse("1:3:1F2:raise")
    fault.check(0, 3, Action(1, "F", 2))
    fault.check(1, 2, Action(1, "F", 2))
    with pytest.raises(InjectedFault, match="injected fault at rank 1, step 3, action 1F2"):
        fault.check(1, 3, Action(1, "F", 2))


def test_bad_fault_spec_names_the_variable() -> None:
    """A malformed PIPEPLAN_FAULT is rejected with the expected form."""
    with pytest.raises(TrainConfigError, match="PIPEPLAN_FAULT must be RANK:STEP:ACTION:MODE"):
        FaultInjector.parse("1:x:1F2:boom")


def test_local_worker_env_uses_loopback_and_one_thread() -> None:
    """Workers get torchrun's variables, 127.0.0.1 and the launcher's store port, and one OpenMP thread by default."""
    from pipeplan.runtime.training.launch import worker_env

    env = worker_env(2, 4, 29999, base={"PATH": "/bin"})
    assert (env["RANK"], env["WORLD_SIZE"], env["MASTER_ADDR"], env["MASTER_PORT"]) == ("2", "4", "127.0.0.1", "29999")
    assert env["OMP_NUM_THREADS"] == "1" and env["TORCHELASTIC_USE_AGENT_STORE"] == "True"
