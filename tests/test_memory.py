"""Tests of sim.memory: in-flight peaks from a rank's order, bytes per device, and which device overflows."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from models import default_model, linear_model
from pipeplan.core.errors import PlanError
from pipeplan.core.hardware.cluster import Cluster, Device
from pipeplan.core.plan import Plan, Stage
from pipeplan.core.profile import LayerCurve, LayerProfile, ModelProfile
from pipeplan.presets.gpt_profile import GptConfig, gpt_profile
from pipeplan.presets.resolve import load_cluster
from pipeplan.schedules.registry import make_schedule
from pipeplan.sim.cost.held import peak_held
from pipeplan.sim.cost.holding import Holding
from pipeplan.sim.cost.memory import (
    check_fits,
    fit_error,
    memory_excess,
    memory_per_device,
    order_peak_activation,
    per_device,
    result_memory,
)
from pipeplan.sim.cost.model import CostModel
from pipeplan.sim.cost.plan_costs import plan_costs
from pipeplan.sim.plan_sim import simulate_plan

GIB = float(2**30)


def cluster(memory_gib: tuple[float, ...] = (1.0, 1.0, 1.0, 8.0)) -> Cluster:
    """One node of devices with the given memory, 100 GB/s and 1 us between every pair."""
    n = len(memory_gib)
    devices = tuple(Device(i, "gpu", m * GIB) for i, m in enumerate(memory_gib))
    bw = tuple(tuple(0.0 if a == b else 100e9 for b in range(n)) for a in range(n))
    lat = tuple(tuple(0.0 if a == b else 1e-3 for b in range(n)) for a in range(n))
    return Cluster("mem", devices, bw, lat)


def profile() -> ModelProfile:
    """Four layers of 1e8 parameter bytes and 2e6 saved bytes at batch 8."""
    return ModelProfile("toy", 8, tuple(LayerProfile(f"l{i}", 1.0, 2.0, 1e6, 1e8, 2e6) for i in range(4)))


PLAN = Plan((Stage(0, 1, (0, 1)), Stage(2, 3, (2,))), 1, 4, 4, "1f1b")
"""Stage 0 on devices 0 and 1 (rank 0), stage 1 on device 2 (rank 1); device 3 unused."""


def test_peak_held_counts_forwards_until_their_backward() -> None:
    """F adds a stage's saved bytes, B frees them; the peak is the most held at once."""
    ops = [(0, "F"), (0, "F"), (0, "B"), (0, "F"), (0, "F"), (0, "B"), (0, "B"), (0, "B")]
    assert peak_held(ops, [5.0]) == 15.0
    assert peak_held([], [5.0]) == 0.0


def test_peak_held_keeps_a_split_backward_until_its_w() -> None:
    """An I leaves the microbatch held; only its W frees it."""
    ops = [(0, "F"), (0, "F"), (0, "I"), (0, "F"), (0, "W"), (0, "I"), (0, "I"), (0, "W"), (0, "W")]
    assert peak_held(ops, [1.0]) == 3.0


def test_peak_held_weights_each_stage_by_its_own_bytes() -> None:
    """Two chunk-stages on one rank each add their own saved bytes."""
    ops = [(0, "F"), (1, "F"), (0, "F"), (1, "B"), (0, "B"), (0, "B")]
    assert peak_held(ops, [1.0, 10.0]) == 12.0


@given(st.integers(1, 8), st.integers(1, 12))
def test_one_f_one_b_holds_min_m_and_p_minus_s_microbatches(p: int, m: int) -> None:
    """1F1B: stage s holds min(m, p - s) microbatches at its peak."""
    saved = [float(10**s) for s in range(p)]
    peaks = order_peak_activation(make_schedule("1f1b", p, m), saved)
    assert peaks == tuple(min(m, p - s) * saved[s] for s in range(p))


@given(st.integers(1, 6), st.integers(1, 10))
def test_gpipe_holds_every_microbatch(p: int, m: int) -> None:
    """GPipe runs all forwards first: every stage holds all m microbatches."""
    assert order_peak_activation(make_schedule("gpipe", p, m), [3.0] * p) == (3.0 * m,) * p


@given(st.integers(1, 6), st.integers(1, 10), st.integers(1, 4))
def test_kfkb_holds_min_m_and_k_times_p_minus_s(p: int, m: int, k: int) -> None:
    """kFkB: stage s holds min(m, k (p - s)) microbatches at its peak (k <= m: a larger group is refused)."""
    k = min(k, m)
    peaks = order_peak_activation(make_schedule("kfkb", p, m, k=k), [1.0] * p)
    assert peaks == tuple(float(min(m, k * (p - s))) for s in range(p))


@given(st.integers(1, 6), st.integers(1, 10))
def test_zb_h1_holds_min_m_and_p_on_every_rank(p: int, m: int) -> None:
    """ZB-H1 frees a microbatch at its W: every rank peaks at min(m, p), 1F1B's first-stage peak."""
    assert order_peak_activation(make_schedule("zb-h1", p, m), [1.0] * p) == (float(min(m, p)),) * p


