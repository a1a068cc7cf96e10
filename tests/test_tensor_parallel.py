"""Tests of sim.cost.tensor_parallel: a 3D plan's costs against hand computations (compute / t, ring collectives over
the group, Korthikanti's activation split, ZeRO's state), and the refusals that name stage, layer and width."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from models import default_model, linear_model
from pipeplan.core.errors import PlanError
from pipeplan.core.hardware.cluster import Cluster, Device
from pipeplan.core.layer_profile import TP_KINDS
from pipeplan.core.plan import Plan, Stage
from pipeplan.core.profile import LayerCurve, LayerProfile, ModelProfile, SharedGroup, SplitTiming, TensorSplit
from pipeplan.sim.cost.holding import PLAIN
from pipeplan.sim.cost.link_model import ring_allreduce_parts
from pipeplan.sim.cost.memory import memory_per_device
from pipeplan.sim.cost.plan_costs import plan_costs
from pipeplan.sim.cost.tensor_parallel import split_stage
from pipeplan.sim.plan_sim import simulate_plan

GB = 1e9
INTRA, INTER = 200 * GB, 10 * GB
INTRA_MS, INTER_MS = 2e-3, 2e-2

# (name, fwd ms, bwd ms, output bytes, param bytes, saved bytes, split)
LAYERS = (
    ("embed", 1.0, 2.0, 4e6, 8e8, 1e6, TensorSplit("vocab", 32000)),
    ("block0", 8.0, 16.0, 4e6, 4e8, 34e6, TensorSplit("block", 16)),
    ("norm", 0.5, 1.0, 4e6, 1e4, 4e6, None),
    ("block1", 8.0, 16.0, 4e6, 4e8, 34e6, TensorSplit("block", 16)),
    ("head", 3.0, 6.0, 64e6, 8e8, 68e6, TensorSplit("column", 32000)),
)
CUTS = (4e6, 4e6, 4e6, 5e6)


def profile(shared: bool = False) -> ModelProfile:
    """A small GPT: vocab-parallel embedding, two Megatron blocks around a norm that cannot split, a column head."""
    layers = tuple(LayerProfile(n, f, b, a, p, s, tp=tp) for n, f, b, a, p, s, tp in LAYERS)
    groups = (SharedGroup("wte", (0, 4), 8e8),) if shared else ()
    return ModelProfile("gpt-toy", 8, layers, "A100", CUTS, shared_params=groups)


def cluster(nodes: int = 2, per_node: int = 4) -> Cluster:
    """nodes x per_node devices: INTRA bytes/s and INTRA_MS inside a node, INTER and INTER_MS between nodes."""
    n = nodes * per_node
    devices = tuple(Device(i, "A100", 80 * 2**30, 1.0, i // per_node) for i in range(n))
    same = [[a // per_node == b // per_node for b in range(n)] for a in range(n)]
    bw = tuple(tuple(0.0 if a == b else INTRA if same[a][b] else INTER for b in range(n)) for a in range(n))
    lat = tuple(tuple(0.0 if a == b else INTRA_MS if same[a][b] else INTER_MS for b in range(n)) for a in range(n))
    return Cluster("c", devices, bw, lat)


def ring_ms(t: int, nbytes: float, count: int, rate: float = INTRA, latency: float = INTRA_MS) -> float:
    """count ring all-reduces over t devices moving nbytes in all: 2(t-1)/t nbytes / rate + count 2(t-1) latency."""
    return 2 * (t - 1) / t * nbytes / rate * 1000 + count * 2 * (t - 1) * latency


def gather_ms(t: int, nbytes: float, rate: float = INTRA, latency: float = INTRA_MS) -> float:
    """A ring all-gather over t devices of a whole nbytes: (t-1)/t nbytes / rate + (t-1) latency."""
    return (t - 1) / t * nbytes / rate * 1000 + (t - 1) * latency


def test_a_one_stage_tp2_plan_takes_compute_over_two_plus_its_ring_collectives() -> None:
    """Iteration of a one-stage t=2 plan = m (F + B), F and B by hand: split layers / 2, the norm whole, and the
    vocab (1 fwd), blocks (2 + 2) and head (1 bwd, its input: the cut before it) all-reduces on the ring of 2."""
    m = 4
    plan = Plan((Stage(0, 4, (0, 1), tp=2),), 1, m, 8, "1f1b")
    model = linear_model(profile(), cluster(), optimizer="sgd")
    fwd = (1.0 + 8.0 + 8.0 + 3.0) / 2 + 0.5 + ring_ms(2, 4e6 + 2 * 4e6 + 2 * 4e6, 5)
    bwd = (2.0 + 16.0 + 16.0 + 6.0) / 2 + 1.0 + ring_ms(2, 2 * 4e6 + 2 * 4e6 + CUTS[3], 5)
    cost = plan_costs(plan, model).stages[0]
    assert cost.fwd_ms == pytest.approx(fwd, rel=1e-12) and cost.bwd_ms == pytest.approx(bwd, rel=1e-12)
    assert cost.bwd_input_ms == pytest.approx((bwd - ring_ms(2, 4e6 * 4 + CUTS[3], 5)) / 2 + ring_ms(2, 4e6 * 4 + CUTS[3], 5))
    assert simulate_plan(plan, model).iteration_time == pytest.approx(m * (fwd + bwd), rel=1e-12)


@pytest.mark.parametrize("sp", [False, True])
def test_a_splits_whole_work_runs_on_every_device_and_a_recomputed_forwards_collectives_rerun(sp: bool) -> None:
    """A block whose split says 1/4 of its forward and 1/2 of its backward run whole (norms, residual adds) and that
    it is recomputed, on one group of t = 4: F = 8 (1/4 + (3/4)/4) + 2 all-reduces of its output, B = 24 (1/2 +
    (1/2)/4) + 2 + 2 (the rerun forward's); with sequence parallelism the whole work splits too: 8/4 and 24/4."""
    split = TensorSplit("block", 16, None, 0.25, 0.5, True)
    prof = ModelProfile("one", 8, (LayerProfile("block", 8.0, 24.0, 4e6, 4e8, 34e6, tp=split),), "A100")
    plan = Plan((Stage(0, 0, (0, 1, 2, 3), tp=4, sequence_parallel=sp),), 1, 2, 8, "1f1b")
    cost = plan_costs(plan, linear_model(prof, cluster(), optimizer="sgd")).stages[0]
    fwd = 8.0 / 4 if sp else 8.0 * (0.25 + 0.75 / 4)
    bwd = 24.0 / 4 if sp else 24.0 * (0.5 + 0.5 / 4)
    # with sequence parallelism: the gather of its output where its run ends, rerun in the backward (recomputed), no
    # input gradient to gather before the first layer, and its two norms' gradient all-reduces (latency only)
    fwd_sp = gather_ms(4, 4e6) if sp else 0.0
    bwd_sp = gather_ms(4, 4e6) + 2 * 2 * 3 * INTRA_MS if sp else 0.0
    assert cost.fwd_ms == pytest.approx(fwd + ring_ms(4, 2 * 4e6, 2) + fwd_sp, rel=1e-12)
    assert cost.bwd_ms == pytest.approx(bwd + ring_ms(4, 4 * 4e6, 4) + bwd_sp, rel=1e-12)
    assert cost.static_bytes == pytest.approx(4e8 / 4 * 2, rel=1e-12)  # weights and SGD's gradients / t, unchanged


@pytest.mark.parametrize(("first", "t"), [(0, 2), (1, 2), (3, 4), (0, 4)])
def test_sequence_parallelism_adds_each_runs_boundary_gathers_and_its_norms_all_reduces(first: int, t: int) -> None:
    """A stage from layer `first` to the head of the toy GPT (after a one-device stage when first > 0), with and
    without sequence parallelism (the blocks' whole shares are 0, so compute is the same): the difference is, per run
    of consecutive blocks (block0 and block1, split by the norm), an all-gather of its output in the forward and of
    its input's gradient (the cut before it) in the backward, and two norm all-reduces per block in the backward, each
    ring over the group by hand."""
    devices = tuple(range(t))
    before = (Stage(0, first - 1, (t,)),) if first else ()
    plain = Plan((*before, Stage(first, 4, devices, tp=t)), 1, 2, 8, "1f1b")
    sp = Plan((*before, Stage(first, 4, devices, tp=t, sequence_parallel=True)), 1, 2, 8, "1f1b")
    model = linear_model(profile(), cluster(), optimizer="sgd")
    a, b = plan_costs(plain, model).stages[-1], plan_costs(sp, model).stages[-1]
    blocks = [i for i in (1, 3) if i >= first]
    fwd = sum(gather_ms(t, LAYERS[i][3]) for i in blocks)
    bwd = sum(gather_ms(t, CUTS[i - 1]) + 2 * 2 * (t - 1) * INTRA_MS for i in blocks)
    assert b.fwd_ms - a.fwd_ms == pytest.approx(fwd, rel=1e-12)
    assert b.bwd_ms - a.bwd_ms == pytest.approx(bwd, rel=1e-12)
    assert b.bwd_input_ms - a.bwd_input_ms == pytest.approx(bwd, rel=1e-12)


def test_weights_and_activations_divide_as_korthikanti_says() -> None:
    """Per device: split layers' weights, gradients and Adam state / t, the norm's whole; saved bytes: a block keeps
    10/34 whole and the rest / t, the norm all of it; with sequence parallelism every split layer's saved bytes / t."""
    t = 4
    plain = Plan((Stage(0, 4, (0, 1, 2, 3), tp=t),), 1, 1, 8, "1f1b")
    sp = Plan((Stage(0, 4, (0, 1, 2, 3), tp=t, sequence_parallel=True),), 1, 1, 8, "1f1b")
    model = linear_model(profile(), cluster())
    params = (8e8 + 4e8 + 4e8 + 8e8) / t + 1e4
    whole = 10 / 34
    saved = 1e6 / t + 2 * 34e6 * (whole + (1 - whole) / t) + 4e6 + 68e6 / t
    cost = plan_costs(plain, model).stages[0]
    assert cost.static_bytes == pytest.approx(params * 4, rel=1e-12)
    assert cost.saved_bytes == pytest.approx(saved, rel=1e-12)
    assert plan_costs(sp, model).stages[0].saved_bytes == pytest.approx((1e6 + 68e6 + 68e6) / t + 4e6, rel=1e-12)
    per_device = memory_per_device(plain, model)
    assert per_device[:4] == (per_device[0],) * 4 and per_device[0] == pytest.approx(params * 4 + saved, rel=1e-12)


def test_a_shared_weight_split_over_the_group_is_held_once_per_device() -> None:
    """Tied embedding and head both split / t: the stage holds the tied weight once, / t (never a negative sum)."""
    plan = Plan((Stage(0, 4, (0, 1, 2, 3), tp=4),), 1, 1, 8, "1f1b")
    cost = plan_costs(plan, linear_model(profile(shared=True), cluster())).stages[0]
    assert cost.static_bytes == pytest.approx(((8e8 + 4e8 + 4e8) / 4 + 1e4) * 4, rel=1e-12)


def test_zero_shards_optimizer_state_then_gradients_over_the_data_parallel_copies() -> None:
    """d = 2 groups of t = 2: ZeRO-1 holds P (2 + 2/d), ZeRO-2 P (1 + 1/d + 2/d) (Adam), the step / d, and the
    data-parallel ring (over the first device of each group) moves the same bytes as without sharding."""
    devices = (0, 1, 4, 5)
    base = Plan((Stage(0, 4, devices, tp=2),), 1, 1, 8, "1f1b")
    model = linear_model(profile(), cluster(), optimizer="adam")
    params = (8e8 + 4e8 + 4e8 + 8e8) / 2 + 1e4
    plain = plan_costs(base, model).stages[0]
    for zero, static in ((1, params * (2 + 2 / 2)), (2, params * (1 + 1 / 2 + 2 / 2))):
        cost = plan_costs(dataclasses.replace(base, zero=zero), model).stages[0]
        assert cost.static_bytes == pytest.approx(static, rel=1e-12)
        assert cost.optimizer_ms == plain.optimizer_ms / 2
        assert (cost.allreduce_ms, cost.allreduce_ring) == (plain.allreduce_ms, plain.allreduce_ring)
    assert plain.allreduce_ring == (0, 4)
    assert plain.allreduce_ms == ring_allreduce_parts(model.cluster, (0, 4), params)[0]
    assert plain.static_bytes == params * 4


@settings(max_examples=40, deadline=None)
@given(st.floats(1.0, 1e12), st.floats(0.0, 16.0), st.integers(1, 64))
def test_sharded_static_bytes_is_the_closed_form(param_bytes: float, factor: float, d: int) -> None:
    """Weights that are the master: ZeRO-1 P (2 + f/d); ZeRO-2 P (1 + 1/d + f/d); never more than unsharded P (2 + f)."""
    one = PLAIN.sharded(param_bytes, factor, 1, d)
    two = PLAIN.sharded(param_bytes, factor, 2, d)
    assert one == pytest.approx(param_bytes * (2 + factor / d), rel=1e-12)
    assert two == pytest.approx(param_bytes * (1 + 1 / d + factor / d), rel=1e-12)
    assert two <= one * (1 + 1e-12) <= param_bytes * (2 + factor) * (1 + 1e-12)


def test_a_group_split_across_servers_is_priced_on_its_slowest_link() -> None:
    """Groups (0, 1) and (3, 4) on a 4-per-node cluster: (3, 4) crosses nodes, and the stage pays its ring (each of
    the r = 2 replicas takes half the microbatch: half the compute, half the bytes)."""
    plan = Plan((Stage(0, 4, (0, 1, 3, 4), tp=2),), 1, 1, 8, "1f1b")
    cost = plan_costs(plan, linear_model(profile(), cluster(), optimizer="sgd")).stages[0]
    fwd = ((1.0 + 8.0 + 8.0 + 3.0) / 2 + 0.5) / 2 + ring_ms(2, 5 * 4e6 / 2, 5, INTER, INTER_MS)
    assert cost.fwd_ms == pytest.approx(fwd, rel=1e-12)


def test_a_pipeline_of_tp_stages_transfers_over_the_groups_devices() -> None:
    """Two t = 2 stages: the cut is split over the 2 device pairs (0->2, 1->3), each carrying half."""
    plan = Plan((Stage(0, 1, (0, 1), tp=2), Stage(2, 4, (2, 3), tp=2)), 1, 2, 8, "1f1b")
    costs = plan_costs(plan, linear_model(profile(), cluster()))
    assert [f.link for f in costs.forward[0]] == [(0, 2), (1, 3)]
    assert costs.forward[0][0].work_ms == pytest.approx(CUTS[1] / 2 / INTRA * 1000, rel=1e-12)


def test_tp_one_and_zero_off_give_exactly_the_plain_costs() -> None:
    """A profile with splits priced by a plan without tp or zero costs what it costs without the splits."""
    plan = Plan((Stage(0, 2, (0, 1)), Stage(3, 4, (2,))), 1, 2, 8, "1f1b")
    stripped = dataclasses.replace(profile(), layers=tuple(dataclasses.replace(x, tp=None) for x in profile().layers))
    c = cluster()
    assert plan_costs(plan, linear_model(profile(), c)) == plan_costs(plan, linear_model(stripped, c))


def test_a_tp_that_does_not_divide_a_split_layer_is_refused_naming_stage_layer_and_width() -> None:
    """t = 3 does not divide the blocks' 16 heads (nor 32,000): PlanError naming stage, layer, width and way out."""
    plan = Plan((Stage(0, 4, (0, 1, 2), tp=3),), 1, 1, 8, "1f1b")
    with pytest.raises(PlanError, match=r"stage 0 \(layers 0..4\) has tp 3, which does not divide layer 0 \('embed'\) tp"):
        plan_costs(plan, linear_model(profile(), cluster()))
    eight = Plan((Stage(0, 4, tuple(range(8)), tp=8),), 1, 1, 8, "1f1b")
    four_heads = [
        dataclasses.replace(x, tp=TensorSplit("block", 4)) if x.name.startswith("block") else x for x in profile().layers
    ]
    narrow = dataclasses.replace(profile(), layers=tuple(four_heads))
    with pytest.raises(PlanError, match=r"layer 1 \('block0'\) tp width 4 \(its block split\); give tp a divisor of 4"):
        plan_costs(eight, linear_model(narrow, cluster()))


def test_the_stage_memo_keeps_tp_and_zero_apart() -> None:
    """Plans that differ only in tp's sequence parallelism or zero are priced apart through one memo."""
    memo: dict = {}
    model = linear_model(profile(), cluster())
    base = Plan((Stage(0, 4, (0, 1, 4, 5), tp=2),), 1, 1, 8, "1f1b")
    sp = Plan((Stage(0, 4, (0, 1, 4, 5), tp=2, sequence_parallel=True),), 1, 1, 8, "1f1b")
    for plan in (base, sp, dataclasses.replace(base, zero=1)):
        assert plan_costs(plan, model, stage_memo=memo) == plan_costs(plan, model)
    assert len(memo) == 3


def reference_split(prof: ModelProfile, first: int, last: int, t: int, sp: bool, x: float) -> tuple[float, float, float, float]:
    """Plain per-layer code under linear scaling at x samples per device: (fwd ms, bwd ms, saved bytes, param bytes)."""
    fwd = bwd = saved = params = 0.0
    for i in range(first, last + 1):
        layer, scale = prof.layers[i], x / prof.batch_size
        split = layer.tp
        if split is None:
            fwd, bwd = fwd + layer.fwd_ms * scale, bwd + layer.bwd_ms * scale
            saved, params = saved + layer.saved_bytes * scale, params + layer.param_bytes
            continue
        whole = 0.0 if sp else split.whole_share
        whole_fwd, whole_bwd = (0.0, 0.0) if sp else (split.whole_fwd, split.whole_bwd)
        fwd += layer.fwd_ms * scale * (whole_fwd + (1 - whole_fwd) / t)
        bwd += layer.bwd_ms * scale * (whole_bwd + (1 - whole_bwd) / t)
        saved += layer.saved_bytes * scale * (whole + (1 - whole) / t)
        params += layer.param_bytes / t
    return fwd, bwd, saved, params


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0.0, 50.0), st.floats(0.0, 1e9), st.floats(0.0, 1e8), st.sampled_from((None, *TP_KINDS)),
                       st.floats(0.0, 1.0), st.floats(0.0, 1.0)),
             min_size=1, max_size=8),
    st.sampled_from((2, 4, 8)), st.booleans(), st.data(),
)  # fmt: skip
def test_split_stage_matches_plain_per_layer_code(layers: list, t: int, sp: bool, data: st.DataObject) -> None:
    """For any chain of split and whole layers, any span, t and sequence parallelism: the stage's forward, saved and
    parameter bytes per device are what a plain loop over the layers gives, whatever share of each split layer's
    forward and backward runs whole."""
    splits = [None if k is None else TensorSplit(k, 8, None, wf, wb) for *_, k, wf, wb in layers]
    prof = ModelProfile(
        "p", 8, tuple(LayerProfile(f"l{i}", f, 2 * f, 1e3, p, s, tp=splits[i]) for i, (f, p, s, *_) in enumerate(layers))
    )
    first = data.draw(st.integers(0, len(layers) - 1))
    last = data.draw(st.integers(first, len(layers) - 1))
    r = data.draw(st.sampled_from((1, 2)))
    work, _ = split_stage(linear_model(prof, cluster()).layers, range(first, last + 1), 8, r, 1.0, t, sp)
    fwd, bwd, saved, params = reference_split(prof, first, last, t, sp, 8 / r)
    assert work.fwd_ms == pytest.approx(fwd, rel=1e-12, abs=1e-12)
    assert work.bwd_ms == pytest.approx(bwd, rel=1e-12, abs=1e-12)
    assert work.saved_bytes == pytest.approx(saved, rel=1e-12, abs=1e-6)
    assert work.param_bytes == pytest.approx(params, rel=1e-12, abs=1e-6)


