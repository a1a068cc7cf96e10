"""Roofline projection onto a GPU spec and the `pipeplan profile` command (torch, CPU only)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from pipeplan.cli import app, main  # noqa: E402
from pipeplan.core.errors import ProfileError  # noqa: E402
from pipeplan.core.hardware.devices import GPU_SPECS  # noqa: E402
from pipeplan.core.profile import LayerProfile, ModelProfile  # noqa: E402
from pipeplan.io.profile_json import read_profile_json  # noqa: E402
from pipeplan.models.specs import resolve_module_spec  # noqa: E402
from pipeplan.profiler import LayerWork, measure_layers, project_profile, resolve_gpu, roofline_ms  # noqa: E402

pytestmark = pytest.mark.torch  # every test here needs torch (make test-fast leaves them out)

F32 = 4


def two_layer_profile() -> tuple[ModelProfile, list[LayerWork]]:
    """A compute-bound layer (1 TFLOP, 1 MB) and a memory-bound one (0 FLOPs, 10 GB), with measured CPU times."""
    layers = (LayerProfile("matmul", 900.0, 1800.0, 1e6, 1e6), LayerProfile("norm", 50.0, 90.0, 5e9, 0.0))
    profile = ModelProfile("toy", 16, layers, reference_device="cpu")
    work = [LayerWork("matmul", 10**12, 2 * 10**12, 10**6, 2 * 10**6), LayerWork("norm", 0, 0, 10**10, 2 * 10**10)]
    return profile, work


def test_compute_bound_layer_takes_flops_over_peak() -> None:
    """On an H100 in fp32, 1 TFLOP takes 1e12 / 67e12 s; bf16 uses the 989 TFLOP/s peak; efficiency scales it."""
    profile, work = two_layer_profile()
    h100 = GPU_SPECS["H100"]
    fp32 = project_profile(profile, work, "H100", "fp32").layers[0]
    assert fp32.fwd_ms == pytest.approx(1e12 / (h100.fp32_tflops * 1e12) * 1e3)
    assert fp32.bwd_ms == pytest.approx(2e12 / (h100.fp32_tflops * 1e12) * 1e3)
    bf16 = project_profile(profile, work, "h100", "bf16", efficiency=0.5).layers[0]
    assert bf16.fwd_ms == pytest.approx(1e12 / (h100.bf16_tflops * 1e12 * 0.5) * 1e3)


def test_memory_bound_layer_takes_bytes_over_bandwidth() -> None:
    """10 GB with no FLOPs on an A100 takes 1e10 / 1555e9 s forward, twice that backward."""
    profile, work = two_layer_profile()
    a100 = GPU_SPECS["A100"]
    norm = project_profile(profile, work, "a100").layers[1]
    assert norm.fwd_ms == pytest.approx(1e10 / (a100.hbm_gb_per_s * 1e9) * 1e3)
    assert norm.bwd_ms == pytest.approx(2e10 / (a100.hbm_gb_per_s * 1e9) * 1e3)


def test_roofline_takes_the_slower_of_compute_and_memory() -> None:
    """roofline_ms is the max of the two terms for any split of the work."""
    l4 = GPU_SPECS["L4"]
    compute_ms = 1e12 / (l4.fp32_tflops * 1e12) * 1e3
    memory_ms = 3e10 / (l4.hbm_gb_per_s * 1e9) * 1e3
    assert roofline_ms(1e12, 3e10, l4) == pytest.approx(max(compute_ms, memory_ms))
    assert roofline_ms(0, 0, l4) == 0.0


def test_projected_profile_is_marked_and_keeps_sizes() -> None:
    """A projected profile names the GPU, is not measured, and keeps every size and the FLOP counts."""
    profile, work = two_layer_profile()
    projected = project_profile(profile, work, "h200")
    assert (projected.reference_device, projected.measured) == ("H200", False)
    assert projected.cut_bytes == profile.cut_bytes
    assert [(p.activation_bytes, p.param_bytes, p.saved_bytes) for p in projected.layers] == [
        (p.activation_bytes, p.param_bytes, p.saved_bytes) for p in profile.layers
    ]
    assert [p.flops for p in projected.layers] == [3e12, 0.0]


def test_projection_of_a_measured_mlp_uses_its_counted_work() -> None:
    """Each projected layer time of a real MLP is the roofline of its counted FLOPs, bytes and kernels; layers this
    small are launch-bound: Linear's forward is one kernel (addmm), its backward two (input and weight gradients; the
    first layer's input needs none), ReLU one each way."""
    m = measure_layers(nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64)), torch.randn(32, 64), 32, runs=0)
    works = [s.work for s in m.layers]
    projected = project_profile(m.to_profile("mlp"), works, "V100")
    v100 = GPU_SPECS["V100"]
    for layer, w in zip(projected.layers, works, strict=True):
        assert layer.fwd_ms == pytest.approx(roofline_ms(w.fwd_flops, w.fwd_bytes, v100, kernels=w.fwd_kernels))
        assert layer.bwd_ms == pytest.approx(roofline_ms(w.bwd_flops, w.bwd_bytes, v100, kernels=w.bwd_kernels))
    assert [w.fwd_kernels for w in works] == [1, 1, 1]
    assert [layer.fwd_ms for layer in projected.layers] == pytest.approx([v100.launch_us / 1e3] * 3)


