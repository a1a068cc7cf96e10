"""`pipeplan probe` through the API: its options checked and the profile read once, into one ProbeJob, then either
this process's part of the probe (under torchrun) or --local's workers started (torch), each given that job as JSON
in its environment (as train's workers are given their TrainConfig): a worker parses no command line and opens no
file of the user's.

Process 0 writes the cluster file (io.cluster_json, through the runtime's probe_cluster) and prints what it measured;
a failure is one line on stderr, said once, and every process leaves at once.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from pipeplan.core.errors import OutputError, PipeplanError, TrainConfigError

if TYPE_CHECKING:
    from pipeplan.core.profile import ModelProfile

PROBE_BOOT = (
    "from pipeplan.runtime.training.launch import watch_launcher; watch_launcher(); "
    "from pipeplan.api.probing import worker_main; worker_main()"
)
"""How probe --local starts each worker (after launch.PRELUDE: the launcher's import path): first the watch on its
launcher (no orphan if the launcher dies), then `worker_main`, under the launcher's torchrun-like environment."""


@dataclass(frozen=True)
class ProbeJob:
    """What every process of a probe runs, checked once by the launcher (probe_job): the profile as its value."""

    out: str
    """The cluster file process 0 writes (--out)."""
    profile: ModelProfile | None = None
    module: str | None = None
    """The MODULE_SPEC of the profile's model (core.model_source), None without a profile."""
    name: str | None = None
    steps: int = 16
    rounds: int = 10
    timeout_s: float = 60.0
    threads: int = 1
    optimizer: str = "adam"

    def to_json(self) -> dict[str, Any]:
        """This job as one JSON object: every field by its name, the profile as a profile file's object."""
        from pipeplan.io.profile_json import profile_to_json

        obj = {f.name: getattr(self, f.name) for f in fields(self)}
        obj["profile"] = None if self.profile is None else profile_to_json(self.profile)
        return obj

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> ProbeJob:
        """The job `to_json` gave.

        Raises:
            TrainConfigError: a key that names no field; ProfileError: a profile that does not read back.
        """
        from pipeplan.io.profile_json import profile_from_json

        unknown = sorted(set(obj) - {f.name for f in fields(cls)})
        if unknown:
            raise TrainConfigError(f"a probe job has no field {unknown[0]!r}")
        profile = obj.get("profile")
        return cls(**{**obj, "profile": None if profile is None else profile_from_json(profile, "the job's profile")})


def probe_job(
    out: str,
    profile: str | None,
    module: str | None,
    numbers: tuple[int, int, int, float],
    optimizer: str,
    local: int | None,
    name: str | None = None,
    check_outputs: Callable[[], None] = lambda: None,
) -> ProbeJob:
    """`pipeplan probe`'s job, checked once: `numbers` (--steps, --rounds, --threads, --timeout), --optimizer and
    --local (check_probe_options), the outputs (the caller's guard, `check_outputs`), then the profile read and its
    model named (probe_model).

    Raises:
        TrainConfigError, ProfileError, OutputError: naming the flag and its value.
    """
    steps, rounds, threads, timeout = numbers
    check_probe_options(steps, rounds, threads, optimizer, local, timeout)
    check_outputs()
    model_profile, spec = probe_model(profile, module, threads)
    return ProbeJob(out, model_profile, spec, name, steps, rounds, timeout, threads, optimizer)


def run_probe(job: ProbeJob, local: int | None, report: Callable[[str], None] = print) -> int:
    """Start --local's `local` workers with `job` (their exit code), or, under torchrun (`local` None), run this
    process's part (probe_process: never returns)."""
    if local is not None:
        return launch_probe(local, job)
    probe_process(job, report)
    return 0


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


def launch_probe(local: int, job: ProbeJob) -> int:
    """Start `local` workers here, each given `job` as JSON in the launcher's rendezvous store (launch_local's
    `job`: no file, and not the environment, whose strings Linux caps at 128 KiB); their exit code.

    The profile's model module is checked importable before any worker starts (runtime.training.launch).
    """
    from pipeplan.runtime.training.launch import launch_local

    source = None if job.profile is None else job.profile.source
    modules = () if job.module is None or source is None else ((job.module, dict(source.options)),)
    text = json.dumps(job.to_json()).encode()
    return launch_local(local, PROBE_BOOT, grace_s=min(job.timeout_s, 10.0), modules=modules, job=text)


def worker_main() -> None:
    """A worker of `probe --local`: its part of the job the launcher built and checked (launch.read_job); only the launcher's
    variables are checked here."""
    from pipeplan.api.failure import REPORTED, fail_for
    from pipeplan.runtime.training.launch import read_job
    from pipeplan.runtime.transport.launch_env import check_launch_env

    try:
        check_launch_env()
        job = ProbeJob.from_json(json.loads(read_job()))
    except REPORTED as exc:
        fail_for(exc)
        raise
    probe_process(job, print)


def probe_lines(out: str, result: Any) -> list[str]:
    """Process 0's lines: the file written, the devices and their speeds, and the message costs when fitted."""
    from pipeplan.core.units import ms_to_us

    speeds = ", ".join(f"{s:.3f}" for s in result.speeds)
    lines = [f"wrote cluster {out}: {len(result.speeds)} {result.kind} device(s), speeds {speeds}"]
    if result.message_overhead_ms or result.message_latency_ms or result.overhead_alone_ms:
        lines.append(
            f"message costs: overhead {ms_to_us(result.message_overhead_ms):.0f} us + latency "
            f"{ms_to_us(result.message_latency_ms):.0f} us (fitted alone, the overhead would be "
            f"{ms_to_us(result.overhead_alone_ms):.0f} us)"
        )
    if result.tp_allreduce_bytes_per_s is not None:
        lines.append(
            f"tensor-parallel all-reduce: {ms_to_us(result.tp_allreduce_latency_ms):.0f} us per ring step + "
            f"{result.tp_allreduce_bytes_per_s / 1e9:.3f} GB/s bus bandwidth"
        )
    return lines


def probe_process(job: ProbeJob, report: Callable[[str], None] = print) -> None:
    """This process's part of `job`; process 0 writes the file and passes its lines (probe_lines) to `report`. A
    failure prints one line and exits (2: a peer never answered); a file process 0 cannot write (a full disk) is said
    in one line after the work, and the job leaves together, exit 1. Never returns."""
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
    set_cpu_threads(job.threads)
    rank = int(os.environ.get("RANK", "0"))
    out, profile = job.out, job.profile
    try:
        result = probe(profile, job.steps, job.rounds, job.timeout_s, job.optimizer, job.module)
        if result is not None:
            text = json.dumps(cluster_json(result, job.name or f"local-{len(result.speeds)}", profile), indent=2,
                              sort_keys=True)  # fmt: skip
            try:
                write_text_atomic(out, text + "\n", CLUSTER)
            except (OSError, OutputError) as exc:  # a full disk: after the work; said once, then leave with the peers
                line = no_space_line(exc, "--out") or f"OutputError: --out {out!r} not written: {write_failure(exc)}"
                print(f"error: {line}", file=sys.stderr, flush=True)
                finish_worker(1)
            for line in probe_lines(out, result):
                report(line)
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        prefix = "" if first.startswith("rank ") else f"rank {rank}: "
        say_error(f"error: {type(exc).__name__}: {prefix}{first}")  # once for the ranks that fail alike
        sys.stdout.flush()
        os._exit(2 if isinstance(exc, PipeplanError) else 1)
    finish_worker()
