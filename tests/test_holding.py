"""Tests of sim.cost.holding: the bytes per parameter of every gradient layout against Megatron-LM's and ZeRO's
published counts, the same bytes in the cost model and the t = 1 planners, and the gradient exchange in the dtype
the gradients are reduced in."""

from __future__ import annotations

import dataclasses
import math

import pytest

from models import linear_model
from pipeplan.core.errors import PlanError, ProfileError
from pipeplan.core.hardware.cluster import Cluster, Device
from pipeplan.core.plan import Plan, Stage
from pipeplan.core.profile import LayerProfile, ModelProfile
from pipeplan.planner.bound.shape_bounds import ShapeBounds, lower_bound
from pipeplan.planner.planners import run_planner
from pipeplan.planner.request import PlanRequest
from pipeplan.presets.gpt_profile import GptConfig, gpt_profile
from pipeplan.sim.cost.holding import holding
from pipeplan.sim.cost.plan_costs import plan_costs

GB = 1e9
RATE, LATENCY_MS = 100 * GB, 5e-3
PARAMS = (1e8, 2e8, 5e7)  # parameters per layer; param_bytes count 4 bytes each (the fp32 master, or fp32 weights)

# layout -> (the profile's master_copy and main_grads, bytes per parameter held unsharded, held under ZeRO-1 over d
# and ZeRO-2 over d, and bytes per parameter the gradient exchange moves), with Adam (12 bytes of master and moments)
LAYOUTS = {
    "fp32 weights": ((False, "weights"), 16.0, lambda d: 8 + 8 / d, lambda d: 4 + 12 / d, 4.0),
    "zero": ((True, "weights"), 16.0, lambda d: 4 + 12 / d, lambda d: 2 + 14 / d, 2.0),
    "megatron bf16": ((True, "fp32"), 18.0, lambda d: 6 + 12 / d, lambda d: 2 + 16 / d, 4.0),
    "megatron fp16": ((True, "fp32_copy"), 20.0, lambda d: 4 + 16 / d, lambda d: 2 + 18 / d, 2.0),
}


def profile(master_copy: bool, main_grads: str, memory_saved: float = 1e6) -> ModelProfile:
    """Three layers of PARAMS parameters (4 bytes each in param_bytes) held as (master_copy, main_grads) say."""
    layers = tuple(LayerProfile(f"l{i}", 1.0 + i, 2.0 + 2 * i, 1e6, 4 * p, memory_saved) for i, p in enumerate(PARAMS))
    return ModelProfile("holding", 8, layers, "A100", master_copy=master_copy, main_grads=main_grads)


def cluster(n: int = 8, memory: float = 80 * 2**30) -> Cluster:
    """n devices on one node, every link RATE bytes/s and LATENCY_MS."""
    devices = tuple(Device(i, "A100", memory, 1.0, 0) for i in range(n))
    bw = tuple(tuple(0.0 if a == b else RATE for b in range(n)) for a in range(n))
    lat = tuple(tuple(0.0 if a == b else LATENCY_MS for b in range(n)) for a in range(n))
    return Cluster("c", devices, bw, lat)


@pytest.mark.parametrize(
    ("main_grads", "unsharded", "d8", "d64"),
    [("fp32", 18.0, 7.5, 6.1875), ("fp32_copy", 20.0, 6.0, 4.25)],
)
def test_megatron_distrib_optimizer_table(main_grads: str, unsharded: float, d8: float, d64: float) -> None:
    """NVIDIA/Megatron-LM docs/source/distrib_optimizer.md, bytes per parameter without and with the distributed
    optimizer (ZeRO-1) at d 8 and 64: "bf16 param, fp32 grads" 18 / 7.5 / 6.1875 (6 + 12/d), "fp16 param, fp16
    grads" 20 / 6 / 4.25 (4 + 16/d); "fp32 param, fp32 grads" 16 / 9 / 8.125 (8 + 8/d)."""
    for held, figures in ((holding(profile(True, main_grads)), (unsharded, d8, d64)),
                          (holding(profile(False, "weights")), (16.0, 9.0, 8.125))):  # fmt: skip
        per_parameter = (held.factor(2.0) * 4, held.sharded(4.0, 2.0, 1, 8), held.sharded(4.0, 2.0, 1, 64))
        assert per_parameter == pytest.approx(figures, rel=1e-12)