def timed_profile(timed: tuple[SplitTiming, ...]) -> ModelProfile:
    """profile() with block0's split carrying `timed` (its measured time on one device of a group)."""
    base = profile()
    block = base.layers[1]
    assert block.tp is not None
    split = dataclasses.replace(block.tp, timed=timed)
    return dataclasses.replace(base, layers=(base.layers[0], dataclasses.replace(block, tp=split), *base.layers[2:]))


@pytest.mark.parametrize("microbatch", [8, 4])
def test_a_block_timed_at_t_is_priced_at_its_measured_share_and_other_degrees_by_the_formula(microbatch: int) -> None:
    """block0 measured at t = 2 (fwd 6, bwd 10 against its dense 8 and 16: shares 3/4 and 5/8): a t = 2 stage runs
    it in 6 x b/8 and 10 x b/8 (linear scaling), the other split layers / 2; at t = 4, not measured, 8 / 4."""
    model = linear_model(timed_profile((SplitTiming(2, (6.0,), (10.0,)),)), cluster(), optimizer="sgd")
    scale = microbatch / 8
    work, _ = split_stage(model.layers, range(5), microbatch, 1, 1.0, 2, False)
    assert work.fwd_ms == pytest.approx(((1.0 + 8.0 + 3.0) / 2 + 0.5 + 6.0) * scale, rel=1e-12)
    assert work.bwd_ms == pytest.approx(((2.0 + 16.0 + 6.0) / 2 + 1.0 + 10.0) * scale, rel=1e-12)
    work4, _ = split_stage(model.layers, range(5), microbatch, 1, 1.0, 4, False)
    assert work4.fwd_ms == pytest.approx(((1.0 + 8.0 + 8.0 + 3.0) / 4 + 0.5) * scale, rel=1e-12)
    plan = Plan((Stage(0, 4, (0, 1), tp=2),), 1, 4, microbatch, "1f1b")
    fwd = ((1.0 + 8.0 + 3.0) / 2 + 0.5 + 6.0) * scale + ring_ms(2, 5 * 4e6 * scale, 5)
    assert plan_costs(plan, model).stages[0].fwd_ms == pytest.approx(fwd, rel=1e-12)


