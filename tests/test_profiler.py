"""Per-layer measurement and MODULE_SPEC resolution (torch, CPU only)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from pipeplan.core.errors import ProfileError  # noqa: E402
from pipeplan.models.specs import ModelSpec, layers_of, resolve_module_spec, spec_from_module  # noqa: E402
from pipeplan.profiler import measure_layers, profile_module  # noqa: E402
from pipeplan.profiler.saved import SavedTensorMeter  # noqa: E402

# every test here needs torch (make test-fast leaves them out) and times on one thread (tests/conftest.py)
pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_torch_thread")]

F32 = 4


class _Clock:
    """A stand-in for the profiler's `time` module: it moves only when a _Tick layer runs."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


class _Tick(torch.autograd.Function):
    """Identity whose forward advances the clock by `f` seconds and whose backward by `b`."""

    @staticmethod
    def forward(ctx, x, clock, f, b):  # type: ignore[no-untyped-def]
        clock.now += f
        ctx.clock, ctx.b = clock, b
        return x.clone()

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def]
        ctx.clock.now += ctx.b
        return grad, None, None, None


class _TimedLinear(nn.Module):
    def __init__(self, clock: _Clock, f: float, b: float) -> None:
        super().__init__()
        self.linear, self.clock, self.f, self.b = nn.Linear(4, 4), clock, f, b

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Tick.apply(self.linear(x), self.clock, self.f, self.b)