def test_zero_figure_1_still_holds_for_16_bit_gradients() -> None:
    """Rajbhandari et al., "ZeRO", SC'20, Figure 1: 7.5B parameters on 64 copies hold 120, 31.4 and 16.6 GB
    (16, 4 + 12/64 and 2 + 14/64 bytes per parameter)."""
    held = holding(profile(True, "weights"))
    psi = 7.5e9
    assert held.factor(2.0) * 4 * psi / GB == pytest.approx(120.0, rel=1e-12)
    assert round(held.sharded(4 * psi, 2.0, 1, 64) / GB, 1) == 31.4
    assert round(held.sharded(4 * psi, 2.0, 2, 64) / GB, 1) == 16.6


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("d", [2, 8])
def test_the_cost_model_holds_and_exchanges_each_layout(layout: str, d: int) -> None:
    """A one-stage plan over d copies: its static bytes are the layout's bytes per parameter (unsharded, ZeRO-1,
    ZeRO-2) x the parameters, and its all-reduce moves the layout's gradient bytes: 2(d-1)/d x bytes / RATE +
    2(d-1) x LATENCY_MS (the same at every ZeRO stage: reduce-scatter and all-gather move what the all-reduce does)."""
    (master, grads), unsharded, zero1, zero2, exchanged = LAYOUTS[layout]
    model = linear_model(profile(master, grads), cluster())
    plan = Plan((Stage(0, 2, tuple(range(d))),), 1, 1, 8, "1f1b")
    psi = sum(PARAMS)
    ring = 2 * (d - 1) / d * exchanged * psi / RATE * 1000 + 2 * (d - 1) * LATENCY_MS
    for zero, per_parameter in ((0, unsharded), (1, zero1(d)), (2, zero2(d))):
        cost = plan_costs(dataclasses.replace(plan, zero=zero), model).stages[0]
        assert cost.static_bytes == pytest.approx(per_parameter * psi, rel=1e-12)
        assert cost.allreduce_ms == pytest.approx(ring, rel=1e-12)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_the_lower_bound_reads_the_same_bytes(layout: str) -> None:
    """planner.bound's static bytes per layer are the layout's bytes per parameter x its parameters, and its
    all-reduce term on 8 devices moves the layout's gradient bytes (ShapeBounds.allreduce_ms of the parameter bytes)."""
    (master, grads), unsharded, _, _, exchanged = LAYOUTS[layout]
    bounds = ShapeBounds(PlanRequest(profile(master, grads), cluster(), 64))
    assert list(bounds.static) == pytest.approx([unsharded * p for p in PARAMS], rel=1e-12)
    ring = bounds.allreduce_ms(bounds.params, 8)
    assert list(ring) == pytest.approx([7 / 4 * exchanged * p / RATE * 1000 + 14 * LATENCY_MS for p in PARAMS], rel=1e-12)


@pytest.mark.parametrize("planner", ["pipeplan", "exact"])
def test_fp32_main_grads_need_two_more_bytes_per_parameter_in_every_planner(planner: str) -> None:
    """One device with room for 17 bytes per parameter (and the microbatches' saved bytes): ZeRO's layout (16)
    plans, Megatron-LM's bf16 layout (18) is refused as too big by planner.search and planner.exact, and the
    lower bound is inf (memory) for it."""
    psi = sum(PARAMS)
    room = cluster(1, memory=17 * psi)
    fits = PlanRequest(profile(True, "weights"), room, 8, microbatch_size=8, schedule="1f1b")
    result = run_planner(planner, fits)
    assert len(result.plan.stages) == 1
    assert math.isfinite(lower_bound(fits).ms)
    too_big = dataclasses.replace(fits, profile=profile(True, "fp32"))
    with pytest.raises(PlanError, match="memory"):
        run_planner(planner, too_big)
    assert lower_bound(too_big).ms == math.inf


def test_a_bad_main_grads_is_one_profile_error() -> None:
    """main_grads must be one of MAIN_GRADS, and anything but "weights" needs a master copy."""
    with pytest.raises(ProfileError, match=r"main_grads must be one of 'weights', 'fp32', 'fp32_copy', got 'fp64'"):
        profile(True, "fp64")
    with pytest.raises(ProfileError, match=r"main_grads 'fp32' needs master_copy true"):
        profile(False, "fp32")


@pytest.mark.parametrize(("precision", "main_grads"), [("bf16", "fp32"), ("fp16", "fp32_copy")])
def test_gpt_profiles_hold_gradients_as_megatron_does(precision: str, main_grads: str) -> None:
    """An analytic gpt: profile under bf16 keeps fp32 main grads, under fp16 16-bit ones with an fp32 copy."""
    config = GptConfig(layers=2, hidden=64, heads=4, seq=8, vocab=16, precision=precision)
    built = gpt_profile(config)
    assert built.master_copy and built.main_grads == main_grads