@pytest.mark.parametrize(
    ("samples", "dense", "share"), [(2, 2.0, 1.5), (4, 4.0, 1.25), (8, 8.0, 0.75), (16, 16.0, 0.75), (1, 2.0, 1.5)]
)
def test_a_measured_share_is_interpolated_between_sizes_and_held_beyond(samples: int, dense: float, share: float) -> None:
    """A block measured at sizes 2 and 8 (dense fwd 2 and 8 ms, split at t = 2 3 and 6 ms: shares 1.5 and 0.75): at x
    samples its time is the dense time at x (sim.cost.layers' measured curve: extended segments, never below its
    smallest) times the share interpolated linearly in x, held at 1.5 below 2 and 0.75 above 8."""
    curve = LayerCurve((2.0, 8.0), (4.0, 16.0), (1e3, 4e3), (1e3, 4e3))
    split = TensorSplit("block", 4, timed=(SplitTiming(2, (3.0, 6.0), (4.0, 8.0)),))
    layer = LayerProfile("block", 8.0, 16.0, 4e3, 1e6, 4e3, curve=curve, tp=split)
    prof = ModelProfile("timed", 8, (layer,), "A100", (), batch_sizes=(2, 8), cut_curves=())
    model = default_model(prof, cluster())
    work, _ = split_stage(model.layers, [0], samples, 1, 1.0, 2, False)
    assert work.fwd_ms == pytest.approx(dense * share, rel=1e-12)
    bwd_share = np.interp(samples, [2, 8], [1.0, 0.5])
    assert work.bwd_ms == pytest.approx(2 * dense * bwd_share, rel=1e-12)


