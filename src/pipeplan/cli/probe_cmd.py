"""The `pipeplan probe` command: measure the processes a job will run on and write them as a cluster file."""

from __future__ import annotations

import json
import os
import sys

import typer

from pipeplan.core.errors import OutputError, PipeplanError


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
    from pipeplan.cli.outputs import check_files
    from pipeplan.core.limits import ROUNDS, THREADS, TIMEOUT_S
    from pipeplan.runtime.options import check_local, check_optimizer
    from pipeplan.runtime.rank_errors import TrainConfigError

    for flag, value, low, limit in (
        ("--steps", steps, 1, ROUNDS),
        ("--rounds", rounds, 1, ROUNDS),
        ("--threads", threads, 1, THREADS),
    ):
        if value < low:
            raise TrainConfigError(f"{flag} must be >= {low}, got {value}")
        limit.check(TrainConfigError, flag, value)
    check_optimizer(optimizer)
    check_local(local)
    if not timeout > 0:
        raise TrainConfigError(f"--timeout must be > 0 seconds, got {timeout}")
    TIMEOUT_S.check(TrainConfigError, "--timeout", timeout)
    check_files()
    model_profile = spec = None
    if profile is not None:
        from pipeplan.core.model_source import model_to_build
        from pipeplan.presets.resolve import load_profile

        model_profile = load_profile(profile)
        if model_profile.source is None:
            raise TrainConfigError(
                f"--profile {profile!r} does not record how its model was built; use a profile from `pipeplan profile` "
                "or leave --profile out (every speed 1.0)"
            )
        if model_profile.threads is not None and model_profile.threads != threads:
            raise TrainConfigError(
                f"--profile {profile!r} was measured with {model_profile.threads} thread(s) but --threads is {threads}: "
                "speeds would compare different thread counts"
            )
        spec = model_to_build(model_profile.source, module, profile, "--module")
    elif module is not None:
        raise TrainConfigError("--module names the model of --profile; give --profile too, or leave --module out")
    if local is not None:
        from pipeplan.cli.train_cmd import WORKER_BOOT, _worker_argv
        from pipeplan.runtime.training.launch import launch_local

        source = None if model_profile is None else model_profile.source
        modules = () if spec is None or source is None else ((spec, dict(source.options)),)
        sys.exit(launch_local(local, WORKER_BOOT, _worker_argv(sys.argv[1:]), grace_s=min(timeout, 10.0), modules=modules))
    _run(out, model_profile, spec, name, steps, rounds, timeout, threads, optimizer)


def _run(
    out: str,
    profile: object,
    module: str | None,
    name: str | None,
    steps: int,
    rounds: int,
    timeout: float,
    threads: int,
    optimizer: str,
) -> None:
    """This process's part; process 0 writes the file. A failure prints one line and exits (2: a peer never answered);
    a file process 0 cannot write (a full disk) is said in one line after the work, and the job leaves together, exit 1."""
    from pipeplan.api.outputs import no_space_line
    from pipeplan.io.atomic import write_failure, write_text_atomic
    from pipeplan.io.file_kinds import CLUSTER
    from pipeplan.models.allocator import set_cpu_threads, steady_cpu_allocator
    from pipeplan.runtime.measurement.probe import cluster_json, probe
    from pipeplan.runtime.training.error_once import say_error
    from pipeplan.runtime.training.launch import finish_worker
    from pipeplan.runtime.transport.launch_env import check_launch_env

    check_launch_env()  # before anything reads RANK (a malformed one: one line, not torch's C++ log)
    steady_cpu_allocator()
    set_cpu_threads(threads)
    rank = int(os.environ.get("RANK", "0"))
    try:
        result = probe(profile, steps, rounds, timeout, optimizer, module)  # type: ignore[arg-type]
        if result is not None:
            text = json.dumps(cluster_json(result, name or f"local-{len(result.speeds)}", profile), indent=2, sort_keys=True)  # type: ignore[arg-type]
            try:
                write_text_atomic(out, text + "\n", CLUSTER)
            except (OSError, OutputError) as exc:  # a full disk: after the work; said once, then leave with the peers
                line = no_space_line(exc) or f"OutputError: --out {out!r} not written: {write_failure(exc)}"
                print(f"error: {line}", file=sys.stderr, flush=True)
                finish_worker(1)
            speeds = ", ".join(f"{s:.3f}" for s in result.speeds)
            typer.echo(f"wrote cluster {out}: {len(result.speeds)} {result.kind} device(s), speeds {speeds}")
            if result.message_overhead_s or result.message_latency_s or result.overhead_alone:
                typer.echo(
                    f"message costs: overhead {result.message_overhead_s * 1e6:.0f} us + latency "
                    f"{result.message_latency_s * 1e6:.0f} us (fitted alone, the overhead would be "
                    f"{result.overhead_alone * 1e6:.0f} us)"
                )
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        prefix = "" if first.startswith("rank ") else f"rank {rank}: "
        say_error(f"error: {type(exc).__name__}: {prefix}{first}")  # once for the ranks that fail alike
        sys.stdout.flush()
        os._exit(2 if isinstance(exc, PipeplanError) else 1)
    finish_worker()


def register(app: typer.Typer) -> None:
    """Add `probe` to app."""
    app.command("probe")(probe)
