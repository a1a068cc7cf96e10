"""The checks of a training job's options, in one place: `train` runs them before any process starts and
`TrainConfig` on every process (no torch here, so the launcher fails fast)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from pipeplan.core.errors import PipeplanError
from pipeplan.core.limits import SEED, THREADS, TIMEOUT_S, TRAIN_BATCH
from pipeplan.core.plan import Plan
from pipeplan.runtime.rank_errors import TrainConfigError
from pipeplan.schedules.registry import ASYNCHRONOUS

OPTIMIZERS = ("adam", "sgd", "sgd_momentum")
"""What train steps with: Adam, plain SGD, SGD with momentum 0.9 (the names a profile times its steps under)."""
DTYPES = ("float32", "float64")
"""The master weights' dtypes (core.precision.DTYPES; --precision is checked with them there)."""
PROCESSES_PER_CORE = 4
"""The most --local processes per usable CPU core (see check_local)."""
LR_SCHEDULES = ("constant", "cosine")
"""The base learning-rate schedules of train (runtime.execution.optim.RateSchedule): constant, or cosine annealing to 0."""


def check_train_options(
    *,
    steps: int,
    lr: float,
    optimizer: str,
    dtype: str,
    threads: int,
    timeout_s: float,
    warmup_steps: int,
    checkpoint_every: int,
    keep_last: int,
    checkpoint_dir: str | None,
    resume: bool,
    lr_schedule: str = "constant",
    batch_scaling: str = "auto",
    backend: str | None = None,
    precision: str = "full",
) -> None:
    """Raise TrainConfigError naming the first option (as its flag) with a value a job cannot run with."""
    from pipeplan.core.precision import check_numerics
    from pipeplan.sim.cost.layers import SCALINGS

    lower = {"--steps": (steps, 1), "--threads": (threads, 1), "--warmup-steps": (warmup_steps, 0),
             "--checkpoint-every": (checkpoint_every, 0), "--keep-last": (keep_last, 0)}  # fmt: skip
    for flag, (value, least) in lower.items():
        if value < least:
            raise TrainConfigError(f"{flag} must be >= {least}, got {value}")
    if not math.isfinite(lr) or lr < 0:
        raise TrainConfigError(f"--lr must be a finite number >= 0 (0 trains nothing), got {lr}")
    if not math.isfinite(timeout_s) or timeout_s <= 0:
        raise TrainConfigError(f"--timeout must be a finite number of seconds > 0, got {timeout_s}")
    TIMEOUT_S.check(TrainConfigError, "--timeout", timeout_s)
    THREADS.check(TrainConfigError, "--threads", threads)
    check_optimizer(optimizer)
    if lr_schedule not in LR_SCHEDULES:
        raise TrainConfigError(f"--lr-schedule must be one of {', '.join(LR_SCHEDULES)}, got {lr_schedule!r}")
    check_numerics(dtype, precision, TrainConfigError)
    if batch_scaling not in SCALINGS:
        raise TrainConfigError(f"--batch-scaling must be one of {', '.join(SCALINGS)}, got {batch_scaling!r}")
    check_backend(backend)
    if (checkpoint_every or resume) and not checkpoint_dir:
        raise TrainConfigError("--checkpoint-every and --resume need --checkpoint-dir")
    if checkpoint_dir and not checkpoint_every and not resume:
        raise TrainConfigError(
            f"--checkpoint-dir {checkpoint_dir!r} without --checkpoint-every writes no checkpoint; add --checkpoint-every N "
            "(one every N steps), or --resume to continue from the folder"
        )


