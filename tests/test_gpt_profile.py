"""presets.gpt_profile: an analytic GPT profile's FLOPs and bytes against the papers' closed forms."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeplan.core.errors import ProfileError
from pipeplan.presets.gpt_profile import (
    GptConfig,
    attention_core_ms,
    gpt_profile,
    iteration_flops,
    layer_flops,
    memory_bound_bytes,
    parse_gpt_spec,
    tensor_parallel_role,
    tensor_splits,
)
from pipeplan.presets.resolve import load_profile

configs = st.builds(
    GptConfig,
    layers=st.integers(1, 8),
    hidden=st.sampled_from([64, 128, 1024, 12288]),
    heads=st.sampled_from([1, 2, 4, 8]),
    seq=st.sampled_from([1, 128, 2048]),
    vocab=st.sampled_from([1, 1000, 51200]),
    micro=st.integers(1, 8),
    gpu=st.sampled_from(["A100-80GB", "H100"]),
    recompute=st.booleans(),
)


@given(configs)
def test_iteration_flops_are_narayanan_et_al(config: GptConfig) -> None:
    """One microbatch's FLOPs over every layer are 96 (with recomputation) or 72 x B s l h^2 (1 + s/6h + V/16lh)."""
    b, s, h, v, n = config.micro, config.seq, config.hidden, config.vocab, config.layers
    factor = 96 if config.recompute else 72
    expected = factor * b * s * n * h * h * (1 + s / (6 * h) + v * 96 / (16 * n * h * factor))
    profile = gpt_profile(config)
    total = sum(layer.flops or 0.0 for layer in profile.layers)
    assert math.isclose(total, expected, rel_tol=1e-12)
    assert math.isclose(iteration_flops(config), expected, rel_tol=1e-12)


HBM_BYTES_PER_MS = {"A100-80GB": 2039e9 * 0.88 / 1e3, "H100": 3350e9 / 1e3}
"""The A100 80GB's 2,039 GB/s at its measured 88% (presets.calibrated.A100_HBM_FRACTION); the H100's nominal."""


@given(configs)
def test_times_are_flops_at_the_measured_matmul_rate_plus_bytes_at_the_hbm_rate(config: GptConfig) -> None:
    """Each layer's forward is its linear FLOPs over peak x fraction plus its memory-bound bytes over the HBM rate,
    the attention's two score matmuls each at the roofline max(2 B s^2 h / rate, (4 s B h + 2 a s^2 B) / HBM rate);
    its backward likewise with twice the FLOPs and four score matmuls (a block's with its recomputed forward)."""
    peak = {"A100-80GB": 312e12 * 0.737, "H100": 989e12 * 0.801}[config.gpu] / 1e3
    hbm = HBM_BYTES_PER_MS[config.gpu]
    memory = memory_bound_bytes(config)
    flops = layer_flops(config)
    profile = gpt_profile(config)
    b, s, h, a = config.micro, config.seq, config.hidden, config.heads
    core = max(2 * b * s * s * h / peak, (4 * s * b * h + 2 * a * s * s * b) / hbm)
    for layer in profile.layers:
        kind = layer.name.split(".")[0]
        fwd_bytes, bwd_bytes = memory[kind]
        passes = 3 if config.recompute and kind in ("attention", "mlp") else 2
        recomputed = fwd_bytes if passes == 3 else 0.0
        linear = 8 * b * s * h * h if kind == "attention" else flops[kind]
        scores = 2 * core if kind == "attention" else 0.0
        fwd = linear / peak + scores + fwd_bytes / hbm
        bwd = passes * (linear / peak + scores) + (bwd_bytes + recomputed) / hbm
        assert math.isclose(layer.fwd_ms, fwd, rel_tol=1e-12, abs_tol=1e-300)
        assert math.isclose(layer.bwd_ms, bwd, rel_tol=1e-12, abs_tol=1e-300)
        assert layer.flops == (1 + passes) * flops[kind]
    block = profile.layers[1].fwd_ms + profile.layers[2].fwd_ms
    block_bytes = memory["attention"][0] + memory["mlp"][0]
    assert math.isclose(block, 24 * b * s * h * h / peak + 2 * core + block_bytes / hbm, rel_tol=1e-12)


