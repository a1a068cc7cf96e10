"""The probe's calibration runs: the profiled model run by the real executor, to price what the runtime will do.

Three quantities of a cluster are measured this way (runtime.measurement.probe):
Each run is a few training steps as `pipeplan train` takes them (the
executor's iteration, the optimizer's step, the loss exchange).
- speed: every process runs the whole model as a data-parallel replica, all
  at once (as a job runs them), at three batch sizes of the profile; a
  process's speed is the profile's time of the forwards and backwards it
  ran over the time its executor spent in them (its compute spans);
- all-reduce: the same runs end with the runtime's gradient all-reduce of
  the whole model (runtime.execution.replicas: one bucket, flattened, summed, copied
  back); its time is what a step takes after its last backward;
- messages: straight GPipe and 1F1B pipelines over every process at the
  profile's smallest and middle batch sizes; the per-message overhead (time
  the consuming action spends) and latency (time the message takes to
  arrive) with which the simulator best predicts those runs.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time

import torch
import torch.distributed as dist

from pipeplan.core.hardware.cluster import Cluster
from pipeplan.core.model_source import model_to_build
from pipeplan.core.plan import Plan, Stage
from pipeplan.core.profile import ModelProfile
from pipeplan.core.units import ms_to_s, s_to_ms
from pipeplan.models.build import Model, build_model
from pipeplan.runtime.rank_errors import TrainConfigError


@dataclasses.dataclass(frozen=True, slots=True)
class Run:
    """One calibration plan as run: per step, each process's compute-span ms by op, and the step's tail after its
    last compute span (the all-reduce, in a data-parallel run); the slowest process's step ms."""

    plan: Plan
    compute_ms: tuple[dict[str, float], ...]
    tail_ms: float
    step_ms: float


def build_profiled_model(profile: ModelProfile, device: torch.device, module: str | None = None) -> Model:
    """The model the profile was measured on, built as `pipeplan profile` built it, on `device`.

    `module` is the MODULE_SPEC the user named (`--module`): a profile's recorded source is built without it only
    when it is a built-in name (core.model_source: a profile never chooses code to run).

    Raises:
        TrainConfigError: the profile records no source, code the user did not name, another model than `module`,
            or its model now has another number of layers.
    """
    if profile.source is None:
        raise TrainConfigError(
            f"--profile {profile.name!r} does not record its model (source); profile it with `pipeplan profile` "
            "or leave --profile out (every speed 1.0)"
        )
    source = profile.source
    spec = model_to_build(source, module, repr(profile.name), "--module")
    assert spec is not None
    model = build_model(spec, dict(source.options), source.dataset, source.dtype)
    if len(model.layers) != profile.num_layers:
        raise TrainConfigError(
            f"--profile {profile.name!r} has {profile.num_layers} layers but its model {source.module!r} now builds "
            f"{len(model.layers)}; profile it again"
        )
    for layer in model.layers:
        layer.to(device)
    return model