def check_backend(backend: str | None, processes: int | None = None) -> None:
    """Raise TrainConfigError unless `backend` is None (nccl with CUDA, else gloo), gloo, or nccl where torch sees a
    CUDA device for this process (LOCAL_RANK under torchrun) and for each of `processes` (--local N; NCCL takes one
    process per device): checked before the process group forms, which would otherwise fail inside torch in every
    process.

    Note:
        Only nccl imports torch here (to ask for CUDA); every other option stays torch-free.
    """
    if backend not in (None, "gloo", "nccl"):
        raise TrainConfigError(f"--backend must be gloo or nccl, got {backend!r}")
    if backend != "nccl":
        return
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise TrainConfigError("--backend nccl needs a CUDA device, and torch sees none here; use --backend gloo "
                               "(or leave --backend out: nccl when CUDA is available, else gloo)")  # fmt: skip
    if processes is not None and processes > count:
        raise TrainConfigError(f"--backend nccl runs one process per CUDA device: --local {processes} needs {processes} "
                               f"devices, torch sees {count}; start at most {count}, or use --backend gloo")  # fmt: skip
    local_rank = os.environ.get("LOCAL_RANK", "0")
    if local_rank.isdigit() and int(local_rank) >= count:
        raise TrainConfigError(f"--backend nccl: LOCAL_RANK {local_rank} has no CUDA device (torch sees {count}); "
                               "start at most one process per device on each machine")  # fmt: skip


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity mask where the system has one)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def check_local(local: int | None) -> None:
    """Raise TrainConfigError when --local N is below 1 or beyond PROCESSES_PER_CORE per usable core of this machine.

    Note:
        Each local process is a Python interpreter holding torch (a few hundred
        MB) with at least one busy thread. Beyond a few per core they only take
        turns: the job runs slower than with fewer processes, its timings no
        longer say anything, and a mistyped count (1000) exhausts the machine
        before the first step. A larger job belongs on several machines, under torchrun.
    """
    if local is None:
        return
    if local < 1:
        raise TrainConfigError(f"--local must be >= 1, got {local}")
    cores = usable_cores()
    limit = PROCESSES_PER_CORE * cores
    if local > limit:
        raise TrainConfigError(
            f"--local {local} is too many processes for this machine: the limit is {limit} ({PROCESSES_PER_CORE} per core, "
            f"{cores} core(s)), because beyond that the processes only take turns on the cores; run a larger job under "
            "torchrun on several machines"
        )