def test_unknown_gpu_dtype_and_efficiency_are_named() -> None:
    """Bad projection arguments raise ProfileError naming the value and the choices."""
    profile, work = two_layer_profile()
    with pytest.raises(ProfileError, match=r"--project-to must be one of V100, A100, .*H100, H200, L4, got 'tpu'"):
        resolve_gpu("tpu")
    with pytest.raises(ProfileError, match="dtype must be one of fp32, bf16, got 'fp8'"):
        project_profile(profile, work, "H100", "fp8")
    with pytest.raises(ProfileError, match=r"efficiency must be in \(0, 1\], got 1.5"):
        project_profile(profile, work, "H100", efficiency=1.5)
    with pytest.raises(ProfileError, match="work for 1 layers does not match profile 'toy' with 2 layers"):
        project_profile(profile, work[:1], "H100")


def test_cli_profiles_the_mlp_into_a_profile_file(tmp_path: Path) -> None:
    """`pipeplan profile mlp --batch-size 8` measures the model train builds (8 blocks and the digits head) at sizes
    1, 2, 4 and 8 with one thread, each layer's I/W split and optimizer steps, and records how the model was built."""
    from pipeplan.models.build import build_model

    out = tmp_path / "x.json"
    result = CliRunner().invoke(app, ["profile", "mlp", "--batch-size", "8", "--out", str(out), "--runs", "2", "--warmup", "1"])
    assert result.exit_code == 0, result.output
    profile = read_profile_json(out)
    assert (profile.name, profile.batch_size, profile.num_layers, profile.reference_device) == ("mlp-8x1024", 8, 9, "cpu")
    assert [layer.name for layer in profile.layers] == list(build_model("mlp", {}, "auto").layer_names)
    assert profile.batch_sizes == (1, 2, 4, 8) and profile.threads == 1
    assert profile.source is not None and (profile.source.module, profile.source.dataset) == ("mlp", "digits")
    assert profile.measured and profile.total_fwd_ms > 0
    block = profile.layers[1]
    assert block.curve is not None and block.curve.saved_bytes[3] == 2 * block.curve.saved_bytes[2]
    assert block.bwd_input_ms is not None and block.bwd_input_ms > 0 and block.bwd_weight_ms > 0
    assert {name for name, _ in block.optimizer_ms} == {"adam", "sgd", "sgd_momentum"}
    assert f"wrote {out}" in result.stdout


