"""The checks of a training job's options, in one place: `train` runs them before any process starts and
`TrainConfig` on every process (no torch here, so the launcher fails fast)."""

from __future__ import annotations

import math

from pipeplan.runtime.errors import TrainConfigError

OPTIMIZERS = ("adam", "sgd")
DTYPES = ("float32", "float64")


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
) -> None:
    """Raise TrainConfigError naming the first option (as its flag) with a value a job cannot run with."""
    lower = {"--steps": (steps, 1), "--threads": (threads, 1), "--warmup-steps": (warmup_steps, 0),
             "--checkpoint-every": (checkpoint_every, 0), "--keep-last": (keep_last, 0)}  # fmt: skip
    for flag, (value, least) in lower.items():
        if value < least:
            raise TrainConfigError(f"{flag} must be >= {least}, got {value}")
    if not math.isfinite(lr) or lr < 0:
        raise TrainConfigError(f"--lr must be a finite number >= 0 (0 trains nothing), got {lr}")
    if not math.isfinite(timeout_s) or timeout_s <= 0:
        raise TrainConfigError(f"--timeout must be a finite number of seconds > 0, got {timeout_s}")
    if optimizer not in OPTIMIZERS:
        raise TrainConfigError(f"--optimizer must be {' or '.join(OPTIMIZERS)}, got {optimizer!r}")
    if dtype not in DTYPES:
        raise TrainConfigError(f"--dtype must be {' or '.join(DTYPES)}, got {dtype!r}")
    if (checkpoint_every or resume) and not checkpoint_dir:
        raise TrainConfigError("--checkpoint-every and --resume need --checkpoint-dir")
