"""The `pipeplan probe` command: measure the processes a job will run on and write them as a cluster file."""

from __future__ import annotations

import sys
from typing import Any

import typer

from pipeplan.core.units import ms_to_us

PROBE_BOOT = (
    "from pipeplan.runtime.training.launch import watch_launcher; watch_launcher(); from pipeplan.cli import main; main()"
)
"""How probe --local starts each worker (after launch.PRELUDE: the launcher's import path): first the watch on its
launcher (no orphan if the launcher dies), then this same CLI, without --local, under the launcher's torchrun-like
environment."""


def _worker_argv(argv: list[str]) -> list[str]:
    """This command line without `--local N` (or `--local=N`)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == "--local":
            skip = True
            continue
        if arg.startswith("--local="):
            continue
        out.append(arg)
    return out


def probe(
    out: str = typer.Option(..., "--out", "-o", help="Write the pipeplan.cluster/1 JSON here (process 0)."),
    profile: str | None = typer.Option(
        None, "--profile", help="A profile from `pipeplan profile`: every process times its model, giving its speed."
    ),
    module: str | None = typer.Option(
        None,
        "--module",
        help="With --profile: the MODULE_SPEC its model was measured on, when that is pkg.module:factory (a profile "
        "never chooses code to run; a built-in it records needs no --module).",
    ),
    local: int | None = typer.Option(None, "--local", help="Start N processes on this machine (loopback) instead of torchrun."),
    name: str | None = typer.Option(None, "--name", help="The cluster's name [local-N]."),
    steps: int = typer.Option(16, "--steps", help="Timed steps of each calibration run (with --profile)."),
    rounds: int = typer.Option(10, "--rounds", help="Ping-pongs per message size and all-reduces per size."),
    timeout: float = typer.Option(60.0, "--timeout", help="Seconds any process waits for a peer before failing."),
    optimizer: str = typer.Option(
        "adam", "--optimizer", help="The optimizer the calibration steps take: adam, sgd or sgd_momentum (as train)."
    ),
    threads: int = typer.Option(1, "--threads", help="CPU threads per process (train's default is 1)."),
) -> None:
    """Measure device speeds (against a profile), point-to-point latency and bandwidth of every pair, and all-reduce."""
    from pipeplan.api.probing import check_probe_options, launch_probe, probe_model, probe_process
    from pipeplan.cli.declared_files import check_files

    check_probe_options(steps, rounds, threads, optimizer, local, timeout)
    check_files()
    model_profile, spec = probe_model(profile, module, threads)
    if local is not None:
        sys.exit(launch_probe(local, PROBE_BOOT, _worker_argv(sys.argv[1:]), timeout, model_profile, spec))
    probe_process(out, model_profile, spec, name, steps, rounds, timeout, threads, optimizer, lambda r: _report(out, r))


def _report(out: str, result: Any) -> None:
    """Process 0's lines: the file written, the devices and their speeds, and the message costs when fitted."""
    speeds = ", ".join(f"{s:.3f}" for s in result.speeds)
    typer.echo(f"wrote cluster {out}: {len(result.speeds)} {result.kind} device(s), speeds {speeds}")
    if result.message_overhead_ms or result.message_latency_ms or result.overhead_alone_ms:
        typer.echo(
            f"message costs: overhead {ms_to_us(result.message_overhead_ms):.0f} us + latency "
            f"{ms_to_us(result.message_latency_ms):.0f} us (fitted alone, the overhead would be "
            f"{ms_to_us(result.overhead_alone_ms):.0f} us)"
        )


def register(app: typer.Typer) -> None:
    """Add `probe` to app."""
    app.command("probe")(probe)