def test_the_score_matmuls_are_memory_bound_below_the_ridge_and_flops_bound_above() -> None:
    """On an A100 80GB (268.0 TFLOP/s, 1.794 TB/s: a ridge of 149.4 FLOP per byte) a head of h / a = 96 (the 1.7B:
    h 2304, a 24) leaves Q K^T bound by its scores' bytes; a head of 256 is bound by its FLOPs."""
    narrow = GptConfig(layers=1, hidden=2304, heads=24, seq=2048, vocab=51200, micro=1)
    b, s, h, a = 1, 2048, 2304, 24
    rate, hbm = 312e12 * 0.737 / 1e3, 2039e9 * 0.88 / 1e3
    assert attention_core_ms(narrow) == (4 * s * b * h + 2 * a * s * s * b) / hbm > 2 * b * s * s * h / rate
    wide = GptConfig(layers=1, hidden=2048, heads=8, seq=2048, vocab=51200, micro=1)
    assert attention_core_ms(wide) == 2 * 2048 * 2048 * 2048 / rate


def test_memory_bound_bytes_are_a_hand_count() -> None:
    """b=2, s=3, h=4, a=2, V=5: S = 24, A = 36, L = 30 elements; each operator's bytes counted by hand (2 bytes per
    16-bit element, 1 per mask element)."""
    config = GptConfig(layers=1, hidden=4, heads=2, seq=3, vocab=5, micro=2)
    s16, a16, l16 = 2 * 24, 2 * 36, 2 * 30  # one 16-bit tensor of each size, in bytes
    s8, a8 = 24, 36  # one mask
    norm_f, norm_b = s16 + s16, 3 * s16
    bda_f, bda_b = 3 * s16 + s8, s8 + 2 * s16
    residual_sum = 3 * s16
    attention_f = norm_f + (a16 + a16) + (2 * a16 + a8) + bda_f
    attention_b = bda_b + (a8 + 2 * a16) + 3 * a16 + norm_b + residual_sum
    mlp_f = norm_f + (4 * s16 + 4 * s16) + bda_f
    mlp_b = bda_b + 3 * 4 * s16 + norm_b + residual_sum
    embedding_f = 2 * (s16 + s16) + 3 * s16 + (2 * s16 + s8)
    embedding_b = (s8 + 2 * s16) + 2 * 3 * s16
    head_f = norm_f + (l16 + 2 * l16) + (2 * l16 + 2 * l16)
    head_b = (2 * l16 + 2 * l16) + (2 * l16 + l16) + norm_b
    expected = {
        "embedding": (embedding_f, embedding_b),
        "attention": (attention_f, attention_b),
        "mlp": (mlp_f, mlp_b),
        "head": (head_f, head_b),
    }
    got = memory_bound_bytes(config)
    for kind, pair in expected.items():
        for value, want in zip(got[kind], pair, strict=True):
            assert math.isclose(value, want, rel_tol=1e-12), kind
    profile = gpt_profile(config)
    hbm = HBM_BYTES_PER_MS["A100-80GB"]
    rate = 312e12 * 0.737 / 1e3
    mlp = profile.layers[2]
    assert math.isclose(mlp.fwd_ms, 16 * 2 * 3 * 4 * 4 / rate + mlp_f / hbm, rel_tol=1e-12)
    # with recomputation: the backward's FLOPs (twice the forward's) and the forward's again, bytes likewise
    assert math.isclose(mlp.bwd_ms, 3 * 16 * 2 * 3 * 4 * 4 / rate + (mlp_b + mlp_f) / hbm, rel_tol=1e-12)


@given(configs)
def test_saved_bytes_are_korthikanti_et_al(config: GptConfig) -> None:
    """A block saves s b h (34 + 5 a s / h) without recomputation and 2 s b h with it; each output is 2 s b h."""
    b, s, h, a, v = config.micro, config.seq, config.hidden, config.heads, config.vocab
    profile = gpt_profile(config)
    block = profile.layers[1].saved_bytes + profile.layers[2].saved_bytes
    expected = 2 * s * b * h if config.recompute else s * b * h * (34 + 5 * a * s / h)
    assert math.isclose(block, expected, rel_tol=1e-12)
    assert all(layer.activation_bytes == 2 * s * b * h for layer in profile.layers[:-1])
    assert profile.layers[-1].saved_bytes == 4 * s * b * h + 4 * s * b * v


def test_parameters_are_twelve_h_squared_per_block_and_four_bytes_each() -> None:
    """GPT-3 175B's config counts 174.6e9 parameters (12 l h^2 + 13 l h + (V + s) h twice), at 4 bytes each."""
    config = parse_gpt_spec("gpt:layers=96,hidden=12288,heads=96,seq=2048,vocab=51200")
    n, h, v, s = 96, 12288, 51200, 2048
    params = n * (12 * h * h + 13 * h) + (v * h + s * h) + (v * h + 2 * h)
    assert gpt_profile(config).total_param_bytes == 4 * params
    assert 174e9 < params < 176e9


