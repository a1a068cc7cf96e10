"""Probe and train jobs on N local processes, started from Python (the API, the demo) rather than a command line.

The launcher writes the job (what to run and its inputs, as JSON: a train job's TrainConfig, runtime.training.
config_json, naming its profile and cluster files) into a private temporary folder,
starts N workers with `launch_local` (each runs `JOB_BOOT`), and reads back what process 0 wrote there: the cluster
file of a probe, or the losses and step times of a training run. Process 0 also appends one line per finished
step to a progress file, which `on_progress` follows while the job runs.
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pipeplan.core.errors import ClusterError, PipeplanError, ProfileError
from pipeplan.core.hardware.cluster import Cluster
from pipeplan.core.profile import ModelProfile
from pipeplan.io.cluster_json import cluster_to_json
from pipeplan.io.profile_json import write_profile_json
from pipeplan.runtime.rank_errors import RuntimeFault

JOB_ENV = "PIPEPLAN_LOCAL_JOB"
"""The environment variable naming the job file a worker runs."""
JOB_BOOT = (
    "from pipeplan.runtime.training.launch import watch_launcher; watch_launcher(); "
    "from pipeplan.runtime.training.local_jobs import worker_main; worker_main()"
)
"""How each worker starts (after launch.PRELUDE: the launcher's import path): the watch on its launcher first (no
orphan), then the job."""
POLL_S = 0.2
"""How often the job's progress is read and passed to on_progress."""

Progress = Callable[[int, int], None]
"""on_progress(done, total): steps finished so far (process 0's count) of the job's total."""


def run_local_job(kind: str, nprocs: int, params: dict[str, Any], total: int, on_progress: Progress | None = None,
                  timeout_s: float = 600.0) -> dict[str, Any]:  # fmt: skip
    """Run job `kind` ("probe" or "train") with `params` on `nprocs` local processes; return process 0's result.

    The launcher runs in the calling thread (so a Ctrl-C there stops every worker, saying so in one line, and then
    reaches the caller as KeyboardInterrupt); `on_progress` is called from its watch loop. The model the job builds
    (`params["module"]`, which the API took from the caller or a built-in name) is found by the launcher first.

    Raises:
        RuntimeFault: a worker failed (it printed its own one-line reason on stderr) or the job ran past `timeout_s`.
        KeyboardInterrupt: the launcher was interrupted (the workers are stopped).
    """
    from pipeplan.runtime.training.launch import launch_local

    with tempfile.TemporaryDirectory(prefix="pipeplan-job-") as folder:
        job = Path(folder) / "job.json"
        result, progress = Path(folder) / "result.json", Path(folder) / "progress.txt"
        job.write_text(json.dumps({"kind": kind, "params": params, "result": str(result), "progress": str(progress)}))
        env = {**os.environ, JOB_ENV: str(job)}
        polled = [0.0]

        def poll() -> None:
            now = time.monotonic()
            if on_progress is not None and now - polled[0] >= POLL_S:
                polled[0] = now
                on_progress(_lines(progress), total)

        module = params.get("module")
        given = tuple(params[key] for key in ("data", "loss") if params.get(key) is not None)
        modules = (*(() if module is None else ((module, params.get("options", {})),)), *given)
        code = launch_local(nprocs, JOB_BOOT, env=env, timeout_s=timeout_s, on_poll=poll, modules=modules)
        if code == 128 + int(signal.SIGINT):
            raise KeyboardInterrupt
        if code != 0 or not result.exists():
            raise RuntimeFault(f"the local {kind} job on {nprocs} processes failed (exit code {code}; the reason is above)")
        if on_progress is not None:
            on_progress(total, total)
        return json.loads(result.read_text())


