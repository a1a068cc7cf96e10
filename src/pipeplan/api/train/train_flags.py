"""`pipeplan train`'s options as given (TrainFlags: the CLI's flags, JSON values the --local launcher hands its
workers), and the files they name, declared and guarded once (TRAIN_FILES, check_train_files)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pipeplan.api.outputs import CommandFiles, check_declared
from pipeplan.core.errors import TrainConfigError
from pipeplan.io.file_kinds import FOLDER, GRADS_FOLDER, PERFETTO, PNG

TRAIN_FILES = CommandFiles(
    inputs=("--plan", "--schedule", "--profile", "--cluster", "--bandwidth-trace"),
    outputs={"--timeline": PERFETTO, "--png": PNG, "--save-grads": GRADS_FOLDER, "--checkpoint-dir": FOLDER},
    plans=("--plan",),
    modules=("--module", "--data", "--loss"),
)
"""The files `train` reads and writes, each by its flag (cli.file_options lists them with every command's)."""


@dataclass(frozen=True)
class TrainFlags:
    """The values of `pipeplan train`'s options (the CLI's flags, by the same names; docs/cli.md): JSON values only,
    so the --local launcher hands them to its workers as one JSON object (to_json, from_json)."""

    plan: str | None = None
    schedule: str | None = None
    lr_reschedule: int | None = None
    discrepancy_decay: float | None = None
    sync_warmup: int = 0
    weight_prediction: bool = False
    stages: int | None = None
    microbatches: int | None = None
    k: int | None = None
    chunks: int | None = None
    replicas: str | None = None
    module: str | None = None
    options: list[str] | None = None
    dataset: str = "auto"
    data: str | None = None
    loss: str | None = None
    eval_fraction: float = 0.0
    dtype: str = "float32"
    precision: str = "full"
    batch_size: int | None = None
    steps: int | None = None
    epochs: int | None = None
    evaluate: bool = False
    lr: float = 0.001
    lr_schedule: str = "constant"
    optimizer: str = "adam"
    seed: int = 0
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0
    keep_last: int = 0
    resume: bool = False
    timeline: str | None = None
    timeline_option: str = "--timeline"
    """The name `timeline` was given by (`--trace`: its old name), said in the guard's and the writer's messages."""
    png: str | None = None
    predict: bool = False
    profile: str | None = None
    cluster: str | None = None
    batch_scaling: str = "auto"
    warmup_steps: int = 2
    timeout: float = 300.0
    threads: int = 1
    bandwidth_trace: str | None = None
    emulate_gb_per_s: float | None = None
    adaptive: bool = False
    memory_budget: str | None = None
    allreduce_bucket_mb: float | None = None
    local: int | None = None
    backend: str | None = None
    save_grads: str | None = None
    as_json: bool = False
    quiet: bool = False

    def to_json(self) -> dict[str, Any]:
        """These values as one JSON object (every field by its name)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> TrainFlags:
        """The flags `to_json` gave (--opt's list back from a JSON array).

        Raises:
            TrainConfigError: a key that names no field.
        """
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(obj) - names)
        if unknown:
            raise TrainConfigError(f"train's flags have no field {unknown[0]!r}")
        return cls(**dict(obj))


def check_train_files(flags: TrainFlags, plan_names: dict[str, str] | None = None) -> None:
    """The output guard of a train job (api.outputs.check_declared over TRAIN_FILES): its outputs against its inputs,
    before any work. `plan_names`: what --plan names as the launcher read it (api.train.train_inputs; {}: it could
    not be read), so the guard does not read it again.

    Raises:
        OutputError: naming the flag, the path and what is wrong.
    """
    read = None if plan_names is None else {"--plan": plan_names}
    declared = (*TRAIN_FILES.inputs, *TRAIN_FILES.outputs, *TRAIN_FILES.modules)
    values = {flag: getattr(flags, flag[2:].replace("-", "_")) for flag in declared}
    if flags.timeline_option != "--timeline":  # named as given
        values[flags.timeline_option] = values.pop("--timeline")
        outputs = {flags.timeline_option if flag == "--timeline" else flag: kind for flag, kind in TRAIN_FILES.outputs.items()}
        check_declared(dataclasses.replace(TRAIN_FILES, outputs=outputs), values, read)
        return
    check_declared(TRAIN_FILES, values, read)