def test_memory_excess_finds_the_worst_device_and_its_rank() -> None:
    """memory_excess gives (bytes over capacity, rank, device) of the device overflowing most."""
    c = cluster((1.0, 0.5, 1.0, 8.0))
    excess, rank, device = memory_excess(PLAN, c, (0.75 * GIB, 1.5 * GIB))
    assert (excess, rank, device) == (0.5 * GIB, 1, 2)
    excess, rank, device = memory_excess(PLAN, c, (1.0 * GIB, 0.25 * GIB))
    assert (excess, rank, device) == (0.5 * GIB, 0, 1)


def test_memory_excess_is_not_positive_when_everything_fits_and_ties_keep_the_first() -> None:
    """A plan that fits has excess <= 0; equal excesses keep the first rank and device in plan order."""
    excess, rank, device = memory_excess(PLAN, cluster(), (0.5 * GIB, 0.5 * GIB))
    assert (excess, rank, device) == (-0.5 * GIB, 0, 0)
    assert memory_excess(PLAN, cluster(), (GIB, GIB))[0] == 0.0


def test_fit_error_names_stage_device_kind_need_capacity_and_excess() -> None:
    """The error names the worst device's stage, device, kind, need and capacity in GiB, the excess and the plan."""
    error = fit_error(PLAN, cluster(), (0.5 * GIB, 2.25 * GIB), "toy")
    assert isinstance(error, PlanError)
    assert str(error) == (
        "stage 1 needs 2.25 GiB on device 2 (gpu, 1.00 GiB): 1.25 GiB too much (toy, microbatch size 4, schedule 1f1b)"
    )


def test_fit_error_is_none_when_the_plan_fits_exactly() -> None:
    """Needing exactly a device's capacity fits."""
    assert fit_error(PLAN, cluster(), (GIB, GIB), "toy") is None


def test_per_device_spreads_rank_bytes_and_leaves_unused_devices_at_zero() -> None:
    """Every device of a rank's stage gets the rank's bytes; devices outside the plan get 0."""
    assert per_device(PLAN, cluster(), (3.0, 7.0)) == (3.0, 3.0, 7.0, 0.0)


def test_memory_per_device_is_static_plus_in_flight_saved_bytes() -> None:
    """params * (2 + optimizer_factor) + min(m, p - s) * saved * (b/P) / r, per device (linear scaling)."""
    mem = memory_per_device(PLAN, linear_model(profile(), cluster(), optimizer_factor=1.0))
    stage0 = 2e8 * 3 + 2 * (4e6 * 4 / 8 / 2)
    stage1 = 2e8 * 3 + 1 * (4e6 * 4 / 8)
    assert mem == pytest.approx((stage0, stage0, stage1, 0.0))


def test_memory_per_device_follows_measured_saved_bytes_at_b_over_r() -> None:
    """Under measured scaling a stage holds each layer's saved bytes interpolated at b/r samples (here affine: 1e6 + 1e5 x)."""
    sizes = (2, 8)
    saved = tuple(1e6 + 1e5 * s for s in sizes)
    curve = LayerCurve((1.0, 3.0), (2.0, 6.0), saved, saved)
    layers = tuple(LayerProfile(f"l{i}", 1.0, 2.0, saved[0], 1e8, saved[0], curve=curve) for i in range(4))
    measured = ModelProfile("curved", 2, layers, "V100", batch_sizes=sizes, cut_curves=(saved,) * 3)
    mem = memory_per_device(PLAN, default_model(measured, cluster(), optimizer="sgd"))
    stage0 = 2e8 * 2 + 2 * 2 * (1e6 + 1e5 * 2)  # 2 in flight, 2 layers, x = 4 / 2
    stage1 = 2e8 * 2 + 1 * 2 * (1e6 + 1e5 * 4)
    assert mem == pytest.approx((stage0, stage0, stage1, 0.0))


def test_check_fits_raises_for_the_device_that_overflows_most() -> None:
    """check_fits names the profile in its PlanError; a plan that fits returns memory_per_device."""
    small = cluster((1.0, 1.0, 0.5, 8.0))
    # stage 1: 2e8 * (2 + 2) + 2e6 bytes = 0.75 GiB on a 0.5 GiB device
    with pytest.raises(PlanError, match=r"^stage 1 needs 0\.75 GiB on device 2 \(gpu, 0\.50 GiB\): 0\.25 GiB too much \(toy, "):
        check_fits(PLAN, linear_model(profile(), small))
    model = linear_model(profile(), cluster())
    assert check_fits(PLAN, model) == memory_per_device(PLAN, model)


def test_memory_from_a_result_must_have_the_plan_ranks() -> None:
    """A simulation result of another plan (other rank count) is a PlanError naming both counts."""
    model = linear_model(profile(), cluster())
    one_rank = Plan((Stage(0, 3, (0,)),), 1, 4, 4, "1f1b")
    result = simulate_plan(one_rank, model)
    assert result_memory(one_rank, result) == (result.per_rank[0].peak_memory_bytes,)
    with pytest.raises(PlanError, match=r"simulation result has 1 ranks but the plan has 2"):
        memory_per_device(PLAN, model, result)