def test_each_layer_is_charged_its_own_forward_and_backward_and_the_whole_their_sums(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a clock that moves only inside the layers, layer i's F and B medians are exactly its own costs and the
    whole chain's are their sums.

    Layer i's forward takes (i + 1)/1024 s and its backward 2(i + 1)/1024 s (dyadic: the clock's sums are exact),
    so F_i = (i + 1)·1000/1024 ms and B_i = 2·F_i. A missed backward, a layer charged its neighbour's time, or
    per-layer overhead moves some figure; wall-clock noise cannot (a real machine's per-layer and whole-model
    times differ by cache effects, which is fidelity's subject, not a unit test's).
    """
    from pipeplan.profiler import timing

    clock = _Clock()
    monkeypatch.setattr(timing, "time", clock)
    n = 5
    model = nn.Sequential(*(_TimedLinear(clock, (i + 1) / 1024, 2 * (i + 1) / 1024) for i in range(n)))
    m = measure_layers(model, torch.randn(3, 4), 3, runs=4, warmup=1)
    fwd = [(i + 1) / 1024 * 1000 for i in range(n)]
    assert list(m.fwd_ms) == fwd
    assert list(m.bwd_ms) == [2 * f for f in fwd]
    assert m.whole_fwd_ms == sum(range(1, n + 1)) / 1024 * 1000
    assert m.whole_bwd_ms == 2 * sum(range(1, n + 1)) / 1024 * 1000


def test_mlp_layers_are_timed_on_a_real_clock() -> None:
    """An 8×1024 MLP at batch 32, timed for real: every layer's F and B is positive and the layers' sum is the
    whole model's within a factor of 2 (a missed backward alone reads about 1/3; the exact accounting is checked
    on a stand-in clock above)."""
    spec = resolve_module_spec("mlp", hidden=1024, blocks=8)
    m = measure_layers(spec, None, 32, runs=5, warmup=2)
    ratio = (sum(m.fwd_ms) + sum(m.bwd_ms)) / (m.whole_fwd_ms + m.whole_bwd_ms)
    assert 0.5 <= ratio <= 2.0, ratio
    assert all(f > 0 for f in m.fwd_ms) and all(b > 0 for b in m.bwd_ms)


def test_linear_relu_layers_save_the_analytic_bytes() -> None:
    """Linear saves its input (b·in·4 B, weights excluded) and ReLU its output (b·out·4 B), layer by layer.

    Stack Linear(64→128) → ReLU → Linear(128→32) → ReLU at batch b = 16:
    saved = [b·64·4, b·128·4, b·128·4, b·32·4] = [4096, 8192, 8192, 2048] bytes.
    """
    b = 16
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 32), nn.ReLU())
    m = measure_layers(model, torch.randn(b, 64), b, runs=0)
    assert [s.saved_bytes for s in m.layers] == [b * 64 * F32, b * 128 * F32, b * 128 * F32, b * 32 * F32]
    assert [s.activation_bytes for s in m.layers] == [b * 128 * F32, b * 128 * F32, b * 32 * F32, b * 32 * F32]
    assert [s.param_bytes for s in m.layers] == [(64 * 128 + 128) * F32, 0, (128 * 32 + 32) * F32, 0]


def test_the_last_layer_counts_what_the_loss_saves_each_storage_once() -> None:
    """The last stage holds the loss's saved tensors until its backward: the last layer's saved bytes include them.

    Linear(8→10) at b = 4 saves its input (b·8·4 = 128 B). Cross-entropy keeps its log-probabilities (b·10·4 =
    160 B) and the int64 targets (b·8 = 32 B), plus a scalar weight; a squared error keeps output and target
    (160 B each). Behind a ReLU, which saves that same output, the output counts once: 160 + 160.
    """
    from torch.nn import functional

    b = 4

    def spec(layers: tuple[nn.Module, ...], loss: object, target: object) -> ModelSpec:
        names = tuple(f"l{i}" for i in range(len(layers)))
        return ModelSpec("x", layers, names, sample_input=lambda n: torch.randn(n, 8), sample_target=target, loss_fn=loss)

    linear = nn.Linear(8, 10)
    classes, zeros = (lambda n: torch.arange(n) % 10), (lambda n: torch.zeros(n, 10))
    plain = measure_layers(spec((linear,), None, None), None, b, runs=0).layers[-1].saved_bytes
    entropy = measure_layers(spec((linear,), functional.cross_entropy, classes), None, b, runs=0).layers[-1].saved_bytes
    squared = measure_layers(spec((linear,), functional.mse_loss, zeros), None, b, runs=0).layers[-1].saved_bytes
    relu = measure_layers(spec((linear, nn.ReLU()), functional.mse_loss, zeros), None, b, runs=0).layers
    assert plain == b * 8 * F32
    assert plain + b * 10 * F32 + b * 8 <= entropy <= plain + b * 10 * F32 + b * 8 + 8
    assert squared == plain + 2 * b * 10 * F32
    assert [s.saved_bytes for s in relu] == [b * 8 * F32, 2 * b * 10 * F32]


def test_the_last_layer_is_timed_with_the_loss_as_a_last_stage_runs_it() -> None:
    """A loss that sleeps 15 ms in its forward and 15 ms in its backward: the last layer's F and B (and the whole
    chain's) hold at least that; the first layer's do not, and without the loss neither does the last."""
    import time as clock

    class SlowLoss(torch.autograd.Function):
        @staticmethod
        def forward(ctx: object, out: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
            clock.sleep(0.015)
            return out.sum()

        @staticmethod
        def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
            clock.sleep(0.015)
            return grad * torch.ones(4, 8)

    layers = (nn.Linear(8, 8), nn.Linear(8, 8))
    spec = ModelSpec("x", layers, ("a", "b"), sample_input=lambda n: torch.randn(n, 8), sample_target=lambda n: torch.zeros(n),
                     loss_fn=lambda out, target: SlowLoss.apply(out))  # fmt: skip
    timed = measure_layers(spec, None, 4, runs=3, warmup=1)
    assert timed.fwd_ms[1] >= 15.0 and timed.bwd_ms[1] >= 15.0
    assert timed.whole_fwd_ms >= 15.0 and timed.whole_bwd_ms >= 15.0
    assert timed.fwd_ms[0] < 15.0 and timed.bwd_ms[0] < 15.0
    plain = measure_layers(nn.Sequential(*layers), torch.randn(4, 8), 4, runs=3, warmup=1)
    assert plain.fwd_ms[1] < 15.0 and plain.bwd_ms[1] < 15.0


def test_a_layer_that_saves_what_the_layer_before_saved_records_it_as_shared() -> None:
    """Linear(64→128) → ReLU → Linear(128→32) → ReLU: the second Linear saves its input, which the ReLU before it
    saves as its output (one storage in a stage): shared b·128·4. No other layer saves its predecessor's output."""
    b = 16
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 32), nn.ReLU())
    m = measure_layers(model, torch.randn(b, 64), b, runs=0)
    assert [s.shared_bytes for s in m.layers] == [0, 0, b * 128 * F32, 0]
    profile = m.to_profile("x")
    assert [layer.shared_bytes for layer in profile.layers] == [0, 0, b * 128 * F32, 0]


def test_a_block_counts_a_storage_saved_by_two_ops_once() -> None:
    """As one block the stack keeps x, ReLU₁'s output (saved by ReLU₁ and Linear₂: one storage) and ReLU₂'s.

    saved = b·(64 + 128 + 32)·4 bytes.
    """
    b = 16
    block = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 32), nn.ReLU())
    m = measure_layers([block], torch.randn(b, 64), b, runs=0)
    assert m.layers[0].saved_bytes == b * (64 + 128 + 32) * F32