def test_a_measured_tp_allreduce_replaces_the_groups_links_on_a_node_and_the_slower_across() -> None:
    """A cluster carrying the TP all-reduce's fit (1 GB/s, 0.3 ms per step): a group on one node prices its 5
    all-reduces with it. With a fit faster than the links between nodes (100 GB/s, 1 us), a group on one node takes
    the fit, a group across nodes the slower of each: its links' INTER rate and latency."""
    measured = dataclasses.replace(cluster(), tp_allreduce_bytes_per_s=1 * GB, tp_allreduce_latency_ms=0.3)
    model = linear_model(profile(), measured, optimizer="sgd")
    compute = (1.0 + 8.0 + 8.0 + 3.0) / 2 + 0.5
    inside = plan_costs(Plan((Stage(0, 4, (0, 1), tp=2),), 1, 1, 8, "1f1b"), model).stages[0]
    assert inside.fwd_ms == pytest.approx(compute + ring_ms(2, 5 * 4e6, 5, 1 * GB, 0.3), rel=1e-12)
    slow = dataclasses.replace(cluster(), tp_allreduce_bytes_per_s=100 * GB, tp_allreduce_latency_ms=1e-3)
    across = plan_costs(Plan((Stage(0, 4, (3, 4), tp=2),), 1, 1, 8, "1f1b"), linear_model(profile(), slow)).stages[0]
    assert across.fwd_ms == pytest.approx(compute + ring_ms(2, 5 * 4e6, 5, INTER, INTER_MS), rel=1e-12)
    fast_inside = plan_costs(Plan((Stage(0, 4, (0, 1), tp=2),), 1, 1, 8, "1f1b"), linear_model(profile(), slow)).stages[0]
    assert fast_inside.fwd_ms == pytest.approx(compute + ring_ms(2, 5 * 4e6, 5, 100 * GB, 1e-3), rel=1e-12)