def gpt_model(recompute: bool, micro: int = 1) -> tuple[CostModel, GptConfig]:
    """A small analytic GPT (presets.gpt_profile: 4 blocks, h 256, a 8, s 128, V 1024) on two DGX H100 servers."""
    config = GptConfig(layers=4, hidden=256, heads=8, seq=128, vocab=1024, micro=micro, gpu="H100", recompute=recompute)
    return CostModel.build(gpt_profile(config), load_cluster("dgx-h100-8x2")), config


def gpt_parameters(config: GptConfig) -> int:
    """Its parameters counted by hand: 12 h^2 + 13 h per block, V h + s h in the embedding, V h + 2 h in the head."""
    h, v, s = config.hidden, config.vocab, config.seq
    return config.layers * (12 * h * h + 13 * h) + v * h + s * h + v * h + 2 * h


@pytest.mark.parametrize("d", [2, 4, 8])
def test_zero_shards_the_master_copy_of_a_mixed_precision_profile(d: int) -> None:
    """A mixed-precision profile (16-bit weights and gradients over a 32-bit master copy) holds, per parameter, 16
    bytes unsharded, 4 + 12/d under ZeRO-1 and 2 + 14/d under ZeRO-2 (Rajbhandari et al., "ZeRO", SC'20: 31.4 and
    16.6 GB for 7.5B parameters on 64 copies); a profile whose weights are the master keeps 16, 8 + 8/d, 4 + 12/d."""
    model, config = gpt_model(recompute=True)
    assert model.profile.master_copy
    model = CostModel.build(dataclasses.replace(model.profile, main_grads="weights"), model.cluster)  # ZeRO's layout
    psi = gpt_parameters(config)
    plan = Plan((Stage(0, model.profile.num_layers - 1, tuple(range(d))),), 1, 1, d, "1f1b")
    per_parameter = {z: 16.0 if z == 0 else 4 + 12 / d if z == 1 else 2 + 14 / d for z in (0, 1, 2)}
    for zero, expected in per_parameter.items():
        static = plan_costs(dataclasses.replace(plan, zero=zero), model).stages[0].static_bytes
        assert static == pytest.approx(expected * psi, rel=1e-12)
    plain = CostModel.build(dataclasses.replace(model.profile, master_copy=False), model.cluster)
    for zero, expected in {0: 16.0, 1: 8 + 8 / d, 2: 4 + 12 / d}.items():
        static = plan_costs(dataclasses.replace(plan, zero=zero), plain).stages[0].static_bytes
        assert static == pytest.approx(expected * psi, rel=1e-12)
    # the 7.5B model of ZeRO's Figure 1 on 64 copies, to the figure's 0.1 GB
    for zero, published in ((1, 31.4), (2, 16.6)):
        formula = Holding(0.5, 0.5, 1.0).sharded(4 * 7.5e9, 2.0, zero, 64)
        assert round(formula / 1e9, 1) == published


@pytest.mark.parametrize(("t", "sp"), [(1, False), (2, False), (4, False), (2, True), (8, True)])
def test_the_first_stage_of_1f1b_holds_korthikanti_bytes_for_p_microbatches(t: int, sp: bool) -> None:
    """Without recomputation, rank 0 of a 1F1B pipeline of p stages (the embedding and l/p blocks on stage 0) holds p
    microbatches' saved bytes: per block s b h (10 + 24/t + 5 a s/(h t)) without sequence parallelism and
    s b h (34 + 5 a s/h) / t with it (Korthikanti et al. 2022, Table 2; t = 1: s b h (34 + 5 a s/h)), plus the
    embedding's dropout mask s b h (split by t under sequence parallelism), over its static 18 bytes per parameter
    (bf16: fp32 main gradients) of the stage's share (1/t of each split layer)."""
    model, config = gpt_model(recompute=False, micro=2)
    b, s, h, a, v, layers = config.micro, config.seq, config.hidden, config.heads, config.vocab, config.layers
    p = 2
    per_stage = layers // p
    first_last = 2 * per_stage  # the embedding is layer 0, each block two layers
    devices = tuple(range(p * t))
    stages = (
        Stage(0, first_last, devices[:t], tp=t, sequence_parallel=sp),
        Stage(first_last + 1, model.profile.num_layers - 1, devices[t:], tp=t, sequence_parallel=sp),
    )
    plan = Plan(stages, 1, 4, b, "1f1b")
    block = s * b * h * (34 + 5 * a * s / h) / t if sp else s * b * h * (10 + 24 / t + 5 * a * s / (h * t))
    mask = s * b * h / t if sp else s * b * h
    params = v * h + s * h + per_stage * (12 * h * h + 13 * h)  # all of it splits over the group
    expected = 18 * params / t + p * (per_stage * block + mask)
    assert memory_per_device(plan, model)[0] == pytest.approx(expected, rel=1e-12)