def test_saved_meter_counts_a_tensor_saved_twice_once_and_skips_parameters() -> None:
    """x·x saves x twice (one storage: counted once); views of a parameter are not counted."""
    x = torch.randn(10, 20, requires_grad=True)
    with SavedTensorMeter() as meter:
        y = x * x
    assert meter.saved_bytes == 10 * 20 * F32
    weight = nn.Parameter(torch.randn(20, 30))
    with SavedTensorMeter(exclude=[weight]) as meter:
        z = x @ weight.t().t()
    assert meter.saved_bytes == 10 * 20 * F32
    del y, z


def test_profile_is_a_measured_chain_on_the_cpu() -> None:
    """profile_module gives reference_device cpu, measured, cut i = layer i's output, names from the spec."""
    spec = resolve_module_spec("mlp", hidden=32, blocks=3)
    p = profile_module(spec, None, 4, runs=2, warmup=1)
    assert (p.name, p.batch_size, p.reference_device, p.measured) == ("mlp-3x32", 4, "cpu", True)
    assert [layer.name for layer in p.layers] == ["block0", "block1", "block2"]
    assert p.cut_bytes == (4 * 32 * F32, 4 * 32 * F32)
    assert all(layer.flops and layer.bytes_moved for layer in p.layers)


def test_progress_bar_and_names_of_a_plain_list_of_modules(capsys: pytest.CaptureFixture[str]) -> None:
    """A list of modules profiles with the progress bar asked for; stderr is no terminal here, so nothing is drawn
    (no blank lines in a log); unnamed layers are named by position and type."""
    p = profile_module([nn.Linear(8, 8), nn.Tanh()], lambda b: torch.randn(b, 8), 2, runs=1, warmup=0, progress=True)
    assert [layer.name for layer in p.layers] == ["0-linear", "1-tanh"]
    assert capsys.readouterr().err == ""


def test_sample_input_must_match_the_batch_size() -> None:
    """A sample batch whose first dimension is not batch_size is rejected with both values."""
    with pytest.raises(ProfileError, match=r"batch size 8, got shape \(4, 3\)"):
        measure_layers(nn.Sequential(nn.Linear(3, 3)), torch.randn(4, 3), 8, runs=0)


def test_a_layer_must_return_one_tensor() -> None:
    """A layer returning a tuple cannot be a pipeline layer."""

    class Pair(nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return x, x

    with pytest.raises(ProfileError, match="must return one"):
        measure_layers([nn.Linear(3, 3), Pair()], torch.randn(2, 3), 2, runs=0)


class Blocks(nn.Module):
    """A model whose `blocks` ModuleList is the whole model."""

    def __init__(self, extra: bool = False) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])
        if extra:
            self.head = nn.Linear(4, 2)


