"""What to run: a Plan and its Schedule, from a plan file or from a schedule name (or file) and sizes."""

from __future__ import annotations

from dataclasses import dataclass, replace

from pipeplan.core.partition import split_evenly
from pipeplan.core.plan import Plan, Stage
from pipeplan.core.schedule import Schedule
from pipeplan.presets.resolve import load_schedule
from pipeplan.runtime.rank_errors import TrainConfigError
from pipeplan.schedules.registry import GENERATED


@dataclass(frozen=True, slots=True)
class ScheduleLayout:
    """A job given by schedule rather than plan: layers split evenly, `replicas[r]` copies of pipeline rank r.

    `name` is a schedule name, or a schedule file (`.csv` in
    torch.distributed.pipelining's compute-only format, or `.json`), whose
    ranks and stages then fix `stages` and `chunks`. Processes beyond one
    pipeline's devices form further pipeline replicas. The asynchronous
    `pipemare` covers the whole run in one schedule: `minibatches` (the
    run's steps) of `microbatches` each, the first `sync_minibatches` flushed;
    its plan then has minibatches x microbatches microbatches of
    global_batch / microbatches samples, one pipeline, no replicas.
    `file_schedule` is a schedule file's schedule as the launcher read it (`loaded`): no process reads the file again.
    """

    name: str
    stages: int
    microbatches: int
    global_batch: int
    k: int = 1
    chunks: int = 1
    replicas: tuple[int, ...] | None = None
    minibatches: int = 1
    sync_minibatches: int = 0
    file_schedule: Schedule | None = None

    def __post_init__(self) -> None:
        from pipeplan.runtime.options import check_global_batch

        check_global_batch(self.global_batch, "--batch-size")

    @property
    def asynchronous(self) -> bool:
        """True for a schedule that steps inside itself without a flush (pipemare)."""
        from pipeplan.schedules.registry import ASYNCHRONOUS

        return self.name in ASYNCHRONOUS

    @property
    def from_file(self) -> bool:
        """True when `name` is a schedule file (.csv or .json) rather than a schedule's name."""
        return self.name.lower().endswith((".csv", ".json"))

    def loaded(self) -> ScheduleLayout:
        """This layout with its schedule file read once, here (its schedule carried from now on).

        Raises:
            ScheduleError: a bad or missing file.
        """
        if not self.from_file or self.file_schedule is not None:
            return self
        return replace(self, file_schedule=self.schedule())

    def schedule(self) -> Schedule:
        """The schedule: generated from the name, or read from the file.

        Raises:
            ScheduleError: bad sizes or file, or a k or chunks the schedule does not take.
        """
        if self.file_schedule is not None:
            return self.file_schedule
        if self.asynchronous:
            from pipeplan.schedules.pipemare import pipemare
            from pipeplan.schedules.registry import check_schedule_options

            check_schedule_options(self.name, self.microbatches, self.k, self.chunks)
            return pipemare(self.stages, self.microbatches, self.minibatches, self.sync_minibatches)
        return load_schedule(self.name, self.stages, self.microbatches, k=self.k, chunks=self.chunks)

    def check(self, world_size: int) -> tuple[Schedule, tuple[int, ...], int]:
        """The schedule, the replicas per rank and the pipeline copies on `world_size` processes.

        Raises:
            ScheduleError: bad schedule name, sizes or file.
            TrainConfigError: a world size or batch size that does not divide.
        """
        schedule = self.schedule()
        ranks = schedule.num_ranks
        replicas = self.replicas or (1,) * ranks
        if self.asynchronous and (world_size != ranks or max(replicas) != 1):
            raise TrainConfigError(
                f"--schedule {self.name} runs one pipeline without replicas: it needs --stages {ranks} processes, got "
                f"{world_size}" + (f" and --replicas {list(replicas)}" if self.replicas else "")
            )
        if len(replicas) != ranks or min(replicas) < 1:
            raise TrainConfigError(f"--replicas needs {ranks} counts >= 1 (one per pipeline rank), got {list(replicas)}")
        per_pipeline = sum(replicas)
        if world_size % per_pipeline:
            raise TrainConfigError(
                f"{world_size} processes cannot hold whole pipelines of {per_pipeline} devices (replicas {list(replicas)})"
            )
        copies = world_size // per_pipeline
        m = self.microbatches if self.asynchronous else schedule.num_microbatches
        if self.global_batch % (copies * m):
            raise TrainConfigError(
                f"--batch-size {self.global_batch} must be a multiple of pipeline replicas x microbatches = {copies} x {m}"
            )
        return schedule, replicas, copies

    def build(self, num_layers: int, world_size: int) -> tuple[Plan, Schedule]:
        """The Plan and Schedule for a model of `num_layers` layers on `world_size` processes.

        Raises:
            TrainConfigError: too few layers, a world size or batch size that does not divide.
        """
        schedule, replicas, copies = self.check(world_size)
        ranks, num_stages, m = schedule.num_ranks, schedule.num_stages, schedule.num_microbatches
        if num_layers < num_stages:
            raise TrainConfigError(f"the model has {num_layers} layers, fewer than the {num_stages} stages to fill")
        devices: list[list[int]] = [[] for _ in range(ranks)]
        next_device = 0
        for _ in range(copies):
            for r in range(ranks):
                devices[r].extend(range(next_device, next_device + replicas[r]))
                next_device += replicas[r]
        bounds = split_evenly(num_layers, num_stages)
        stages = tuple(Stage(lo, hi - 1, tuple(devices[schedule.stage_to_rank[s]])) for s, (lo, hi) in enumerate(bounds))
        kind = schedule.name if schedule.name in GENERATED else "list"
        order = None if kind in GENERATED else schedule.ranks
        size = self.global_batch // (copies * (self.microbatches if self.asynchronous else m))
        plan = Plan(stages, copies, m, size, kind, k=self.k, chunks=num_stages // ranks, order=order)
        return plan, schedule
