"""The `pipeplan profile` command: measure a PyTorch model layer by layer, or project it onto a GPU, into a profile file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pipeplan.api.option_text import parse_options
from pipeplan.core.errors import ProfileError
from pipeplan.core.limits import BATCH, ROUNDS, THREADS


def profile(
    module_spec: str = typer.Argument(
        ...,
        metavar="MODULE_SPEC",
        help="Built-in (mlp, transformer, rescnn (branching: a graph), charlm, gpt2-small, gpt2-medium, gpt2-large, "
        "gpt2-xl, bert-base, bert-large) or package.module:factory.",
    ),
    batch_size: int = typer.Option(..., "--batch-size", "-b", help="The largest (reference) batch size measured."),
    out: str = typer.Option(..., "--out", "-o", help="Write the pipeplan.profile/2 JSON here."),
    batch_sizes: str | None = typer.Option(
        None,
        "--batch-sizes",
        help="Batch sizes to measure, comma-separated and increasing (default: powers of two from 1 "
        "up to --batch-size, plus --batch-size; the largest must be --batch-size).",
    ),
    project_to: str | None = typer.Option(
        None,
        "--project-to",
        help="Project times onto this GPU (V100, A100, A100-80GB, H100, H200, L4) from counted FLOPs, bytes and kernels "
        "at every batch size instead of measuring; the model is built on the meta device (no memory, no compute).",
    ),
    dtype: str = typer.Option(
        "fp32",
        "--dtype",
        help="The weights' dtype: fp32 (float32) or float64, as train --dtype; bf16 (a bfloat16 model) with --project-to only.",
    ),
    precision: str = typer.Option(
        "full",
        "--precision",
        help="What the layers compute in, as train --precision: full (the dtype), or bf16 / fp16 autocast over float32 "
        "weights (measured only).",
    ),
    dataset: str = typer.Option(
        "auto",
        "--dataset",
        help="The data train runs on, which fixes the model's layers exactly as train builds them: "
        "digits, sample or auto (digits when the model takes in_features, else sample).",
    ),
    data: str | None = typer.Option(
        None,
        "--data",
        help="Measure on your own samples: MODULE:FACTORY returning a map-style Dataset or a list of (input, target) "
        "pairs or dicts (input_ids/pixel_values + labels); train takes the same --data.",
    ),
    loss: str | None = typer.Option(
        None, "--loss", help="MODULE:FN, called FN(output, target) -> scalar, timed with the last layer [the model's]."
    ),
    runs: int = typer.Option(10, "--runs", help="Timed rounds; each layer's median is kept."),
    warmup: int = typer.Option(3, "--warmup", help="Untimed rounds before the timed ones."),
    options: Annotated[
        list[str] | None,
        typer.Option("--opt", help="A MODULE_SPEC option KEY=VALUE (repeatable), e.g. --opt hidden=512 --opt seq_len=256."),
    ] = None,
    efficiency: float = typer.Option(1.0, "--efficiency", help="Fraction of the GPU's compute peak a projection assumes."),
    device: str = typer.Option("cpu", "--device", help="Where to measure: cpu, cuda or cuda:N."),
    threads: int = typer.Option(1, "--threads", help="CPU threads torch may use; train runs with 1 per process by default."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar and no table."),
) -> None:
    """Profile MODULE_SPEC at several batch sizes: per-layer forward/backward/I/W ms, bytes, FLOPs, optimizer steps."""
    from pipeplan.cli.declared_files import check_files
    from pipeplan.cli.flags import parse_int_list
    from pipeplan.core.precision import check_profile_numerics

    check_profile_numerics(dtype, precision, project_to is not None, ("--dtype", "--precision"), "--project-to")
    if batch_size < 1:
        raise ProfileError(f"--batch-size must be an integer >= 1, got {batch_size}")
    BATCH.check(ProfileError, "--batch-size", batch_size)
    if runs < 1 and project_to is None:
        raise ProfileError(f"--runs must be >= 1, got {runs}")
    if warmup < 0:
        raise ProfileError(f"--warmup must be >= 0, got {warmup}")
    if threads < 1:
        raise ProfileError(f"--threads must be >= 1, got {threads}")
    for flag, value, limit in (("--runs", runs, ROUNDS), ("--warmup", warmup, ROUNDS), ("--threads", threads, THREADS)):
        limit.check(ProfileError, flag, value)
    spec_options = parse_options(options or [])
    _require_torch()
    from pipeplan import api
    from pipeplan.api.modules import check_profile_target, profile_batch_sizes

    sizes = profile_batch_sizes(batch_size, parse_int_list("--batch-sizes", batch_sizes))
    check_files()
    from pipeplan.io.profile_json import write_profile_json

    check_profile_target(project_to, efficiency, device)
    result = api.profile_model(module_spec, batch_size, options=spec_options, dataset=dataset, batch_sizes=sizes,
                               project_to=project_to, dtype=dtype, efficiency=efficiency, runs=runs, warmup=warmup,
                               threads=threads, progress=not quiet, device=device,
                               precision=precision, data=data, loss=loss)  # fmt: skip
    check_files()  # again: the module file the import did load is an input too, whichever file it turned out to be
    write_profile_json(result, Path(out))
    if quiet:
        return
    from pipeplan.viz.inventory import profile_layers_table, profile_summary
    from pipeplan.viz.tables import wide_console

    console = wide_console()
    console.print(profile_summary(result))
    console.print(profile_layers_table(result))
    total_flops = sum(layer.flops or 0.0 for layer in result.layers)
    numbers = _numbers(dtype, precision)
    console.print(f"{total_flops / 1e9:.3f} GFLOP per batch of {result.batch_size} (forward + backward, {numbers})")
    console.print(f"wrote {out}")


def _numbers(dtype: str, precision: str) -> str:
    """How the summary names what the profile was measured in."""
    return dtype if precision == "full" else f"{precision} autocast over {dtype}"


def _require_torch() -> None:
    """A ProfileError saying how to install torch when it is missing."""
    import importlib.util

    try:
        missing = importlib.util.find_spec("torch") is None
    except ImportError:  # a broken or blocked install counts as missing
        missing = True
    if missing:
        raise ProfileError("pipeplan profile needs torch: pip install 'pipeplan[torch]'")


def register(app: typer.Typer) -> None:
    """Add `profile` to app."""
    app.command("profile")(profile)
