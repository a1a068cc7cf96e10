"""`pipeplan probe` through the API: its options checked, the profile's model named, then either this process's part
of the probe (under torchrun, or as one of --local's workers) or --local's workers started (torch).

Process 0 writes the cluster file (io.cluster_json, through the runtime's probe_cluster) and hands the result to the
caller's `report`; a failure is one line on stderr, said once, and every process leaves at once.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from pipeplan.core.errors import OutputError, PipeplanError, TrainConfigError

if TYPE_CHECKING:
    from pipeplan.core.profile import ModelProfile


def check_probe_options(steps: int, rounds: int, threads: int, optimizer: str, local: int | None, timeout: float) -> None:
    """The probe's numbers, optimizer, process count and timeout, before any work.

    Raises:
        TrainConfigError: naming the flag and its value.
    """
    from pipeplan.core.limits import ROUNDS, THREADS, TIMEOUT_S
    from pipeplan.runtime.options import check_local, check_optimizer

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


def probe_model(profile: str | None, module: str | None, threads: int) -> tuple[ModelProfile | None, str | None]:
    """The profile --profile names and the MODULE_SPEC of its model (core.model_source), or (None, None).

    Raises:
        TrainConfigError: a profile that records no source, one measured with other --threads, or --module without
            --profile; ProfileError: an unreadable profile.
    """
    if profile is None:
        if module is not None:
            raise TrainConfigError("--module names the model of --profile; give --profile too, or leave --module out")
        return None, None
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
    return model_profile, model_to_build(model_profile.source, module, profile, "--module")


def launch_probe(
    local: int, boot: str, argv: Sequence[str], timeout: float, profile: ModelProfile | None, spec: str | None
) -> int:
    """Start `local` workers here, each running `boot` with `argv` (the command line without --local); their exit code.

    The profile's model module is checked importable before any worker starts (runtime.training.launch).
    """
    from pipeplan.runtime.training.launch import launch_local

    source = None if profile is None else profile.source
    modules = () if spec is None or source is None else ((spec, dict(source.options)),)
    return launch_local(local, boot, list(argv), grace_s=min(timeout, 10.0), modules=modules)


def probe_process(
    out: str,
    profile: ModelProfile | None,
    module: str | None,
    name: str | None,
    steps: int,
    rounds: int,
    timeout: float,
    threads: int,
    optimizer: str,
    report: Callable[[Any], None],
) -> None:
    """This process's part; process 0 writes the file and calls `report` with the result (runtime.measurement.probe's
    ProbeResult). A failure prints one line and exits (2: a peer never answered); a file process 0 cannot write (a
    full disk) is said in one line after the work, and the job leaves together, exit 1. Never returns."""
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
        result = probe(profile, steps, rounds, timeout, optimizer, module)
        if result is not None:
            import json

            text = json.dumps(cluster_json(result, name or f"local-{len(result.speeds)}", profile), indent=2, sort_keys=True)
            try:
                write_text_atomic(out, text + "\n", CLUSTER)
            except (OSError, OutputError) as exc:  # a full disk: after the work; said once, then leave with the peers
                line = no_space_line(exc) or f"OutputError: --out {out!r} not written: {write_failure(exc)}"
                print(f"error: {line}", file=sys.stderr, flush=True)
                finish_worker(1)
            report(result)
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        prefix = "" if first.startswith("rank ") else f"rank {rank}: "
        say_error(f"error: {type(exc).__name__}: {prefix}{first}")  # once for the ranks that fail alike
        sys.stdout.flush()
        os._exit(2 if isinstance(exc, PipeplanError) else 1)
    finish_worker()
