"""A train job's processes: the --local launcher, which hands each worker the TrainConfig it built as JSON, and this
process's part (a --local worker's or a torchrun rank's), ending with its peers."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from pipeplan.api.train.train_flags import TrainFlags
from pipeplan.core.errors import PipeplanError

if TYPE_CHECKING:
    from pipeplan.runtime.training.train_config import TrainConfig

WORKER_BOOT = (
    "from pipeplan.runtime.training.launch import watch_launcher; watch_launcher(); "
    "from pipeplan.api.train.train_workers import worker_main; worker_main()"
)
"""How --local starts each worker (after launch.PRELUDE: the launcher's import path): first the watch on its launcher
(no orphan if the launcher dies), then `worker_main`, under the launcher's torchrun-like environment."""


def launch(config: TrainConfig, f: TrainFlags, local: int, modules: Sequence[str | tuple[str, dict[str, str]]]) -> int:
    """Start `local` workers on this machine, each given the job the launcher built and checked (`config`, and `f`
    without --local) as JSON in the launcher's rendezvous store: {"config": its TrainConfig
    (runtime.training.config_json), "flags": its flags (what process 0 prints and writes at the end)}; written to no
    file and not in the environment (runtime.training.launch.launch_local's `job`); their exit code."""
    from pipeplan.runtime.training.config_json import config_to_json
    from pipeplan.runtime.training.launch import launch_local

    job = json.dumps({"config": config_to_json(config), "flags": dataclasses.replace(f, local=None).to_json()})
    return launch_local(local, WORKER_BOOT, grace_s=min(f.timeout, 10.0), modules=modules, job=job.encode())


def worker_main() -> None:
    """A worker of `train --local`: its part of the job the launcher built (launch.read_job), its files not read again and
    its flags not checked again (the launcher did both); only the launcher's variables are checked here."""
    from pipeplan.api.failure import REPORTED, fail_for
    from pipeplan.runtime.training.config_json import config_from_json
    from pipeplan.runtime.training.launch import read_job
    from pipeplan.runtime.transport.launch_env import check_launch_env

    try:
        check_launch_env()
        job = json.loads(read_job())
        run_part(config_from_json(job["config"]), TrainFlags.from_json(job["flags"]))
    except REPORTED as exc:
        fail_for(exc)
        raise


def run_part(config: TrainConfig, f: TrainFlags) -> None:
    """Run this process's part; a failure prints one line naming the rank and exits non-zero at once (no hang).

    A result file that cannot be written at the end (a full disk, a folder gone) is not such a failure: the
    results already computed are printed and the other files written, then one line names what was not written,
    and the process leaves with its peers and exits 1.
    """
    from pipeplan.runtime.rank_errors import RuntimeFault
    from pipeplan.runtime.training.error_once import say_error
    from pipeplan.runtime.training.launch import finish_worker
    from pipeplan.runtime.training.worker import train as run_training

    rank = int(os.environ.get("RANK", "0"))

    def on_step(step: int, loss: float, pipeline_ms: float, optimizer_ms: float) -> None:
        if not f.quiet and not f.as_json:
            times = f"pipeline {pipeline_ms:8.2f} ms  optimizer {optimizer_ms:7.2f} ms"
            of = "" if config.epochs else f"/{config.steps}"
            print(f"step {step + 1:>5}{of}  loss {loss:.6f}  {times}", flush=True)

    failures: list[str] = []  # results this process could not write: said once at the end, the job goes on
    try:
        report = run_training(config, on_step, on_note=lambda line: None if f.as_json else print(line, flush=True),
                              on_write_error=failures.append)  # fmt: skip
    except Exception as exc:
        code = 2 if isinstance(exc, PipeplanError) and not isinstance(exc, RuntimeFault) else 1
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        prefix = "" if first.startswith("rank ") else f"rank {rank}: "
        if not getattr(exc, "silent", False):  # silent: another rank says why (runtime.training.agreement)
            say_error(f"error: {type(exc).__name__}: {prefix}{first}")  # once for the ranks that fail alike
        sys.stdout.flush()
        os._exit(code)
    if report is not None:
        from pipeplan.viz.train_report import report_results

        failures += report_results(report, f.timeline, f.png, f.as_json, f.timeline_option)
    if failures:
        print(f"error: OutputError: rank {rank}: {'; '.join(failures)}", file=sys.stderr, flush=True)
    finish_worker(1 if failures else 0)  # with the peers, in the job's final barrier: no peer is left to fail alone