@contextmanager
def job_files(**values: Any) -> Iterator[dict[str, str]]:
    """A temporary folder holding the given profile and cluster as files for a job's workers (a path or a
    built-in name is kept as given, made absolute when a file stands there).

    Raises:
        ProfileError, ClusterError: a profile or cluster that is neither a value nor a name or path.
    """
    with tempfile.TemporaryDirectory(prefix="pipeplan-api-") as folder:
        root = Path(folder)
        paths: dict[str, str] = {}
        for key in ("profile", "cluster"):
            value = values.get(key)
            if isinstance(value, str):
                paths[key] = os.path.abspath(value) if os.path.exists(value) else value
            elif isinstance(value, ModelProfile):
                write_profile_json(value, root / "profile.json")
                paths[key] = str(root / "profile.json")
            elif isinstance(value, Cluster):
                (root / "cluster.json").write_text(json.dumps(cluster_to_json(value)))
                paths[key] = str(root / "cluster.json")
            elif value is not None:
                error = ProfileError if key == "profile" else ClusterError
                raise error(f"{key} must be a {key} value, a file path or a built-in name, got {type(value).__name__}")
        yield paths


def _lines(path: Path) -> int:
    """Lines in the progress file so far (0 before process 0 has written one)."""
    try:
        return path.read_text().count("\n")
    except OSError:
        return 0


def worker_main() -> None:
    """A worker of run_local_job: run the job named by JOB_ENV; process 0 writes the result; exit with the peers."""
    from pipeplan.models.allocator import steady_cpu_allocator
    from pipeplan.runtime.training.error_once import say_error
    from pipeplan.runtime.training.launch import finish_worker

    job = json.loads(Path(os.environ[JOB_ENV]).read_text())
    rank = int(os.environ.get("RANK", "0"))
    steady_cpu_allocator()
    try:
        run = {"probe": _probe, "train": _train}[job["kind"]]
        out = run(job["params"], Path(job["progress"]))
        if out is not None:
            Path(job["result"]).write_text(json.dumps(out))
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        prefix = "" if first.startswith("rank ") else f"rank {rank}: "
        if not getattr(exc, "silent", False):  # silent: another rank says why (runtime.training.agreement)
            say_error(f"error: {type(exc).__name__}: {prefix}{first}")  # once for the ranks that fail alike
        os._exit(2 if isinstance(exc, PipeplanError) and not isinstance(exc, RuntimeFault) else 1)
    finish_worker()


def _probe(params: dict[str, Any], progress: Path) -> dict[str, Any] | None:
    """This process's part of a probe; process 0 returns the cluster's JSON object. The profile is the launcher's
    value (params["profile"], a profile file's object): no file is read here."""
    import torch

    from pipeplan.io.profile_json import profile_from_json
    from pipeplan.runtime.measurement.probe import cluster_json, probe

    torch.set_num_threads(params["threads"])
    given = params["profile"]
    profile = None if given is None else profile_from_json(given, "the job's profile")
    result = probe(profile, params["steps"], params["rounds"], params["timeout_s"], params["optimizer"], params["module"])
    if result is None:
        return None
    return cluster_json(result, params["name"] or f"local-{len(result.speeds)}", profile)


def _train(params: dict[str, Any], progress: Path) -> dict[str, Any] | None:
    """This process's part of a training run: the TrainConfig its launcher built (params["config"],
    runtime.training.config_json); process 0 returns its losses, times and prediction."""
    from pipeplan.runtime.training.config_json import config_from_json
    from pipeplan.runtime.training.worker import train

    config = config_from_json(params["config"])
    plan = config.plan
    assert plan is not None

    def on_step(step: int, loss: float, pipeline_ms: float, optimizer_ms: float) -> None:
        with progress.open("a") as out:
            out.write(f"{step} {loss}\n")

    report = train(config, on_step)
    if report is None:
        return None
    planned = report.plan_prediction
    return {
        "schedule": report.schedule.name if report.schedule is not None else plan.schedule,
        "losses": report.losses,
        "step_ms": report.step_ms,
        "pipeline_ms": report.pipeline_ms,
        "optimizer_ms": report.optimizer_ms,
        "measured_step_ms": report.measured_step_ms(),
        "predicted_step_ms": planned.step_ms if planned is not None else None,
        "predicted_memory_bytes": list(planned.memory_bytes) if planned is not None else None,
        "measured_memory_bytes": report.memory_bytes,
        "warmup_steps": report.warmup_steps,
        "evals": [e.to_json() for e in report.evals],
    }
