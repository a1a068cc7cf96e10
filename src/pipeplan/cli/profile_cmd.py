"""The `pipeplan profile` command: measure a PyTorch model layer by layer, or project it onto a GPU, into a profile file."""

from __future__ import annotations

import contextlib
from pathlib import Path
from types import ModuleType
from typing import Annotated, Any

import typer
from rich.console import Console

from pipeplan.core.errors import ProfileError

DTYPE_CHOICES = ("fp32", "bf16")


def profile(
    module_spec: str = typer.Argument(
        ...,
        metavar="MODULE_SPEC",
        help="Built-in (mlp, transformer, gpt2-small, gpt2-medium, gpt2-large, gpt2-xl, bert-base, bert-large) "
        "or package.module:factory.",
    ),
    batch_size: int = typer.Option(..., "--batch-size", "-b", help="Samples per profiled batch."),
    out: str = typer.Option(..., "--out", "-o", help="Write the pipeplan.profile/1 JSON here."),
    project_to: str | None = typer.Option(
        None,
        "--project-to",
        help="Project times onto this GPU (V100, A100, A100-80GB, H100, H200, L4) from counted FLOPs and bytes "
        "instead of measuring; the model is built on the meta device (no memory, no compute).",
    ),
    dtype: str = typer.Option("fp32", "--dtype", help="Model dtype: fp32 or bf16 (sizes follow it; picks the GPU peak)."),
    runs: int = typer.Option(10, "--runs", help="Timed rounds; each layer's median is kept."),
    warmup: int = typer.Option(3, "--warmup", help="Untimed rounds before the timed ones."),
    options: Annotated[
        list[str] | None,
        typer.Option("--opt", help="A MODULE_SPEC option KEY=VALUE (repeatable), e.g. --opt hidden=512 --opt seq_len=256."),
    ] = None,
    efficiency: float = typer.Option(1.0, "--efficiency", help="Fraction of the GPU's compute peak a projection assumes."),
    device: str = typer.Option("cpu", "--device", help="Where to measure: cpu, cuda or cuda:N."),
    threads: int | None = typer.Option(None, "--threads", help="CPU threads torch may use (default: torch's choice)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar and no table."),
) -> None:
    """Profile MODULE_SPEC: per-layer forward/backward ms, activation, parameter and saved bytes, FLOPs."""
    if dtype not in DTYPE_CHOICES:
        raise ProfileError(f"--dtype must be one of {', '.join(DTYPE_CHOICES)}, got {dtype!r}")
    if batch_size < 1:
        raise ProfileError(f"--batch-size must be an integer >= 1, got {batch_size}")
    if runs < 1 and project_to is None:
        raise ProfileError(f"--runs must be >= 1, got {runs}")
    if warmup < 0:
        raise ProfileError(f"--warmup must be >= 0, got {warmup}")
    if threads is not None and threads < 1:
        raise ProfileError(f"--threads must be >= 1, got {threads}")
    spec_options = parse_options(options or [])
    torch = _import_torch()
    from pipeplan.io.profile_json import write_profile_json
    from pipeplan.profiler.measure import measure_layers
    from pipeplan.profiler.projection import project_profile, resolve_gpu
    from pipeplan.profiler.specs import resolve_module_spec

    if project_to is not None:
        resolve_gpu(project_to)
        if not 0 < efficiency <= 1:
            raise ProfileError(f"--efficiency must be in (0, 1], got {efficiency}")
    # A projection needs shapes only: build on the meta device, so no weights are allocated and nothing is computed.
    target = torch.device("meta") if project_to is not None else _torch_device(torch, device)
    if threads is not None:
        torch.set_num_threads(threads)
    with target if target.type == "meta" else contextlib.nullcontext():
        spec = resolve_module_spec(module_spec, **spec_options)
    if dtype == "bf16":
        spec = spec.cast(torch.bfloat16)
    for layer in spec.layers:
        layer.to(target)
    measurement = measure_layers(
        spec, None, batch_size, runs=0 if project_to else runs, warmup=warmup, whole=project_to is None, progress=not quiet
    )
    result = measurement.to_profile(spec.name)
    if project_to is not None:
        result = project_profile(result, [s.work for s in measurement.layers], project_to, dtype, efficiency)
    write_profile_json(result, Path(out))
    if quiet:
        return
    from pipeplan.cli.show_cmd import profile_layers_table, profile_summary

    console = Console(width=max(Console().width, 120))
    console.print(profile_summary(result))
    console.print(profile_layers_table(result))
    if project_to is None:
        layers_ms = result.total_fwd_ms + result.total_bwd_ms
        whole_ms = measurement.whole_fwd_ms + measurement.whole_bwd_ms
        console.print(f"whole model forward+backward {whole_ms:.3f} ms; sum of layers {layers_ms:.3f} ms")
    total_flops = sum(s.work.flops for s in measurement.layers)
    console.print(f"{total_flops / 1e9:.3f} GFLOP per batch (forward + backward, {dtype})")
    console.print(f"wrote {out}")


def parse_options(pairs: list[str]) -> dict[str, str]:
    """KEY=VALUE strings to a dict.

    Raises:
        ProfileError: naming a pair without `=` or an empty key, or a repeated key.
    """
    result: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise ProfileError(f"--opt must be KEY=VALUE, got {pair!r}")
        if key in result:
            raise ProfileError(f"--opt {key!r} given twice")
        result[key] = value.strip()
    return result


def _import_torch() -> ModuleType:
    """torch, or a ProfileError saying how to install it."""
    try:
        import torch
    except ImportError:
        raise ProfileError("pipeplan profile needs torch: pip install 'pipeplan[torch]'") from None
    return torch


def _torch_device(torch: ModuleType, name: str) -> Any:
    """The torch.device for --device, checked to exist here."""
    try:
        target = torch.device(name)
    except (RuntimeError, ValueError):
        raise ProfileError(f"--device must be cpu, cuda or cuda:N, got {name!r}") from None
    if target.type not in ("cpu", "cuda"):
        raise ProfileError(f"--device must be cpu, cuda or cuda:N, got {name!r}")
    if target.type == "cuda" and not torch.cuda.is_available():
        raise ProfileError(f"--device {name!r}: no CUDA device is available")
    return target


def register(app: typer.Typer) -> None:
    """Add `profile` to app."""
    app.command("profile")(profile)
