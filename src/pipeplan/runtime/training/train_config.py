"""What a training job is given and what it reports: TrainConfig (identical on every process) and TrainReport."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from pipeplan.core.hardware.cluster import Cluster
from pipeplan.core.plan import Plan
from pipeplan.core.profile import ModelProfile
from pipeplan.core.schedule import Schedule
from pipeplan.core.validate import validate
from pipeplan.models.build import Model
from pipeplan.runtime.execution.evaluate import EvalResult
from pipeplan.runtime.execution.job import ScheduleLayout
from pipeplan.runtime.execution.optim import RateSchedule
from pipeplan.runtime.execution.shared_grads import SharedCopies
from pipeplan.runtime.measurement.prediction import PlanPrediction
from pipeplan.runtime.options import (
    AsyncSettings,
    check_async_precision,
    check_async_settings,
    check_global_batch,
    check_seed,
    check_train_options,
)
from pipeplan.runtime.rank_errors import TrainConfigError
from pipeplan.runtime.transport.network import NetworkSettings
from pipeplan.schedules.plan_schedule import plan_schedule
from pipeplan.sim.cost.plan_costs import layer_span
from pipeplan.sim.result import SimResult


@dataclass(frozen=True)
class TrainConfig:
    """Everything one training job needs besides the process group (identical on every process)."""

    plan: Plan | None = None
    plan_path: str | None = None
    schedule: Schedule | None = None
    layout: ScheduleLayout | None = None
    module: str = "mlp"
    module_options: tuple[tuple[str, object], ...] = ()
    dataset: str = "auto"
    dtype: str = "float32"
    precision: str = "full"
    steps: int = 10
    lr: float = 1e-3
    lr_schedule: str = "constant"
    optimizer: str = "adam"
    seed: int = 0
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0
    keep_last: int = 0
    resume: bool = False
    timeout_s: float = 300.0
    lookahead: int = 2
    timeline: bool = False
    """--timeline or --png: the last iteration's measured timeline recorded (on process 0)."""
    threads: int = 1
    save_grads: str | None = None
    predict: bool = False
    backend: str | None = None
    profile: str | None = None
    cluster: str | None = None
    profile_value: ModelProfile | None = None
    """The profile `profile` names, as the launcher read it (`loaded`): no process reads the file again."""
    cluster_value: Cluster | None = None
    """The cluster `cluster` names, as the launcher read it (`loaded`)."""
    batch_scaling: str = "auto"
    warmup_steps: int = 2
    asynchronous: AsyncSettings | None = None
    evaluate: bool = False
    epochs: int = 0
    network: NetworkSettings | None = None
    adaptive: bool = False
    memory_budget_bytes: float | None = None
    """--adaptive: the most any process may hold at any k (--memory-budget, or the plan's adaptive setting); None: its
    device's memory (the plan's cluster), else this host's memory per process."""
    allreduce_bucket_bytes: float | None = None
    """--allreduce-bucket-mb in bytes: replicated stages all-reduce their gradients in buckets of this size during
    their last backward, as PyTorch DDP (runtime.execution.replicas), and the prediction prices them so; None: in
    one flat bucket after it."""
    data: str | None = None
    loss: str | None = None
    eval_fraction: float = 0.0

    def build(self) -> Model:
        """This job's model: --module with its options, its data (--dataset, or --data with --eval-fraction), its loss
        (--loss, else the spec's), dtype and seed (models.build.build_model)."""
        from pipeplan.models.build import build_model

        return build_model(self.module, dict(self.module_options), self.dataset, self.dtype, self.seed, data=self.data,
                           loss=self.loss, eval_fraction=self.eval_fraction)  # fmt: skip

    def total_steps(self, train_samples: int, global_batch: int) -> int:
        """The run's steps: --steps, or --epochs x the steps of one epoch (the whole batches in the training split)."""
        return self.epochs * self.steps_per_epoch(train_samples, global_batch) if self.epochs else self.steps

    @staticmethod
    def steps_per_epoch(train_samples: int, global_batch: int) -> int:
        """Whole global batches in one pass over the training split (at least 1)."""
        return max(1, train_samples // global_batch)

    def rates(self, total: int) -> RateSchedule:
        """The base learning rate of each of the run's `total` steps (--lr, --lr-schedule)."""
        return RateSchedule(self.lr, self.lr_schedule, total)

    def loaded(self) -> TrainConfig:
        """This config with every file it names read once, here (the launcher): the profile and cluster of a
        prediction, the emulated links' cluster and bandwidth trace, a schedule file; their values travel with it
        (config_json), so that no worker opens a user's file.

        Raises:
            ProfileError, ClusterError, CostError, ScheduleError: a file that does not read (naming it).
        """
        from pipeplan.presets.resolve import load_cluster, load_profile

        profile, cluster = self.profile_value, self.cluster_value
        return replace(
            self,
            profile_value=load_profile(self.profile) if profile is None and self.profile is not None else profile,
            cluster_value=load_cluster(self.cluster) if cluster is None and self.cluster is not None else cluster,
            layout=None if self.layout is None else self.layout.loaded(),
            network=None if self.network is None else self.network.loaded(),
        )

    def read_profile(self) -> ModelProfile:
        """The prediction's profile: as the launcher read it, else from `profile` (a config not `loaded`)."""
        from pipeplan.presets.resolve import load_profile

        assert self.profile is not None or self.profile_value is not None
        return self.profile_value if self.profile_value is not None else load_profile(str(self.profile))

    def read_cluster(self) -> Cluster:
        """The prediction's cluster: as the launcher read it, else from `cluster` (a config not `loaded`)."""
        from pipeplan.presets.resolve import load_cluster

        assert self.cluster is not None or self.cluster_value is not None
        return self.cluster_value if self.cluster_value is not None else load_cluster(str(self.cluster))

    def __post_init__(self) -> None:
        if (self.plan is None) == (self.layout is None):
            raise TrainConfigError("give either a plan (--plan) or a schedule (--schedule), not both or neither")
        check_train_options(steps=self.steps, lr=self.lr, optimizer=self.optimizer, dtype=self.dtype, threads=self.threads,
                            timeout_s=self.timeout_s, warmup_steps=self.warmup_steps,
                            checkpoint_every=self.checkpoint_every, keep_last=self.keep_last,
                            checkpoint_dir=self.checkpoint_dir, resume=self.resume,
                            lr_schedule=self.lr_schedule, batch_scaling=self.batch_scaling,
                            backend=self.backend, precision=self.precision)  # fmt: skip
        check_seed(self.seed)
        if self.plan is not None:
            check_global_batch(self.plan.global_batch, f"plan {self.plan_path or ''} global batch".replace("  ", " "))
        if self.lookahead < 0:
            raise TrainConfigError(f"lookahead must be >= 0, got {self.lookahead}")
        if self.asynchronous is not None and not self.epochs:
            check_async_settings(self.asynchronous, self.steps)
        if self.layout is not None and self.layout.asynchronous:
            check_async_precision(self.precision, self.layout.name)

    def resolve(self, num_layers: int, world_size: int) -> tuple[Plan, Schedule]:
        """The plan and schedule this job runs for a model of `num_layers` layers on `world_size` processes."""
        if self.layout is not None:
            return self.layout.build(num_layers, world_size)
        assert self.plan is not None
        if self.plan.num_layers != num_layers:
            options = ", ".join(f"{key}={value}" for key, value in self.module_options) or "none"
            n = self.plan.num_layers
            why = (
                f"{layer_span(n, num_layers - 1)} would be in no stage (the plan leaves them out, or the plan was made "
                "for another model)"
                if n < num_layers
                else f"its stages name {layer_span(num_layers, n - 1)}, which the model does not have (the plan was made "
                "for another model)"
            )
            raise TrainConfigError(
                f"plan {self.plan_path or ''} covers {n} layers but --module {self.module} (options {options}) with "
                f"--dataset {self.dataset} builds {num_layers}: {why}; give the --module, --opt and --dataset its profile "
                "was measured with"
            )
        if self.schedule is not None:
            return self.plan, self.schedule
        return self.plan, validate(plan_schedule(self.plan))  # a plan file's schedule: from its fields or its order

    def fingerprint(self, plan: Plan, schedule: Schedule, world_size: int) -> dict[str, Any]:
        """What must match for a checkpoint to be resumed by this job (a graph's plan: its layer order too)."""
        order = {} if plan.layer_order is None else {"layer_order": list(plan.layer_order)}
        return {
            **order,
            "world_size": world_size,
            "stages": [(s.first_layer, s.last_layer, list(s.devices)) for s in plan.stages],
            "schedule": [[str(a) for a in rank] for rank in schedule.ranks],
            "global_batch": plan.global_batch,
            "module": self.module,
            "module_options": sorted((k, str(v)) for k, v in self.module_options),
            "dataset": self.dataset,
            "dtype": self.dtype,
            "optimizer": self.optimizer,
            "seed": self.seed,
            **{key: value for key, value in (("data", self.data), ("loss", self.loss)) if value is not None},
            **({"eval_fraction": self.eval_fraction} if self.eval_fraction else {}),
        }


@dataclass
class TrainReport:
    """What process 0 knows at the end: losses, per-iteration times, the measured timeline."""

    start_step: int
    losses: list[float] = field(default_factory=list)
    pipeline_ms: list[float] = field(default_factory=list)
    optimizer_ms: list[float] = field(default_factory=list)
    optimizer_ms_by_process: list[list[float]] = field(default_factory=list)  # per step, process 0 first
    step_ms: list[float] = field(default_factory=list)
    timeline: SimResult | None = None
    predicted: SimResult | None = None
    plan_prediction: PlanPrediction | None = None
    warmup_steps: int = 2
    memory_bytes: list[int] | None = None
    evals: list[EvalResult] = field(default_factory=list)
    delays: list[int] | None = None
    samples_per_s: float | None = None
    link: tuple[float, float] | None = None
    adaptive: dict[str, Any] | None = None
    loss_scale: float | None = None
    """fp16: the loss scale after the last step."""
    skipped_steps: list[int] = field(default_factory=list)
    """fp16: the steps skipped on every rank for an overflow (0-based, of this run)."""
    model: Model | None = None
    plan: Plan | None = None
    schedule: Schedule | None = None
    shared: list[SharedCopies] = field(default_factory=list)
    """The shared parameters (tied weights) the plan splits over stages: their gradients exchanged every iteration."""
    allreduce: list[dict[str, Any]] | None = None
    """On an emulated network: each replicated stage's all-reduce, measured (runtime.measurement.allreduces)."""

    def measured_ms(self) -> float | None:
        """Median pipeline time per iteration, leaving out the first iteration (warm-up) when there are more."""
        times = self.pipeline_ms[1:] if len(self.pipeline_ms) > 1 else self.pipeline_ms
        return statistics.median(times) if times else None

    def measured_step_ms(self) -> float | None:
        """Median whole step (pipeline, optimizer, the loss exchange that ends it) after the warm-up steps."""
        skip = min(self.warmup_steps, max(0, len(self.step_ms) - 1))
        times = self.step_ms[skip:]
        return statistics.median(times) if times else None


StepCallback = Callable[[int, float, float, float], None]
"""on_step(step, loss, pipeline_ms, optimizer_ms), called on process 0 after every iteration."""