def test_the_spec_loads_wherever_a_profile_is_named() -> None:
    """load_profile takes a gpt: spec; its layers are the embedding, attention and MLP per block, and the head."""
    profile = load_profile("gpt:layers=2,hidden=64,heads=4,seq=16,vocab=100,micro=2,gpu=h100,recompute=0")
    assert [layer.name for layer in profile.layers] == ["embedding", "attention.0", "mlp.0", "attention.1", "mlp.1", "head"]
    assert profile.batch_size == 2 and profile.reference_device == "H100" and not profile.measured
    assert [tensor_parallel_role(layer.name) for layer in profile.layers] == [
        "embedding", "attention", "mlp", "attention", "mlp", "head",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("gpt:layers=2,hidden=64,heads=3,seq=8,vocab=10", "heads=3 must divide hidden=64"),
        ("gpt:layers=2,hidden=64,heads=4,seq=8", "missing field.*vocab"),
        ("gpt:layers=0,hidden=64,heads=4,seq=8,vocab=10", "layers must be a whole number >= 1, got 0"),
        ("gpt:layers=2,hidden=64,heads=4,seq=8,vocab=10,depth=3", "unknown field 'depth'"),
        ("gpt:layers=2,hidden=64,heads=4,seq=8,vocab=10,gpu=tpu", "gpu must be one of"),
        ("gpt:layers=2,hidden=64,heads=4,seq=8,vocab=10,gpu=L4", "no measured matmul fraction.*gpu=L4"),
        ("gpt:layers=2,hidden=64,heads=4,seq=8,vocab=10,matmul_fraction=1.2", r"matmul_fraction must be a number in \(0, 1\]"),
        ("gpt:layers=2,hidden=64,heads=4,seq=8,vocab=10,precision=fp32", "precision must be one of bf16, fp16"),
        ("gpt:layers=2,hidden=64,heads=4,seq=8,vocab=10,recompute=yes", "recompute must be 1"),
        ("gpt:layers=2,layers=3", "given twice"),
        ("gpt:layers", "no key=value"),
        ("gpt:layers=20000,hidden=64,heads=4,seq=8,vocab=10", "above the most"),
    ],
)
def test_bad_fields_are_one_line_naming_field_and_value(spec: str, message: str) -> None:
    """Every bad field is a one-line ProfileError naming it, before any profile is built."""
    with pytest.raises(ProfileError, match=message) as caught:
        load_profile(spec)
    assert "\n" not in str(caught.value)


def test_a_given_fraction_prices_a_gpu_without_a_measured_one() -> None:
    """gpu=L4 with matmul_fraction=0.5 prices every FLOP at half of the L4's 121 TFLOP/s, its bytes at the nominal
    HBM bandwidth (no measured fraction is known for it)."""
    profile = load_profile("gpt:layers=1,hidden=64,heads=4,seq=8,vocab=10,gpu=L4,matmul_fraction=0.5")
    mlp = profile.layers[2]
    memory_ms = 27 * 8 * 64 / (300e9 / 1e3)  # the MLP's 27 bytes per s b h element (forward) at the nominal 300 GB/s
    assert math.isclose(mlp.fwd_ms, 16 * 8 * 64 * 64 / (121e12 * 0.5 / 1e3) + memory_ms, rel_tol=1e-12)


def test_a_config_built_in_python_is_checked_as_a_spec_is() -> None:
    """GptConfig itself refuses bad values (the spec's checks are its checks, without the spec's prefix)."""
    with pytest.raises(ProfileError, match=r"^heads=5 must divide hidden=64"):
        GptConfig(layers=1, hidden=64, heads=5, seq=8, vocab=10)
    with pytest.raises(ProfileError, match=r"^micro must be a whole number >= 1, got True"):
        GptConfig(layers=1, hidden=64, heads=4, seq=8, vocab=10, micro=True)
    assert GptConfig(layers=1, hidden=64, heads=4, seq=8, vocab=10, gpu="h100").gpu == "H100"