def check_seed(seed: int) -> None:
    """Raise TrainConfigError naming --seed unless it is an integer in 0..core.limits.SEED (a larger one overflowed
    torch.manual_seed in every process, after they started)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise TrainConfigError(f"--seed must be an integer >= 0, got {seed!r}")
    SEED.check(TrainConfigError, "--seed", seed)


def check_global_batch(global_batch: int, where: str) -> None:
    """Raise TrainConfigError when a job's global batch (`where`: the flag or the plan file) is below 1, or larger
    than every process can build in memory at each step (core.limits.TRAIN_BATCH)."""
    if isinstance(global_batch, bool) or not isinstance(global_batch, int) or global_batch < 1:
        raise TrainConfigError(f"{where} must be an integer >= 1 (samples per iteration), got {global_batch!r}")
    TRAIN_BATCH.check(TrainConfigError, where, global_batch)


def check_optimizer(optimizer: str) -> str:
    """Return `optimizer` if train can step with it, else raise TrainConfigError naming --optimizer and the value."""
    if optimizer not in OPTIMIZERS:
        raise TrainConfigError(f"--optimizer must be one of {', '.join(OPTIMIZERS)}, got {optimizer!r}")
    return optimizer


@dataclass(frozen=True, slots=True)
class AsyncSettings:
    """PipeMare's switches: `lr_reschedule` K (None: off), `discrepancy_decay` D (None: off), `sync_warmup` W
    minibatches (0: none); beyond PipeMare, `weight_prediction`: forwards on w + τ δ (δ the last step's change)."""

    lr_reschedule: int | None = None
    discrepancy_decay: float | None = None
    sync_warmup: int = 0
    weight_prediction: bool = False


def check_async_settings(settings: AsyncSettings, steps: int | None) -> AsyncSettings:
    """Raise TrainConfigError naming the flag: K below 1, D outside [0, 1), W beyond the run's `steps` (None: not
    known yet, --epochs), prediction with correction."""
    k = settings.lr_reschedule
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
        raise TrainConfigError(f"--lr-reschedule must be an integer >= 1 (steps over which the rescheduling anneals), got {k!r}")
    d = settings.discrepancy_decay
    if d is not None and (isinstance(d, bool) or not isinstance(d, (int, float)) or not 0 <= d < 1):
        raise TrainConfigError(f"--discrepancy-decay must be a number in [0, 1), got {d!r}")
    w = settings.sync_warmup
    if isinstance(w, bool) or not isinstance(w, int) or w < 0:
        raise TrainConfigError(f"--sync-warmup must be an integer >= 0, got {w!r}")
    if steps is not None and w > steps:
        raise TrainConfigError(f"--sync-warmup {w} is beyond the run: --steps is {steps}")
    if settings.weight_prediction and d is not None:
        raise TrainConfigError(
            "--weight-prediction and --discrepancy-decay exclude each other: prediction runs each forward on the weights "
            "its backward will see, correction each backward on its forward's"
        )
    return settings


def check_adaptable(schedule: str, chunks: int = 1) -> None:
    """Raise TrainConfigError unless --adaptive can run the job: a kfkb schedule (whose k it chooses) with one stage
    per process (`chunks`). Replicated stages and several pipeline copies adapt (every process switches at the same
    iteration); this is the one place that says why the others cannot."""
    interleaved = schedule.startswith("interleaved") or chunks != 1
    if interleaved:
        raise TrainConfigError(
            f"--adaptive regroups kfkb's k over one stage per process; schedule {schedule!r} interleaves "
            f"{chunks if chunks != 1 else 'several'} chunks (virtual stages) per process, over which kFkB is not "
            "defined (a group of k microbatches would have to pass every chunk of a process before the next group "
            "enters, which is another schedule); train a plan with one stage per process (chunks 1), or leave out --adaptive"
        )
    from pipeplan.schedules.registry import no_k_to_adapt

    refusal = no_k_to_adapt(schedule)
    if refusal is not None:
        raise TrainConfigError(refusal)


def check_async_precision(precision: str, schedule: str) -> None:
    """Raise TrainConfigError for fp16 on an asynchronous schedule: its loss scale skips whole steps on every rank
    at once (runtime.execution.loss_scale), which a schedule that steps inside itself has no place for."""
    if precision == "fp16":
        raise TrainConfigError(
            f"--precision fp16 scales the loss and skips overflowing steps on every rank; --schedule {schedule} steps "
            "inside its schedule: give --precision bf16 (no loss scale) or a synchronous schedule"
        )


def check_tensor_parallel_plan(plan: Plan, error: type[PipeplanError], where: str = "") -> None:
    """What the runtime runs of a 3D plan, from the plan alone: optimizer state sharded (zero 1) and gradients too
    (zero 2) on a synchronous schedule (an asynchronous one steps each stage's own optimizers inside itself); and
    tensor-parallel stages (sequence-parallel ones too) only on a synchronous schedule without an adaptive setting (the
    asynchronous and adaptive runs build their stages otherwise). `where` prefixes the message (e.g. the plan's file).

    Raises:
        error: one line naming the field and its value, and the way out.
    """
    if plan.zero and plan.schedule in ASYNCHRONOUS:
        raise error(f"{where}plan zero {plan.zero} and schedule {plan.schedule!r}: the runtime shards optimizer state "
                    "on a synchronous schedule; give the plan 1f1b, gpipe or kfkb, or zero 0")  # fmt: skip
    tp = next(((s, st) for s, st in enumerate(plan.stages) if st.tp > 1), None)
    if tp is None:
        return
    s, stage = tp
    if plan.schedule in ASYNCHRONOUS or plan.adaptive is not None:
        what = f"schedule {plan.schedule!r}" if plan.schedule in ASYNCHRONOUS else "an adaptive setting"
        raise error(f"{where}stage {s} has tp {stage.tp} and the plan {what}: the runtime runs tensor-parallel stages "
                    "on a synchronous schedule with a fixed k; give the plan 1f1b, gpipe or kfkb without adaptive")  # fmt: skip