def test_cli_projects_onto_a_gpu_with_options(tmp_path: Path) -> None:
    """--project-to a100 --dtype bf16 --opt hidden=256 writes a projected curve at sizes 1, 2, 4: bf16 sizes, and at
    each size the roofline of the counted work with its kernels (addmm, relu: the launch floor at these sizes)."""
    out = tmp_path / "p.json"
    args = ["profile", "mlp", "-b", "4", "-o", str(out), "--project-to", "a100", "--dtype", "bf16", "--opt", "hidden=256",
            "--dataset", "sample", "-q"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert (data["reference_device"], data["measured"], data["batch_sizes"]) == ("A100", False, [1, 2, 4])
    layer = data["layers"][1]
    assert layer["activation_bytes"] == [b * 256 * 2 for b in (1, 2, 4)]
    a100 = GPU_SPECS["A100"]
    assert layer["fwd_ms"] == pytest.approx(
        [roofline_ms(2 * b * 256 * 256, (256 * 256 + 256 + 2 * b * 256) * 2, a100, "bf16", kernels=2) for b in (1, 2, 4)]
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["resnet"], "error: ProfileError: MODULE_SPEC 'resnet' is neither a built-in"),
        (["mlp", "--project-to", "tpu"], "error: ProfileError: --project-to must be one of V100, A100"),
        (["mlp", "--opt", "hidden"], "error: ProfileError: --opt must be KEY=VALUE, got 'hidden'"),
        (["mlp", "--dtype", "fp8"], "error: ProfileError: --dtype must be one of fp32, bf16, float32, float64, got 'fp8'"),
        (["mlp", "--opt", "blocks=0"], "error: ProfileError: mlp option blocks must be an integer >= 1, got 0"),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    """A bad spec, GPU kind, option or dtype exits 2 with a one-line message."""
    monkeypatch.setattr(sys, "argv", ["pipeplan", "profile", *args, "-b", "2", "-o", str(tmp_path / "o.json")])
    with pytest.raises(SystemExit) as exit_info:
        main()
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert len(err.strip().splitlines()) == 1
    assert err.startswith(message), err


@pytest.mark.slow
def test_cli_bad_spec_in_a_real_process_has_no_traceback(tmp_path: Path) -> None:
    """The command run as a process exits 2 on an unknown MODULE_SPEC and prints no traceback."""
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "from pipeplan.cli import main; main()",
            "profile",
            "resnet",
            "-b",
            "2",
            "-o",
            str(tmp_path / "o.json"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error: ProfileError: MODULE_SPEC 'resnet' is neither a built-in (mlp, transformer, gpt2-small")


@pytest.mark.parametrize(
    ("name", "options"), [("mlp", {"hidden": 64, "blocks": 3}), ("gpt2-small", {"layers": 1, "seq_len": 32, "dropout": 0.0})]
)
def test_meta_device_counts_what_the_cpu_counts(name: str, options: dict[str, object]) -> None:
    """Built on the meta device (nothing allocated) a spec has the same sizes and work as on the CPU's fused attention path."""
    if name != "mlp":
        pytest.importorskip("transformers")
    cpu = measure_layers(resolve_module_spec(name, **options), None, 2, runs=0)
    with torch.device("meta"):
        spec = resolve_module_spec(name, **options)
    meta = measure_layers(spec, None, 2, runs=0)
    assert meta.device == "meta"
    assert meta.layers == cpu.layers


def test_meta_attention_keeps_no_score_matrix() -> None:
    """With attention dropout on, the CPU keeps S×S scores; a meta projection models the fused kernel and does not."""
    pytest.importorskip("transformers")
    b, s, h, heads = 2, 64, 768, 12
    cpu = measure_layers(resolve_module_spec("gpt2-small", layers=1, seq_len=s), None, b, runs=0).layers[1]
    with torch.device("meta"):
        spec = resolve_module_spec("gpt2-small", layers=1, seq_len=s)
    meta = measure_layers(spec, None, b, runs=0).layers[1]
    scores = b * heads * s * s * F32
    assert cpu.saved_bytes - meta.saved_bytes >= 2 * scores  # probabilities and the dropped-out copy at least
    assert meta.work.bwd_flops - cpu.work.bwd_flops == 2 * b * s * s * h  # the recomputed QKᵀ


def test_meta_models_cannot_be_timed() -> None:
    """Timing rounds on the meta device are refused: nothing runs there."""
    with torch.device("meta"):
        spec = resolve_module_spec("mlp", hidden=8, blocks=1)
    with pytest.raises(ProfileError, match="runs must be 0 for a model on the meta device"):
        measure_layers(spec, None, 2, runs=1)


def test_a_model_on_the_digits_projects_without_touching_its_data_on_the_meta_device() -> None:
    """`profile mlp --project-to A100` (digits, the mlp's default data) projects: the dataset is built on the CPU even
    while the model is built on the meta device (it failed inside digits() on torch.nonzero before)."""
    pytest.importorskip("sklearn")
    from pipeplan.api import profile_model

    profile = profile_model("mlp", 8, project_to="A100")
    assert profile.reference_device == "A100" and not profile.measured
    assert profile.layers[-1].fwd_ms > 0