class Staged(nn.Module):
    """A model that lists its layers itself."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 6), nn.Linear(6, 2)

    def pipeline_layers(self) -> list[tuple[str, nn.Module]]:
        return [("first", self.a), ("second", self.b)]

    def sample_input(self, batch_size: int) -> torch.Tensor:
        return torch.ones(batch_size, 4)


def test_layers_of_follows_the_three_conventions() -> None:
    """nn.Sequential children, pipeline_layers(), and a blocks ModuleList holding every parameter."""
    assert [n for n, _ in layers_of(nn.Sequential(nn.Linear(2, 2), nn.ReLU()))] == ["0-linear", "1-relu"]
    assert [n for n, _ in layers_of(Staged())] == ["first", "second"]
    assert [n for n, _ in layers_of(Blocks())] == ["blocks0", "blocks1"]
    with pytest.raises(ProfileError, match="not a chain of blocks"):
        layers_of(Blocks(extra=True), "odd")


def test_spec_from_module_takes_the_module_sample_input_or_infers_a_linear_one() -> None:
    """A sample_input method wins; a first nn.Linear gives a (b, in_features) batch; otherwise a ProfileError."""
    assert spec_from_module(Staged()).sample_input(3).shape == (3, 4)
    assert spec_from_module(Blocks()).sample_input(5).shape == (5, 4)
    with pytest.raises(ProfileError, match=r"cannot tell what input its first layer \(Conv1d\) takes"):
        spec_from_module(nn.Sequential(nn.Conv1d(1, 1, 3)), "conv")


def test_factory_spec_imports_a_module_and_passes_converted_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`package.module:factory` imports the factory, converts string options by default type, finds sample_input beside it."""
    (tmp_path / "h5_user_model.py").write_text(
        textwrap.dedent(
            """
            import torch
            from torch import nn

            def make(width=4, depth=2):
                return nn.Sequential(*[nn.Linear(width, width) for _ in range(depth)])

            def sample_input(batch_size):
                return torch.zeros(batch_size, 4)
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = resolve_module_spec("h5_user_model:make", depth="3")
    assert (spec.name, len(spec.layers), spec.sample_input(2).shape) == ("h5_user_model:make", 3, (2, 4))
    with pytest.raises(ProfileError, match=r"has no option 'height'; options: width, depth"):
        resolve_module_spec("h5_user_model:make", height=3)
    with pytest.raises(ProfileError, match="has no attribute 'missing'"):
        resolve_module_spec("h5_user_model:missing")
    with pytest.raises(ProfileError, match=r"cannot import module 'no_such_pkg_h5': not found on the import path"):
        resolve_module_spec("no_such_pkg_h5.models:make")


def test_unknown_spec_and_bad_option_values_are_named() -> None:
    """A name that is neither built in nor module:factory, and an option that does not convert, raise ProfileError."""
    with pytest.raises(ProfileError, match=r"MODULE_SPEC 'resnet' is neither a built-in \(mlp, transformer, gpt2-small"):
        resolve_module_spec("resnet")
    with pytest.raises(ProfileError, match="option 'hidden' must be a int, got 'wide'"):
        resolve_module_spec("mlp", hidden="wide")
    with pytest.raises(ProfileError, match="mlp option blocks must be an integer >= 1, got 0"):
        resolve_module_spec("mlp", blocks=0)


def test_builtin_transformer_specs_have_the_published_shapes() -> None:
    """gpt2-xl keeps hidden 1600 with a reduced depth; a GPT-2 block holds 12H²+13H parameters; BERT-large has 1024."""
    pytest.importorskip("transformers")
    spec = resolve_module_spec("gpt2-xl", layers=1, seq_len=8)
    assert spec.layer_names == ("embed", "block0", "head")
    h = 1600
    assert sum(p.numel() for p in spec.layers[1].parameters()) == 12 * h * h + 13 * h
    assert spec.sample_input(2).shape == (2, 8) and spec.sample_input(2).dtype == torch.int64
    bert = resolve_module_spec("bert-large", layers=2, seq_len=16)
    x = bert.sample_input(2)
    for layer in bert.layers:
        x = layer(x)
    assert x.shape == (2, 16, 30522)
    assert bert.loss_fn(x, bert.sample_target(2)).ndim == 0


def test_builtin_specs_are_deterministic_and_leave_the_global_rng_alone() -> None:
    """Two builds give equal weights (every rank builds the same model) and the caller's RNG stream is unchanged."""
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    a, b = (
        resolve_module_spec("transformer", layers=1, d_model=16, heads=2),
        resolve_module_spec("transformer", layers=1, d_model=16, heads=2),
    )
    assert torch.equal(torch.rand(3), expected)
    for pa, pb in zip(a.sequential().parameters(), b.sequential().parameters(), strict=True):
        assert torch.equal(pa, pb)


def test_bf16_cast_halves_the_sizes() -> None:
    """A spec cast to bf16 has half the activation, parameter and saved bytes of fp32."""
    fp32 = measure_layers(resolve_module_spec("mlp", hidden=64, blocks=2), None, 8, runs=0)
    bf16 = measure_layers(resolve_module_spec("mlp", hidden=64, blocks=2).cast(torch.bfloat16), None, 8, runs=0)
    for a, b in zip(fp32.layers, bf16.layers, strict=True):
        assert (b.activation_bytes, b.param_bytes, b.saved_bytes) == (
            a.activation_bytes // 2,
            a.param_bytes // 2,
            a.saved_bytes // 2,
        )


def test_model_spec_rejects_mismatched_names() -> None:
    """A ModelSpec needs one distinct name per layer."""
    with pytest.raises(ProfileError, match="has 2 layers but 1 layer_names"):
        ModelSpec("m", (nn.ReLU(), nn.ReLU()), ("a",), lambda b: torch.zeros(b))


ACTIVATIONS = {"relu": lambda: nn.ReLU(inplace=True), "hardswish": lambda: nn.Hardswish(inplace=True),
               "dropout": lambda: nn.Dropout(0.2, inplace=True)}  # fmt: skip


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_a_layer_that_changes_its_input_in_place_profiles_at_every_size(name: str) -> None:
    """An in-place activation as a layer of its own and first in a layer (its input needs a gradient: autograd
    refuses an in-place change of a leaf that does): measured at every size of the curve."""
    from pipeplan.profiler.curves import profile_batch_sizes

    torch.manual_seed(0)
    make = ACTIVATIONS[name]
    layers = (nn.Linear(4, 8), make(), nn.Linear(8, 8), nn.Sequential(make(), nn.Linear(8, 3)))
    spec = ModelSpec("inplace", layers, ("a", "act", "b", "c"), sample_input=lambda b: torch.randn(b, 4))
    profile = profile_batch_sizes(spec, (1, 2, 4), runs=1, warmup=0)
    assert profile.batch_sizes == (1, 2, 4) and len(profile.layers) == 4