def run_plan(
    plan: Plan, model: Model, device: torch.device, steps: int, timeout_s: float, optimizer: str, precision: str = "full"
) -> Run:
    """Run `plan` as `pipeplan train` runs it, two warm-up steps and `steps` timed ones, its forwards under
    `precision`'s autocast (the profile's: a bf16 profile's speeds are bf16 steps'). A collective call.

    A step is the executor's iteration, the optimizer's step and the all-reduce of the loss that ends a training
    step (the optimizer streams every weight and its state through memory, so the next step's compute meets cold
    caches, as in training). Returns this process's compute per op, and the medians of the tail after the last
    compute span (before the optimizer) and of the slowest process's whole step.
    """
    from pipeplan.runtime.execution.executor import Executor
    from pipeplan.runtime.execution.optim import make_optimizer
    from pipeplan.runtime.placement import Topology
    from pipeplan.schedules.plan_schedule import plan_schedule

    topology = Topology(plan, plan_schedule(plan), dist.get_world_size())
    role = topology.roles[dist.get_rank()]
    executor = Executor(topology, role, model.layers, model.loss_fn, device, timeout_s, graph=model.graph,
                        precision=precision)  # fmt: skip
    rows = torch.arange(plan.global_batch) % len(model.dataset)
    inputs, targets = model.dataset.inputs[rows], model.dataset.targets[rows]
    params = executor.parameters()
    step_fn = make_optimizer(optimizer, params, 1e-12)
    compute: list[dict[str, float]] = []
    tails, totals = [], []
    dist.barrier()
    for step in range(steps + 2):
        t0 = time.perf_counter()
        record = executor.run(inputs, targets, record=True)
        end = time.perf_counter()
        step_fn.step()
        dist.all_reduce(torch.tensor([record.loss], dtype=torch.float64))
        done = time.perf_counter()
        if step < 2:
            continue
        ops: dict[str, float] = {}
        for span in record.compute:
            ops[span.op] = ops.get(span.op, 0.0) + s_to_ms(span.end_s - span.start_s)
        compute.append(ops)
        last = max((span.end_s for span in record.compute), default=t0)
        tails.append(s_to_ms(end - last))
        totals.append(s_to_ms(done - t0))
    slowest = torch.tensor([statistics.median(tails), statistics.median(totals)], dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return Run(plan, tuple(compute), float(slowest[0]), float(slowest[1]))


def data_parallel_plans(profile: ModelProfile, world: int) -> list[Plan]:
    """The whole model on every process as one data-parallel stage, 2 microbatches, at the profile's smallest,
    middle and largest batch size per process."""
    sizes = profile.sizes
    chosen = sorted({sizes[0], sizes[len(sizes) // 2], sizes[-1]})
    stage = Stage(0, profile.num_layers - 1, tuple(range(world)))
    return [Plan((stage,), 1, 2, x * world, "1f1b") for x in chosen]


def pipeline_plans(profile: ModelProfile, world: int) -> list[Plan]:
    """Straight pipelines over every process (layers split evenly), GPipe and 1F1B, m = world and 4 x world
    microbatches of the profile's smallest and of its middle batch size.

    Note:
        The two schedules tell the two message costs apart (fit_messages): GPipe sends its microbatches back to
        back, so a message's latency overlaps the next one's compute and mostly its overhead counts; 1F1B waits
        for every gradient in its steady state, so both count. The smallest size matters most: there a message is
        a large share of an action; at larger sizes it hides in the noise of the compute (a transformer calibrated
        at its middle size alone fitted no overhead and then under-predicted its 1-sample microbatches by a third).
    """
    from pipeplan.core.partition import split_evenly

    stages = tuple(Stage(lo, hi - 1, (d,)) for d, (lo, hi) in enumerate(split_evenly(profile.num_layers, world)))
    sizes = dict.fromkeys((profile.sizes[0], profile.sizes[len(profile.sizes) // 2]))
    return [Plan(stages, 1, m, b, schedule) for schedule in ("gpipe", "1f1b") for b in sizes for m in (world, 4 * world)]


def speed_of(profile: ModelProfile, runs: list[Run]) -> float:
    """This process's speed: the profile's forward and backward time of what a step ran over its compute spans'
    time, the median over every step of every run (as a training run's step is the median of its steps, so one step
    slowed by a neighbour on a shared machine does not carry into every prediction made with the probe)."""
    from pipeplan.sim.cost.layers import LayerCosts

    costs = LayerCosts(profile, "auto", "adam")
    ratios = []
    for run in runs:
        plan = run.plan
        work = costs.stage(range(profile.num_layers), plan.microbatch_size, plan.replicas_of(0))
        for ops in run.compute_ms:
            mine = ops.get("F", 0.0) + ops.get("B", 0.0)
            if mine > 0:
                ratios.append(plan.microbatches * (work.fwd_ms + work.bwd_ms) / mine)
    return statistics.median(ratios) if ratios else 1.0


def allreduce_of(runs: list[Run], param_bytes: float, world: int, latency_s: float) -> float:
    """The all-reduce's bus bandwidth (bytes/s) from the data-parallel runs' tails, the per-step latency given."""
    tail_s = ms_to_s(statistics.median(run.tail_ms for run in runs))
    steps = 2 * (world - 1)
    moving = max(tail_s - steps * latency_s, 1e-6)
    return steps / world * param_bytes / moving


MESSAGE_GRID_MS = tuple(i * 0.25 for i in range(21))
"""The coarse grid of fit_messages (0 to 5 ms in 250 us steps, for each of the two costs); it then refines by 25 us."""


def fit_messages(
    profile: ModelProfile, cluster: Cluster, runs: list[Run], optimizer: str, with_latency: bool = True
) -> tuple[float, float]:
    """The (overhead ms, latency ms) of a stage-to-stage message with which the simulator best predicts the pipeline
    runs' whole steps: least squares of the log ratio, on a grid and then on a finer one around its best point
    (ties: the smaller values, so the fit is deterministic). Without `with_latency` only the overhead is fitted
    (latency 0): the one-cost model, kept to compare the two on the same runs."""
    from pipeplan.schedules.plan_schedule import plan_schedule
    from pipeplan.sim.cost.model import CostModel
    from pipeplan.sim.cost.plan_costs import plan_costs
    from pipeplan.sim.engine.simulator import simulate

    schedules = [plan_schedule(run.plan) for run in runs]

    def error(point: tuple[float, float]) -> float:
        overhead, latency = point
        priced = dataclasses.replace(cluster, message_overhead_ms=overhead, message_latency_ms=latency)
        model = CostModel.build(profile, priced, optimizer=optimizer)
        total = 0.0
        for run, schedule in zip(runs, schedules, strict=True):
            predicted = simulate(schedule, plan_costs(run.plan, model), record=False).iteration_time
            total += math.log(predicted / run.step_ms) ** 2
        return total

    def best(grid_a: list[float], grid_b: list[float]) -> tuple[float, float]:
        return min(((a, b) for a in grid_a for b in grid_b), key=lambda point: (error(point), point))

    latencies = list(MESSAGE_GRID_MS) if with_latency else [0.0]
    overhead, latency = best(list(MESSAGE_GRID_MS), latencies)

    def around(x: float) -> list[float]:
        return [x + i * 0.025 for i in range(-10, 11) if x + i * 0.025 >= 0]

    return best(around(overhead), around(latency) if with_latency else [0.0])
