"""One process of a training job: join the group, build its stages, run the iterations, checkpoint, report."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from pipeplan.core.plan import Plan
from pipeplan.core.schedule import Schedule
from pipeplan.core.validate import validate
from pipeplan.profiler.allocator import steady_cpu_allocator
from pipeplan.profiler.datasets import batch_indices
from pipeplan.profiler.model import Model, build_model
from pipeplan.runtime import checkpoint
from pipeplan.runtime.errors import TrainConfigError
from pipeplan.runtime.evaluate import EvalResult, evaluation
from pipeplan.runtime.executor import Executor
from pipeplan.runtime.job import ScheduleLayout
from pipeplan.runtime.memory_meter import SavedMemoryMeter, static_bytes
from pipeplan.runtime.optim import make_optimizer
from pipeplan.runtime.options import AsyncSettings, check_async_settings, check_train_options
from pipeplan.runtime.predict import (
    PlanPrediction,
    local_cluster,
    measure_link,
    median_profile,
    plan_on_processes,
    predict,
    predict_plan,
    profile_stages,
)
from pipeplan.runtime.timeline import build_result, gather_parts, local_part
from pipeplan.runtime.topology import Role, Topology
from pipeplan.schedules.plan_schedule import plan_schedule
from pipeplan.sim.result import SimResult

PROFILE_REPEATS = 7


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
    steps: int = 10
    lr: float = 1e-3
    optimizer: str = "adam"
    seed: int = 0
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0
    keep_last: int = 0
    resume: bool = False
    timeout_s: float = 300.0
    lookahead: int = 2
    trace: bool = False
    threads: int = 1
    save_grads: str | None = None
    predict: bool = False
    backend: str | None = None
    profile: str | None = None
    cluster: str | None = None
    batch_scaling: str = "auto"
    warmup_steps: int = 2
    asynchronous: AsyncSettings | None = None
    evaluate: bool = False
    epochs: int = 0

    def total_steps(self, train_samples: int, global_batch: int) -> int:
        """The run's steps: --steps, or --epochs x the steps of one epoch (the whole batches in the training split)."""
        return self.epochs * self.steps_per_epoch(train_samples, global_batch) if self.epochs else self.steps

    @staticmethod
    def steps_per_epoch(train_samples: int, global_batch: int) -> int:
        """Whole global batches in one pass over the training split (at least 1)."""
        return max(1, train_samples // global_batch)

    def __post_init__(self) -> None:
        if (self.plan is None) == (self.layout is None):
            raise TrainConfigError("give either a plan (--plan) or a schedule (--schedule), not both or neither")
        check_train_options(steps=self.steps, lr=self.lr, optimizer=self.optimizer, dtype=self.dtype, threads=self.threads,
                            timeout_s=self.timeout_s, warmup_steps=self.warmup_steps,
                            checkpoint_every=self.checkpoint_every, keep_last=self.keep_last,
                            checkpoint_dir=self.checkpoint_dir, resume=self.resume)  # fmt: skip
        if self.lookahead < 0:
            raise TrainConfigError(f"lookahead must be >= 0, got {self.lookahead}")
        if self.asynchronous is not None and not self.epochs:
            check_async_settings(self.asynchronous, self.steps)

    def resolve(self, num_layers: int, world_size: int) -> tuple[Plan, Schedule]:
        """The plan and schedule this job runs for a model of `num_layers` layers on `world_size` processes."""
        if self.layout is not None:
            return self.layout.build(num_layers, world_size)
        assert self.plan is not None
        if self.plan.num_layers != num_layers:
            options = ", ".join(f"{key}={value}" for key, value in self.module_options) or "none"
            raise TrainConfigError(
                f"plan {self.plan_path or ''} covers {self.plan.num_layers} layers but --module {self.module} (options "
                f"{options}) with --dataset {self.dataset} builds {num_layers}: the plan was made for another model; "
                "give the --module, --opt and --dataset its profile was measured with"
            )
        if self.schedule is not None:
            return self.plan, self.schedule
        return self.plan, validate(plan_schedule(self.plan))  # a plan file's schedule: from its fields or its order

    def fingerprint(self, plan: Plan, schedule: Schedule, world_size: int) -> dict[str, Any]:
        """What must match for a checkpoint to be resumed by this job."""
        return {
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
    model: Model | None = None
    plan: Plan | None = None
    schedule: Schedule | None = None

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


def init_distributed(backend: str | None, timeout_s: float) -> tuple[int, int, torch.device]:
    """Join the process group torchrun (or --local) set up; return (rank, world size, device).

    Raises:
        TrainConfigError: not started by torchrun or --local.
    """
    if not dist.is_initialized():
        missing = [v for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if v not in os.environ]
        if missing:
            raise TrainConfigError(f"pipeplan train must run under torchrun or with --local N (missing {', '.join(missing)})")
        chosen = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        if chosen == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(chosen, timeout=timedelta(seconds=timeout_s))
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    return rank, world, device


def train(
    config: TrainConfig, on_step: StepCallback | None = None, on_note: Callable[[str], None] | None = None
) -> TrainReport | None:
    """Run the job on this process; return the report on process 0, None elsewhere.

    `on_step` and `on_note` (a line for the user, e.g. a checkpoint written) are called on process 0 only.

    Raises:
        RuntimeFault: an action failed here or on a peer (naming rank, step and action).
        TrainConfigError: inconsistent options.
    """
    steady_cpu_allocator()  # the allocator the profile was measured with (profiler.allocator)
    torch.set_num_threads(config.threads)
    rank, world, device = init_distributed(config.backend, config.timeout_s)
    model = build_model(config.module, dict(config.module_options), config.dataset, config.dtype, config.seed)
    if config.evaluate and model.dataset.test_inputs is None:
        raise TrainConfigError(f"--eval needs a dataset with a held-out split (digits, pysource); {model.dataset.name} has none")
    if config.layout is not None and config.layout.asynchronous:
        from pipeplan.runtime.asynchronous import train_asynchronous

        torch.manual_seed(config.seed * 7919 + rank)
        return train_asynchronous(config, model, rank, world, device, on_step)
    plan, schedule = config.resolve(len(model.layers), world)
    topology = Topology(plan, schedule, world)
    role = topology.roles[rank]
    torch.manual_seed(config.seed * 7919 + rank)
    executor = Executor(topology, role, model.layers, model.loss_fn, device, config.timeout_s, config.lookahead)
    params = executor.parameters()
    optimizer = make_optimizer(config.optimizer, params, config.lr)
    root = Path(config.checkpoint_dir) if config.checkpoint_dir else None
    fingerprint = config.fingerprint(plan, schedule, world)
    start = 0
    if config.resume and root is not None:
        resumed = _collective(lambda: checkpoint.load_rank(root, rank, executor.modules(), optimizer, fingerprint), world)
        start = resumed.step if resumed is not None else 0
        executor.step_index = start
    report = TrainReport(start_step=start, model=model, plan=plan, schedule=schedule, warmup_steps=config.warmup_steps)
    if rank == 0 and config.plan is not None and config.profile is not None and config.cluster is not None:
        report.plan_prediction = _plan_prediction(config, plan, model)  # made before the first step
    data = model.dataset
    global_batch = plan.global_batch
    total = config.total_steps(len(data), global_batch)
    per_epoch = config.steps_per_epoch(len(data), global_batch)
    last_part: dict[str, Any] | None = None
    began = time.perf_counter()
    for step in range(start, total):
        idx = batch_indices(len(data), global_batch, step, config.seed)
        inputs, targets = data.inputs[idx], data.targets[idx]
        record = config.trace and step == total - 1
        if record:
            dist.barrier()
        meter = SavedMemoryMeter(exclude=params) if step == start else None  # the first step is warm-up anyway
        t0 = time.perf_counter()
        result = executor.run(inputs, targets, record=record, meter=meter)
        t1 = time.perf_counter()
        optimizer.step()
        t2 = time.perf_counter()
        if meter is not None:
            memory = static_bytes(params, optimizer) + meter.peak_bytes
        if record:
            last_part = local_part(result, t0, t1)
        shared = torch.zeros(1 + world, dtype=torch.float64)  # the loss and every process's optimizer ms, one all-reduce
        shared[0], shared[1 + rank] = result.loss, (t2 - t1) * 1000.0
        dist.all_reduce(shared)
        loss = shared[0]
        t3 = time.perf_counter()
        if rank == 0:
            report.step_ms.append((t3 - t0) * 1000.0)
            report.losses.append(float(loss))
            report.pipeline_ms.append((t1 - t0) * 1000.0)
            report.optimizer_ms.append((t2 - t1) * 1000.0)
            report.optimizer_ms_by_process.append(shared[1:].tolist())
            if on_step is not None:
                on_step(step, float(loss), (t1 - t0) * 1000.0, (t2 - t1) * 1000.0)
        done = step + 1
        if root is not None and config.checkpoint_every and done % config.checkpoint_every == 0:
            checkpoint.save_rank(root, done, rank, executor.modules(), optimizer, done * global_batch, fingerprint)
            dist.barrier()
            if rank == 0:
                removed = checkpoint.mark_latest(root, done, config.keep_last)
                if on_note is not None:
                    gone = f"; removed {len(removed)} older (--keep-last {config.keep_last})" if removed else ""
                    on_note(f"wrote checkpoint {checkpoint.step_dir(root, done)}{gone}")
        if config.evaluate and (done % per_epoch == 0 or done == total):
            own = executor.modules() if role.replica == 0 and role.pipeline_replica == 0 else {}
            scored = evaluation(model, plan, own, device, done, per_epoch, began)
            if scored is not None:
                report.evals.append(scored)
    if total > start:
        everyone: list[int] | None = [0] * world if rank == 0 else None
        dist.gather_object(memory, everyone, dst=0)
        report.memory_bytes = everyone
    if config.save_grads:
        _save_grads(Path(config.save_grads), rank, executor, plan)
    if last_part is not None:
        parts = gather_parts(last_part)
        if parts is not None:
            report.timeline = build_result(parts, topology.num_stages, schedule.name)
    if config.predict:
        _predict(report, plan, schedule, model, device, role, world)
    return report if rank == 0 else None


def _collective(load: Callable[[], Any], world: int) -> Any:
    """Run `load` on every process; when it fails on any, raise the first failure's TrainConfigError on all of them.

    A corrupt checkpoint file on one rank would otherwise end that rank alone and leave its peers with a
    transport error that does not name the file.
    """
    error: str | None = None
    result = None
    try:
        result = load()
    except TrainConfigError as exc:
        error = f"rank {dist.get_rank()}: {exc}"
    errors: list[str | None] = [None] * world
    dist.all_gather_object(errors, error)
    first = next((e for e in errors if e is not None), None)
    if first is not None:
        raise TrainConfigError(first)
    return result


def _plan_prediction(config: TrainConfig, plan: Plan, model: Model) -> PlanPrediction:
    """The plan simulated with its profile and cluster (runtime.predict.predict_plan), checked against the model run.

    Raises:
        TrainConfigError: the profile's layers are not the model's (another MODULE_SPEC, options or dataset).
    """
    from pipeplan.io.load import load_cluster, load_profile

    assert config.profile is not None and config.cluster is not None
    profile = load_profile(config.profile)
    if profile.num_layers != len(model.layers):
        raise TrainConfigError(
            f"profile {config.profile} has {profile.num_layers} layers but --module {config.module} with --dataset "
            f"{model.dataset.name} builds {len(model.layers)}: the plan was made for another model"
        )
    return predict_plan(plan, profile, load_cluster(config.cluster), config.optimizer, config.batch_scaling,
                        (config.profile, config.cluster))  # fmt: skip


def _predict(
    report: TrainReport, plan: Plan, schedule: Schedule, model: Model, device: torch.device, role: Role, world: int
) -> None:
    """Profile every stage where it runs, measure the link, simulate: report.predicted on process 0."""
    latency, bandwidth = measure_link(device)
    owned = role.stages if role.replica == 0 and role.pipeline_replica == 0 else ()
    # fresh copies each time (one untimed round so gradients accumulate, one timed), medians over repetitions:
    # closer to a training iteration than many rounds in a tight loop, whose caches and allocator stay warm.
    profiles = [profile_stages(model.layers, model.dataset.inputs, plan, owned, runs=1, warmup=1) for _ in range(PROFILE_REPEATS)]
    if profiles[0] is not None:
        profile = median_profile([p for p in profiles if p is not None])
        report.link = (latency, bandwidth)
        report.predicted = predict(plan_on_processes(plan), schedule, profile, local_cluster(world, latency, bandwidth))
    dist.barrier()


def _save_grads(root: Path, rank: int, executor: Executor, plan: Plan) -> None:
    """Write this process's gradients of the last iteration, keyed `{global layer}.{parameter name}`."""
    root.mkdir(parents=True, exist_ok=True)
    grads: dict[str, torch.Tensor] = {}
    for s, module in executor.modules().items():
        for name, p in module.named_parameters():
            local, _, rest = name.partition(".")
            layer = plan.stages[s].first_layer + int(local)
            grads[f"{layer}.{rest}"] = p.grad.detach().cpu() if p.grad is not None else torch.zeros_like(p).cpu()
    torch.save(grads, root / f"grads-rank-{rank}.pt")