@given(configs, st.sampled_from([1, 2, 4, 8]))
def test_tensor_splits_are_megatron_lm_and_keep_korthikanti_bytes(config: GptConfig, t: int) -> None:
    """Each layer splits as tensor_parallel_role says (heads, 4h, the vocabulary); without sequence parallelism a
    device of a group of t keeps s b h (10 + 24/t + 5 a s/(h t)) of a block without recomputation (Korthikanti et
    al. 2022, eq. 2) and the whole 2 s b h input with it; the head keeps 4 s b h + 4 s b V / t."""
    b, s, h, a, v = config.micro, config.seq, config.hidden, config.heads, config.vocab
    profile = gpt_profile(config)
    expected = {"embedding": ("vocab", v), "attention": ("attention", a), "mlp": ("mlp", 4 * h), "head": ("column", v)}
    for layer in profile.layers:
        assert layer.tp is not None
        assert (layer.tp.kind, layer.tp.width) == expected[tensor_parallel_role(layer.name)]
    assert tensor_splits(config)["attention"] == profile.layers[1].tp

    def kept(i: int) -> float:
        layer = profile.layers[i]
        assert layer.saved_bytes is not None and layer.tp is not None
        share = layer.tp.whole_share
        return layer.saved_bytes * (share + (1 - share) / t)

    block = kept(1) + kept(2)
    whole = 2 * s * b * h if config.recompute else s * b * h * (10 + 24 / t + 5 * a * s / (h * t))
    assert math.isclose(block, whole, rel_tol=1e-12)
    assert math.isclose(kept(len(profile.layers) - 1), 4 * s * b * h + 4 * s * b * v / t, rel_tol=1e-12)
    assert kept(0) == s * b * h


@given(configs)
def test_whole_shares_are_the_replicated_operators_time_over_the_layers(config: GptConfig) -> None:
    """Without sequence parallelism each rank runs whole: a block half's layer norm and bias + dropout + add (11 S
    bytes forward; 17 S backward with the residual's gradient sum, 28 S with the rerun forward), the head's final
    norm (4 S, 6 S), all of the embedding; each share is those bytes at the HBM rate over the layer's time
    (S = 2 bytes x s b h counted as the module counts it). A recomputed block half reruns its forward's collectives."""
    hbm = HBM_BYTES_PER_MS[config.gpu]
    big_s = float(config.seq * config.micro * config.hidden)
    block_bwd = (28.0 if config.recompute else 17.0) * big_s
    expected = {"attention": (11.0 * big_s, block_bwd), "mlp": (11.0 * big_s, block_bwd), "head": (4.0 * big_s, 6.0 * big_s)}
    for layer in gpt_profile(config).layers:
        kind = layer.name.split(".")[0]
        assert layer.tp is not None
        if kind == "embedding":
            assert (layer.tp.whole_fwd, layer.tp.whole_bwd, layer.tp.recomputed) == (1.0, 1.0, False)
            continue
        fwd, bwd = expected[kind]
        assert math.isclose(layer.tp.whole_fwd, fwd / hbm / layer.fwd_ms, rel_tol=1e-12)
        assert math.isclose(layer.tp.whole_bwd, bwd / hbm / layer.bwd_ms, rel_tol=1e-12)
        assert layer.tp.recomputed == (config.recompute and kind != "head")


def test_a_gpt_profile_simulates_with_tensor_parallel_stages() -> None:
    """A gpt: profile on a dgx preset simulates at tp 2 and 4 (one stage, one group): each split layer's compute is
    divided by t, so tp 2 is faster than tp 1 (at this small h, tp 4's all-reduces cost more than they save) and no
    tp is faster than the tp 1 compute / t."""
    from pipeplan.core.plan import Plan, Stage
    from pipeplan.presets.resolve import load_cluster
    from pipeplan.sim.cost.model import CostModel
    from pipeplan.sim.plan_sim import simulate_plan

    profile = load_profile("gpt:layers=2,hidden=1024,heads=16,seq=512,vocab=1024")
    model = CostModel.build(profile, load_cluster("dgx-a100-8x1"))
    last = profile.num_layers - 1
    times = {
        t: simulate_plan(Plan((Stage(0, last, tuple(range(t)), tp=t),), 1, 4, 1, "1f1b"), model).iteration_time for t in (1, 2, 4)
    }
    compute = 4 * sum(layer.fwd_ms + layer.bwd_ms for layer in profile.layers)
    assert times[2] < times[1]
    assert all(times[t] >= compute / t for t in times)


@pytest.mark.parametrize("hidden", [64, 1024, 12288])
def test_attention_and_mlp_name_their_layer_norms_bytes(hidden: int) -> None:
    """Each attention and MLP layer names its layer norm's weight and bias, 2 h parameters of 4 bytes (what sequence
    parallelism all-reduces per norm); the embedding and head split name none."""
    splits = tensor_splits(GptConfig(layers=2, hidden=hidden, heads=8, seq=16, vocab=32))
    assert splits["attention"].norm_bytes == splits["mlp"].norm_bytes == 8 * hidden
    assert splits["embedding"].norm_bytes == splits["head"].norm_bytes == 0.0
