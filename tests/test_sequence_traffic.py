"""Tests of sim.cost.sequence_traffic: the bytes of sequence parallelism's norm all-reduces, by hand."""

from __future__ import annotations

import dataclasses

import pytest

from models import linear_model
from pipeplan.core.hardware.cluster import Cluster, Device
from pipeplan.core.plan import Plan, Stage
from pipeplan.core.profile import LayerProfile, ModelProfile, TensorSplit
from pipeplan.sim.cost.plan_costs import plan_costs
from pipeplan.sim.cost.tensor_parallel import split_stage

RATE, LATENCY_MS = 50e9, 3e-3
NORM = 2 * 1024 * 4.0  # a norm's weight and bias: 2 x 1024 parameters of 4 bytes


def profile(norm_bytes: float, master_copy: bool = False, main_grads: str = "weights") -> ModelProfile:
    """An embedding, a block, an MLP half-block and a head: the block has two sequence-split norms, the MLP one."""
    layers = (
        LayerProfile("embed", 1.0, 2.0, 4e6, 8e8, 1e6),
        LayerProfile("block", 8.0, 16.0, 4e6, 4e8, 34e6, tp=TensorSplit("block", 16, norm_bytes=norm_bytes)),
        LayerProfile("mlp", 4.0, 8.0, 4e6, 2e8, 19e6, tp=TensorSplit("mlp", 64, norm_bytes=norm_bytes)),
        LayerProfile("head", 3.0, 6.0, 6e7, 8e8, 6e7),
    )
    return ModelProfile("sp-toy", 8, layers, "A100", master_copy=master_copy, main_grads=main_grads)


def cluster(n: int = 8) -> Cluster:
    """n devices on one node, every link RATE bytes/s and LATENCY_MS."""
    devices = tuple(Device(i, "A100", 80 * 2**30, 1.0, 0) for i in range(n))
    bw = tuple(tuple(0.0 if a == b else RATE for b in range(n)) for a in range(n))
    lat = tuple(tuple(0.0 if a == b else LATENCY_MS for b in range(n)) for a in range(n))
    return Cluster("c", devices, bw, lat)


@pytest.mark.parametrize("t", [2, 4, 8])
@pytest.mark.parametrize(
    ("master_copy", "main_grads", "grad_share"),
    [(False, "weights", 1.0), (True, "weights", 0.5), (True, "fp32", 1.0), (True, "fp32_copy", 0.5)],
)
def test_norm_all_reduces_move_each_norms_gradient_bytes(t: int, master_copy: bool, main_grads: str, grad_share: float) -> None:
    """A stage of the whole model on a group of t with sequence parallelism: naming the norms' bytes adds to its
    backward (and I) exactly the ring time of their gradients, 2(t-1)/t x (2 + 1 norms) x norm bytes x the
    gradient share (1/2 for 16-bit gradients) / RATE, per microbatch; their latency was counted before, and the
    forward does not change."""
    plan = Plan((Stage(0, 3, tuple(range(t)), tp=t, sequence_parallel=True),), 1, 4, 8, "1f1b")
    unnamed = plan_costs(plan, linear_model(profile(0.0, master_copy, main_grads), cluster())).stages[0]
    named = plan_costs(plan, linear_model(profile(NORM, master_copy, main_grads), cluster())).stages[0]
    ring = 2 * (t - 1) / t * (3 * NORM * grad_share) / RATE * 1000
    assert named.fwd_ms == unnamed.fwd_ms
    # the difference of two sums of ~10 ms: 1e-12 of the backward, not of the ~1e-3 ms ring
    assert named.bwd_ms - unnamed.bwd_ms == pytest.approx(ring, abs=1e-12 * unnamed.bwd_ms)
    assert named.bwd_input_ms - unnamed.bwd_input_ms == pytest.approx(ring, abs=1e-12 * unnamed.bwd_ms)
    model = linear_model(profile(NORM, master_copy, main_grads), cluster())
    bare = linear_model(profile(0.0, master_copy, main_grads), cluster())
    traffic = split_stage(model.layers, range(4), 8, 1, 1.0, t, True)[1]
    base = split_stage(bare.layers, range(4), 8, 1, 1.0, t, True)[1]
    assert traffic.bwd_bytes - base.bwd_bytes == pytest.approx(3 * NORM * grad_share, rel=1e-12)
    assert (traffic.fwd_bytes, traffic.fwd_count, traffic.bwd_count) == (base.fwd_bytes, base.fwd_count, base.bwd_count)


def test_without_sequence_parallelism_the_norms_bytes_cost_nothing() -> None:
    """Without sequence parallelism the norms' gradients are not all-reduced over the group: norm_bytes change no
    stage cost."""
    plan = Plan((Stage(0, 3, (0, 1, 2, 3), tp=4),), 1, 4, 8, "1f1b")
    unnamed = plan_costs(plan, linear_model(profile(0.0), cluster())).stages[0]
    named = plan_costs(plan, linear_model(profile(NORM), cluster())).stages[0]
    assert dataclasses.astuple(named) == dataclasses.astuple(unnamed)
