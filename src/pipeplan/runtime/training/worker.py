"""One process of a training job: join the group, build its stages, run the iterations, checkpoint, report."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from pipeplan.core.errors import OutputError
from pipeplan.core.plan import Plan
from pipeplan.core.schedule import Schedule
from pipeplan.models.allocator import steady_cpu_allocator
from pipeplan.models.autocast import autocast
from pipeplan.models.build import Model
from pipeplan.models.zoo.datasets import batch_indices, eval_without_split
from pipeplan.runtime.execution.distributed_pipeline import DistributedPipeline
from pipeplan.runtime.execution.evaluate import evaluation
from pipeplan.runtime.execution.executor import Executor
from pipeplan.runtime.execution.loss_scale import LossScaler
from pipeplan.runtime.execution.memory_meter import SavedMemoryMeter, static_bytes
from pipeplan.runtime.execution.optim import make_optimizer
from pipeplan.runtime.execution.sharded_state import plan_optimizer
from pipeplan.runtime.execution.shared_grads import shared_copies
from pipeplan.runtime.measurement.allreduces import gather_allreduces, span_row
from pipeplan.runtime.measurement.prediction import (
    TRAIN_OPTIMIZERS,
    PlanPrediction,
    local_cluster,
    measure_link,
    median_profile,
    plan_on_processes,
    predict,
    predict_plan,
    profile_stages,
)
from pipeplan.runtime.measurement.timeline import build_result, gather_parts, local_part
from pipeplan.runtime.placement import Role, Topology
from pipeplan.runtime.rank_errors import TrainConfigError
from pipeplan.runtime.state import checkpoint
from pipeplan.runtime.state.faults import overflow_at
from pipeplan.runtime.training.adaptive import AdaptiveK
from pipeplan.runtime.training.agreement import agree
from pipeplan.runtime.training.train_config import StepCallback, TrainConfig, TrainReport
from pipeplan.runtime.transport.exchange import all_gather_json, gather_json
from pipeplan.runtime.transport.link_emulation import Wire
from pipeplan.runtime.transport.network import make_wire, shared_origin
from pipeplan.runtime.transport.process_group import init_distributed

PROFILE_REPEATS = 7


def train(
    config: TrainConfig,
    on_step: StepCallback | None = None,
    on_note: Callable[[str], None] | None = None,
    on_write_error: Callable[[str], None] | None = None,
) -> TrainReport | None:
    """Run the job on this process; return the report on process 0, None elsewhere.

    `on_step` and `on_note` (a line for the user, e.g. a checkpoint written) are called on process 0 only.
    `on_write_error` gets the reason when this process cannot write its gradients (--save-grads) at the end: the job
    goes on with its peers so that nothing computed is lost (without it, the error is raised).

    Raises:
        RuntimeFault: an action failed here or on a peer (naming rank, step and action).
        TrainConfigError: inconsistent options, or ranks that disagree on their options, plan, model, data or
            checkpoint (training.agreement: named by one rank; the others raise its silent PeerRefused).
    """
    steady_cpu_allocator()  # the allocator the profile was measured with (models.allocator)
    torch.set_num_threads(config.threads)
    rank, world, device = init_distributed(config.backend, config.timeout_s)
    # before any other work: every rank shows its options, model, data and checkpoint to the others (one exchange)
    model = agree(config, config.build, rank, world)
    if config.evaluate and model.dataset.test_inputs is None:  # the launcher refuses it first (api.data_checks)
        raise TrainConfigError(eval_without_split(model.dataset.name))
    if config.layout is not None and config.layout.asynchronous:
        from pipeplan.runtime.training.asynchronous import train_asynchronous

        torch.manual_seed(config.seed * 7919 + rank)
        return train_asynchronous(config, model, rank, world, device, on_step)
    if model.graph is not None and not _is_chain(model.layer_inputs) and config.predict:
        raise TrainConfigError(
            f"--predict re-profiles a chain's stages; --module {config.module} is a graph (its stages are sets of "
            "layers): leave --predict out (a plan's step is still predicted from its profile and cluster)"
        )
    plan, schedule = config.resolve(len(model.layers), world)
    topology = Topology(plan, schedule, world)
    role = topology.roles[rank]
    torch.manual_seed(config.seed * 7919 + rank)
    wire = make_wire(config.network, topology.devices) if config.network is not None else None
    scaler = LossScaler() if config.precision == "fp16" else None
    # the library's object (pipeplan.distribute's), built from this job's parts: train is its first user
    pipe = DistributedPipeline(model.reference(), model.layers, model.graph, topology, rank, model.loss_fn, device,
                               config.timeout_s, config.lookahead, wire, config.precision, scaler,
                               seed=config.seed, bucket_bytes=config.allreduce_bucket_bytes)  # fmt: skip
    executor = pipe.executor
    params = pipe.parameters()
    # a plan's zero 1: the state sharded over each stage's data-parallel group (runtime.execution.sharded_state)
    optimizer = plan_optimizer(lambda ps: make_optimizer(config.optimizer, ps, config.lr), params, executor.sync, plan.zero)
    root = Path(config.checkpoint_dir) if config.checkpoint_dir else None
    fingerprint = config.fingerprint(plan, schedule, world)
    start = 0
    if config.resume and root is not None:
        resumed = _collective(lambda: checkpoint.load_rank(root, rank, executor.modules(), optimizer, fingerprint), world)
        start = resumed.step if resumed is not None else 0
        executor.step_index = start
    report = TrainReport(start_step=start, model=model, plan=plan, schedule=schedule, warmup_steps=config.warmup_steps)
    report.shared = [c for c, _ in shared_copies(model.layers, topology, model.layer_names) if c.split]
    if rank == 0 and config.plan is not None and config.profile is not None and config.cluster is not None:
        report.plan_prediction = _plan_prediction(config, plan, model)  # made before the first step
    data = model.dataset
    global_batch = plan.global_batch
    total = config.total_steps(len(data), global_batch)
    per_epoch = config.steps_per_epoch(len(data), global_batch)
    rates = config.rates(total)
    last_part: dict[str, Any] | None = None
    allreduces: list[list[float]] = []  # this process's emulated all-reduces over the run (span_row)
    origin = shared_origin() if wire is not None or config.adaptive else 0.0  # the trace's time 0
    if wire is not None:
        wire.origin_s = origin
    adaptive = _adaptive(config, plan, schedule, executor, origin, wire) if config.adaptive else None
    memory_by_k: dict[int, int] = {}  # this process's peak bytes at each k used
    began = time.perf_counter()
    for step in range(start, total):
        idx = batch_indices(len(data), global_batch, step, config.seed)
        inputs, targets = data.inputs[idx], data.targets[idx]
        record = (config.timeline and step == total - 1) or adaptive is not None
        if config.timeline and step == total - 1:
            dist.barrier()
        k_now = adaptive.k if adaptive is not None else plan.k
        # memory at a k is the same every iteration: measured on the first iteration of each k used (a warm-up anyway)
        meter = SavedMemoryMeter(exclude=params) if k_now not in memory_by_k else None
        t0 = time.perf_counter()
        result = executor.run(inputs, targets, record=record, meter=meter)
        t1 = time.perf_counter()
        allreduces += [span_row(c) for c in result.collectives]
        rates.apply(optimizer, step)
        if scaler is None:
            optimizer.step()
        else:  # every rank steps, or every rank skips (an overflow anywhere)
            scaler.step(optimizer, params, injected=overflow_at(rank, step))
        t2 = time.perf_counter()
        if meter is not None:
            memory_by_k[k_now] = static_bytes(params, optimizer) + meter.peak_bytes
        if config.timeline and step == total - 1:
            last_part = local_part(result, t0, t1)
        # the loss and every process's optimizer ms (--adaptive: and what it observed), one all-reduce
        shared = torch.zeros(1 + world + (adaptive.size if adaptive is not None else 0), dtype=torch.float64)
        shared[0], shared[1 + rank] = result.loss, (t2 - t1) * 1000.0
        if adaptive is not None:
            own = static_bytes(params, optimizer) if meter is not None else 0
            adaptive.pack(shared[1 + world :], result, (t0, t2), (t2 - t1) * 1000.0, own, meter)
        dist.all_reduce(shared)
        loss = shared[0]
        setup_ms = adaptive.after_step(step - start, shared[1 + world :]) if adaptive is not None else 0.0
        t3 = time.perf_counter() - setup_ms / 1000.0  # building the controller is the loop's set-up, not this step
        if rank == 0:
            report.step_ms.append((t3 - t0) * 1000.0)
            report.losses.append(float(loss))
            report.pipeline_ms.append((t1 - t0) * 1000.0)
            report.optimizer_ms.append((t2 - t1) * 1000.0)
            report.optimizer_ms_by_process.append(shared[1 : 1 + world].tolist())
            if on_step is not None:
                on_step(step, float(loss), (t1 - t0) * 1000.0, (t2 - t1) * 1000.0)
        done = step + 1
        if root is not None and config.checkpoint_every and done % config.checkpoint_every == 0:
            note = checkpoint.take(root, done, rank, executor.modules(), optimizer, done * global_batch, fingerprint,
                                   config.keep_last)  # fmt: skip
            if note is not None and on_note is not None:
                on_note(note)
        if config.evaluate and (done % per_epoch == 0 or done == total):
            own = executor.modules() if role.replica == 0 and role.pipeline_replica == 0 else {}
            scored = evaluation(model, plan, own, device, done, per_epoch, began)
            if scored is not None:
                report.evals.append(scored)
    by_k: list[dict[str, int]] = gather_json({str(k): v for k, v in memory_by_k.items()}) if adaptive is not None else []
    if adaptive is not None and rank == 0:
        report.adaptive = adaptive.report() | peak_memory(by_k)
    if scaler is not None:
        report.loss_scale, report.skipped_steps = scaler.scale, list(scaler.skipped)
    if total > start:
        report.memory_bytes = gather_json(max(memory_by_k.values()))  # an int each: its peak over the whole run
    if wire is not None:  # every process, collectively: each stage's emulated all-reduces, summed up on process 0
        report.allreduce = gather_allreduces(allreduces, plan)
    if config.save_grads:
        try:
            _save_grads(Path(config.save_grads), rank, executor, plan)
        except (OSError, OutputError) as exc:
            from pipeplan.io.atomic import write_failure

            if on_write_error is None:
                raise
            on_write_error(f"--save-grads {config.save_grads!r}: grads-rank-{rank}.pt not written: {write_failure(exc)}")
    if last_part is not None:
        parts = gather_parts(last_part)
        if parts is not None:
            report.timeline = build_result(parts, topology.num_stages, schedule.name)
    if config.predict:
        _predict(report, plan, schedule, model, device, role, world, config.precision)
    return report if rank == 0 else None


def _adaptive(
    config: TrainConfig, plan: Plan, schedule: Schedule, executor: Executor, origin: float, wire: Wire | None
) -> AdaptiveK:
    """The adaptive loop of --adaptive. With the plan's profile and cluster its controller is built here, before the
    first step, from the plan's costs; k must fit the plan's devices' memory (a --schedule run: this host's) and the
    memory budget (--memory-budget or the plan's adaptive setting), the smaller of them."""
    budget = config.memory_budget_bytes
    if config.plan is None or (config.cluster is None and config.cluster_value is None):
        if budget is None:
            return AdaptiveK(plan, schedule, executor, origin, wire)
        from pipeplan.runtime.training.adaptive import memory_per_process

        return AdaptiveK(plan, schedule, executor, origin, wire, min(memory_per_process(), budget))
    from pipeplan.sim.cost.model import CostModel

    cluster = config.read_cluster()
    limit = float(cluster.devices[executor.topology.devices[dist.get_rank()]].memory_bytes)
    model = None
    if config.profile is not None or config.profile_value is not None:
        optimizer = TRAIN_OPTIMIZERS.get(config.optimizer, config.optimizer)
        model = CostModel.build(config.read_profile(), cluster, config.batch_scaling, optimizer)
    if budget is not None:
        limit = min(limit, budget)
    return AdaptiveK(plan, schedule, executor, origin, wire, limit if model is None or budget is not None else None, model)


def peak_memory(by_process: list[dict[str, int]]) -> dict[str, Any]:
    """What `train --json`'s "adaptive" adds about memory: each process's measured peak bytes at each k used
    (`memory_bytes_by_k`: k -> bytes in process order), the most any process held at each k (`peak_memory_bytes_by_k`)
    and over the whole run (`peak_memory_bytes`)."""
    ks = sorted({int(k) for part in by_process for k in part})
    per_k = {str(k): [part.get(str(k), 0) for part in by_process] for k in ks}
    peaks = {k: max(values) for k, values in per_k.items()}
    return {"memory_bytes_by_k": per_k, "peak_memory_bytes_by_k": peaks,
            "peak_memory_bytes": max(peaks.values(), default=0)}  # fmt: skip


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
    errors: list[str | None] = all_gather_json(error)
    first = next((e for e in errors if e is not None), None)
    if first is not None:
        raise TrainConfigError(first)
    return result


def _plan_prediction(config: TrainConfig, plan: Plan, model: Model) -> PlanPrediction:
    """The plan simulated with its profile and cluster (runtime.measurement.prediction.predict_plan), checked against the run.

    Raises:
        TrainConfigError: the profile's layers are not the model's (another MODULE_SPEC, options or dataset).
    """
    assert config.profile is not None and config.cluster is not None
    profile = config.read_profile()
    if profile.num_layers != len(model.layers):
        raise TrainConfigError(
            f"profile {config.profile} has {profile.num_layers} layers but --module {config.module} with --dataset "
            f"{model.dataset.name} builds {len(model.layers)}: the plan was made for another model"
        )
    if profile.layer_inputs != model.layer_inputs and not (model.graph is not None and _is_chain(model.layer_inputs)):
        raise TrainConfigError(
            f"profile {config.profile} joins its layers otherwise than --module {config.module} does (its layer "
            "inputs differ): the plan was made for another model"
        )
    return predict_plan(plan, profile, config.read_cluster(), config.optimizer, config.batch_scaling,
                        (config.profile, config.cluster), config.allreduce_bucket_bytes)  # fmt: skip


def _is_chain(inputs: tuple[tuple[int, ...], ...] | None) -> bool:
    """True when a graph's inputs describe a chain (a profile stores those as None)."""
    return inputs is not None and all(sources == ((i - 1,) if i else ()) for i, sources in enumerate(inputs))


def _predict(
    report: TrainReport,
    plan: Plan,
    schedule: Schedule,
    model: Model,
    device: torch.device,
    role: Role,
    world: int,
    precision: str = "full",
) -> None:
    """Profile every stage where it runs (its forwards under the run's autocast), measure the link, simulate:
    report.predicted on process 0."""
    latency, bandwidth = measure_link(device)
    owned = role.stages if role.replica == 0 and role.pipeline_replica == 0 else ()
    # fresh copies each time (one untimed round so gradients accumulate, one timed), medians over repetitions:
    # closer to a training iteration than many rounds in a tight loop, whose caches and allocator stay warm.
    with autocast(precision, device):
        profiles = [
            profile_stages(model.layers, model.dataset.inputs, plan, owned, runs=1, warmup=1) for _ in range(PROFILE_REPEATS)
        ]
    if profiles[0] is not None:
        profile = median_profile([p for p in profiles if p is not None])
        report.link = (latency, bandwidth)
        report.predicted = predict(plan_on_processes(plan), schedule, profile, local_cluster(world, latency, bandwidth))
    dist.barrier()


def _save_grads(root: Path, rank: int, executor: Executor, plan: Plan) -> None:
    """Write this process's gradients of the last iteration, keyed `{global layer}.{parameter name}`, into folder
    `root` (made here when absent; its parent was checked to exist before any process started)."""
    from pipeplan.io.atomic import atomic_output

    root.mkdir(exist_ok=True)
    grads: dict[str, torch.Tensor] = {}
    for s, module in executor.modules().items():
        for name, p in module.named_parameters():
            local, _, rest = name.partition(".")
            layer = executor.layer_ids(s)[int(local)]
            grads[f"{layer}.{rest}"] = p.grad.detach().cpu() if p.grad is not None else torch.zeros_like(p).cpu()
    with atomic_output(root / f"grads-rank-{rank}.pt", binary=True) as out:
        torch.save(grads, out)
