"""The `pipeplan probe` command: measure the processes a job will run on and write them as a cluster file."""

from __future__ import annotations

import sys

import typer


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
    from pipeplan.api.probing import probe_job, run_probe
    from pipeplan.cli.declared_files import check_files

    # checked once, here: --local's workers are handed this job (its profile as a value) and parse no command line
    job = probe_job(out, profile, module, (steps, rounds, threads, timeout), optimizer, local, name, check_files)
    code = run_probe(job, local, typer.echo)
    if local is not None:
        sys.exit(code)  # not typer.Exit: main() runs click with standalone_mode=False, which turns Exit into a return value


def register(app: typer.Typer) -> None:
    """Add `probe` to app."""
    app.command("probe")(probe)
