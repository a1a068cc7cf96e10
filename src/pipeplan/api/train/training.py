"""`pipeplan train` wired once (the CLI maps its flags to `train` here): every check before any process starts
(api.train.train_setup, runtime.options), the emulated network priced, then the --local launcher or this process's part."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from pipeplan.api.option_text import parse_budget, parse_options, refuse_sizes_for_file
from pipeplan.api.train.train_flags import TrainFlags, check_train_files
from pipeplan.api.train.train_setup import (
    adaptive_budget,
    async_settings,
    check_layout,
    check_model_flags,
    check_options,
    check_plan,
    model_of_profile,
    prediction_inputs,
    prediction_numerics,
    prepare_checkpoints,
    refuse_asynchronous_split,
    refuse_beside_plan,
    split_ints,
)
from pipeplan.core.errors import PipeplanError

if TYPE_CHECKING:
    from pipeplan.core.plan import Plan
    from pipeplan.runtime.training.train_config import TrainConfig
    from pipeplan.runtime.transport.network import NetworkSettings


def train(f: TrainFlags) -> int | None:
    """Check `f` once, then start --local's processes (returns their exit code) or run this process's part (a
    torchrun or --local worker: ends the process with its peers, runtime.training.launch.finish_worker). Notes go
    to stderr; per-step lines and process 0's results (viz.train_report) to stdout.

    Returns:
        The exit code when nothing runs here (a finished run: 0) or the --local launcher's; None after this
        process's part (a worker that could not leave through finish_worker, e.g. under a test's stand-in).

    Raises:
        PipeplanError: a bad value, naming the flag, before any process starts.
    """
    from pipeplan.api.data_checks import check_user_data, user_dataset
    from pipeplan.runtime.execution.job import ScheduleLayout
    from pipeplan.runtime.options import check_adaptable, check_async_precision, check_global_batch, check_seed
    from pipeplan.runtime.rank_errors import TrainConfigError
    from pipeplan.runtime.training.launch import launched_locally
    from pipeplan.runtime.transport.launch_env import check_launch_env

    plan, schedule, local, profile, cluster = f.plan, f.schedule, f.local, f.profile, f.cluster
    if local is None:  # a worker: the launcher's variables, checked before anything reads them
        check_launch_env()
    check_seed(f.seed)
    budget = parse_budget("--memory-budget", f.memory_budget)

    if (plan is None) == (schedule is None):
        raise TrainConfigError("give --plan FILE or --schedule NAME (one of them)")
    if plan is not None:
        refuse_beside_plan({"--stages": f.stages, "--microbatches": f.microbatches, "--batch-size": f.batch_size,
                            "--k": f.k, "--chunks": f.chunks, "--replicas": f.replicas})  # fmt: skip
    if f.steps is not None and f.epochs is not None:
        raise TrainConfigError("give --steps or --epochs, not both")
    if f.epochs is not None and f.epochs < 1:
        raise TrainConfigError(f"--epochs must be >= 1, got {f.epochs}")
    run_steps = f.steps if f.steps is not None else 10
    asynchronous = async_settings(schedule, f.lr_reschedule, f.discrepancy_decay, f.sync_warmup, f.weight_prediction,
                                  None if f.epochs else run_steps,
                                  {"--checkpoint-dir": f.checkpoint_dir, "--timeline": f.timeline, "--png": f.png,
                                   "--predict": f.predict or None, "--save-grads": f.save_grads,
                                   "--bandwidth-trace": f.bandwidth_trace, "--emulate-gb-per-s": f.emulate_gb_per_s,
                                   "--adaptive": f.adaptive or None})  # fmt: skip
    if asynchronous is not None:
        check_async_precision(f.precision, str(schedule))
    if plan is None and (profile is not None or cluster is not None):
        raise TrainConfigError("--profile and --cluster predict a plan's step; they need --plan")
    check_options(local=local, steps=run_steps, lr=f.lr, threads=f.threads, timeout=f.timeout,
                  warmup_steps=f.warmup_steps, checkpoint_every=f.checkpoint_every, checkpoint_dir=f.checkpoint_dir,
                  resume=f.resume, optimizer=f.optimizer, dtype=f.dtype, keep_last=f.keep_last,
                  lr_schedule=f.lr_schedule, batch_scaling=f.batch_scaling, backend=f.backend,
                  batch_size=f.batch_size, precision=f.precision, check_outputs=lambda: check_train_files(f))  # fmt: skip
    spec_options = parse_options(f.options or [])
    module, dataset, adaptive = f.module, f.dataset, f.adaptive
    layout = plan_obj = links_from = plan_profile = None
    predicting = False  # whether the plan's step is predicted from a profile (measured in this run's numbers)
    if plan is not None:
        from pipeplan.presets.resolve import load_plan

        plan_obj, names = load_plan(plan, profile)
        check_global_batch(plan_obj.global_batch, f"plan {plan} global batch")
        if local is not None and len(plan_obj.all_devices) != local:
            raise TrainConfigError(f"plan {plan} uses {len(plan_obj.all_devices)} devices but --local starts {local} processes")
        links_from = cluster or names["cluster"]  # an emulated network's rates: the plan's cluster even unpredicted
        explicit = profile is not None or f.predict
        plan_profile = profile or names["profile"]  # what the plan was made from, even when it cannot predict
        profile, cluster = prediction_inputs(profile, cluster, names, say=local is None)
        predicting = prediction_numerics(profile, explicit, (f.dtype, f.precision), say=local is None)
        if not launched_locally():  # the --local launcher has checked the plan once for every worker
            check_plan(plan, profile, cluster, (f.batch_scaling, f.optimizer))
        module, spec_options, dataset = model_of_profile(profile, module, spec_options, dataset, f.options is not None)
        if f.predict:
            from pipeplan.api.train.train_setup import refuse_predict_for_graph

            refuse_predict_for_graph(plan, plan_obj, profile)
        adaptive = adaptive or plan_obj.adaptive is not None  # a plan's adaptive setting adapts with no other flag
        if adaptive:
            check_adaptable(plan_obj.schedule, plan_obj.chunks)
            setting = plan_obj.adaptive
            named = "--memory-budget" if budget is not None or setting is None else f"plan {plan} adaptive.memory_budget_bytes"
            given = budget if budget is not None or setting is None else setting.memory_budget_bytes
            budget = adaptive_budget(plan_obj, given, named, (profile, cluster), f.batch_scaling, f.optimizer)
    else:
        assert schedule is not None
        if adaptive:
            check_adaptable(schedule, f.chunks if f.chunks is not None else 1)
        refuse_sizes_for_file(schedule, f.stages, f.microbatches, f.k if f.k is not None else 1,
                                    f.chunks if f.chunks is not None else 1)  # fmt: skip
        sizes = [value if value is not None else default for value, default in
                 ((f.stages, 2), (f.microbatches, 4), (f.batch_size, 64), (f.k, 1), (f.chunks, 1))]  # fmt: skip
        layout = ScheduleLayout(schedule, *sizes, split_ints("--replicas", f.replicas),
                                run_steps if f.epochs is None else max(f.sync_warmup, 1), f.sync_warmup)  # fmt: skip
        checked = check_layout(layout, local)  # a bad name, size or world size fails here, once, before any start
        if checked is not None:
            _, per_rank, copies = checked
            if copies > 1:
                _say(f"note: {local} processes hold {copies} copies of the {sum(per_rank)}-device pipeline "
                          f"(data parallel); --local {sum(per_rank)} runs one")  # fmt: skip
    if budget is not None and not adaptive:
        raise TrainConfigError(
            f"--memory-budget {f.memory_budget} bounds the k of an adaptive run; give --adaptive too (or a plan with an "
            "adaptive setting: pipeplan plan --adaptive)"
        )
    dataset = user_dataset(dataset, f.data, plan, plan_profile)  # a profile of your samples records the dataset `data`
    check_model_flags("mlp" if module is None else module, spec_options, dataset, f.module)
    # --eval, --data and --loss before any process starts: the launcher runs one batch through the model and the loss
    check_user_data(module or "mlp", spec_options, dataset, data=f.data, loss=f.loss, eval_fraction=f.eval_fraction,
                    evaluate=f.evaluate, dtype=f.dtype, seed=f.seed, build=local is not None)  # fmt: skip
    refuse_asynchronous_split(layout, local, (module or "mlp", spec_options, dataset, f.dtype, f.seed, f.data, f.loss))
    if f.checkpoint_dir is not None:
        job = {"module": module or "mlp", "module_options": spec_options, "dataset": dataset or "auto",
               "dtype": f.dtype, "optimizer": f.optimizer, "seed": f.seed, "lr": f.lr, "data": f.data,
               "loss": f.loss, "eval_fraction": f.eval_fraction}  # fmt: skip
        note, finished = prepare_checkpoints(f.checkpoint_dir, f.resume, f.checkpoint_every, run_steps, job,
                                             (plan_obj, plan, layout), local)  # fmt: skip
        # Said once: by the launcher when nothing will start, else by process 0 of the job.
        if note is not None and (finished if local is not None else int(os.environ.get("RANK", "0")) == 0):
            _say(f"note: {note}")
        if finished:
            return 0
    emulated = f.bandwidth_trace is not None or f.emulate_gb_per_s is not None
    message = largest_message_bytes(plan_obj, profile, cluster, f.batch_scaling) if emulated else None
    allreduces = stage_allreduces(plan_obj, profile, cluster, f.batch_scaling) if emulated else []
    network = network_for_train(f.bandwidth_trace, f.emulate_gb_per_s, links_from,
                                plan_obj.all_devices if plan_obj else None, local, f.timeout, message,
                                allreduces)  # fmt: skip
    if local is not None:
        return _launch(f, local, ((module or "mlp", spec_options), *(spec for spec in (f.data, f.loss) if spec is not None)))
    from pipeplan.runtime.training.train_config import TrainConfig

    config = TrainConfig(
        plan=plan_obj, plan_path=plan, layout=layout, module=module or "mlp",
        module_options=tuple(sorted(spec_options.items())), dataset=dataset or "auto",
        dtype=f.dtype, precision=f.precision, steps=run_steps, lr=f.lr, lr_schedule=f.lr_schedule,
        optimizer=f.optimizer, seed=f.seed, checkpoint_dir=f.checkpoint_dir,
        checkpoint_every=f.checkpoint_every, keep_last=f.keep_last, resume=f.resume, timeout_s=f.timeout,
        timeline=f.timeline is not None or f.png is not None,
        threads=f.threads, save_grads=f.save_grads, predict=f.predict, backend=f.backend,
        profile=profile if predicting else None, cluster=cluster if predicting else None,
        batch_scaling=f.batch_scaling, warmup_steps=f.warmup_steps, asynchronous=asynchronous, evaluate=f.evaluate,
        epochs=f.epochs or 0, network=network, adaptive=adaptive, memory_budget_bytes=budget, data=f.data,
        loss=f.loss, eval_fraction=f.eval_fraction,
    )  # fmt: skip
    _run_worker(config, f)
    return None


WORKER_BOOT = (
    "from pipeplan.runtime.training.launch import watch_launcher; watch_launcher(); "
    "from pipeplan.api.train.training import worker_main; worker_main()"
)
"""How --local starts each worker (after launch.PRELUDE: the launcher's import path): first the watch on its launcher
(no orphan if the launcher dies), then `worker_main`, under the launcher's torchrun-like environment."""
FLAGS_ENV = "PIPEPLAN_TRAIN_FLAGS"
"""The environment variable holding the flags a --local worker runs, as JSON text (TrainFlags.to_json, without
--local): a few hundred bytes, written nowhere (a launcher that may write no file still starts its workers)."""


def _launch(f: TrainFlags, local: int, modules: Sequence[str | tuple[str, dict[str, str]]]) -> int:
    """Start `local` workers on this machine, each given `f` (without --local) as JSON in its environment (FLAGS_ENV);
    their exit code (runtime.training.launch.launch_local)."""
    from pipeplan.runtime.training.launch import launch_local

    flags = json.dumps(dataclasses.replace(f, local=None).to_json())
    return launch_local(local, WORKER_BOOT, env={**os.environ, FLAGS_ENV: flags}, grace_s=min(f.timeout, 10.0),
                        modules=modules)  # fmt: skip


def worker_main() -> None:
    """A worker of `train --local`: its part of the job the launcher's flags (FLAGS_ENV) describe."""
    from pipeplan.api.failure import REPORTED, fail_for

    try:
        train(TrainFlags.from_json(json.loads(os.environ[FLAGS_ENV])))
    except REPORTED as exc:
        fail_for(exc)
        raise


def _say(line: str) -> None:
    """A note for the user, on stderr."""
    print(line, file=sys.stderr, flush=True)


def _run_worker(config: TrainConfig, f: TrainFlags) -> None:
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


def network_for_train(
    trace: str | None,
    gb_per_s: float | None,
    cluster: str | None,
    plan_devices: Sequence[int] | None,
    local: int | None,
    timeout_s: float = 300.0,
    message_bytes: float | None = None,
    allreduces: Sequence[tuple[int, tuple[int, ...], float]] = (),
) -> NetworkSettings | None:
    """The emulated network, checked against the job's devices (the plan's, else one per process: --local N or
    torchrun's WORLD_SIZE) and priced: its slowest link's lowest rate above the floor, and the largest message
    (`message_bytes`, when known) moved within `timeout_s` (link_emulation.check_emulation_time), and each of
    `allreduces` (stage_allreduces) on its ring as well (check_allreduce_time). None for the real one. A worker
    that --local started gets the settings unchecked: its launcher checked them for the same devices (the trace file
    is then read once more per worker, by the wire it builds, not twice).

    Raises:
        TrainConfigError: no rate to emulate, a bad rate, a trace naming a device the job does not run on, a rate
            the run cannot finish on.
        CostError, ClusterError: an unreadable trace or cluster.
    """
    from pipeplan.runtime.training.launch import launched_locally
    from pipeplan.runtime.transport.link_emulation import check_allreduce_time, check_emulation_time
    from pipeplan.runtime.transport.network import network_settings

    settings = network_settings(trace, gb_per_s, cluster)
    if settings is None or (local is None and launched_locally()):
        return settings  # a --local worker: its launcher checked and priced this network once, for every worker
    world = local if local is not None else int(os.environ.get("WORLD_SIZE", "0"))
    devices = list(plan_devices) if plan_devices is not None else list(range(world))
    if devices:
        rates = f"--emulate-gb-per-s {gb_per_s:g}" if gb_per_s is not None else f"cluster {cluster}'s rate"
        links = settings.links(devices)
        check_emulation_time(links, rates, timeout_s, message_bytes)
        check_allreduce_time(links, rates, timeout_s, allreduces)
    else:  # a torchrun worker: each process checks the devices again when it builds its wire
        settings.require_rate()
        settings.read_trace()
    return settings


def largest_message_bytes(plan: Plan | None, profile: str | None, cluster: str | None, scaling: str) -> float | None:
    """Bytes of the largest activation (or its gradient) one microbatch of `plan` sends across a stage boundary, from
    its profile's cut bytes (before any split over replicated stages: an upper bound on one message), or None
    without a plan, profile and cluster to price it with."""
    if plan is None or profile is None or cluster is None or len(plan.stages) < 2:
        return None
    from pipeplan.presets.resolve import load_cluster, load_profile
    from pipeplan.sim.cost.chain_view import chain_view
    from pipeplan.sim.cost.model import CostModel

    chain, model = chain_view(plan, CostModel.build(load_profile(profile), load_cluster(cluster), scaling))
    return max(model.layers.cut_bytes(s.last_layer, chain.microbatch_size) for s in chain.stages[:-1])


def stage_allreduces(
    plan: Plan | None, profile: str | None, cluster: str | None, scaling: str
) -> list[tuple[int, tuple[int, ...], float]]:
    """Each replicated stage of `plan` as (stage, its devices: the all-reduce's ring, its parameters' bytes from the
    profile), or none without a plan, profile and cluster to price them with."""
    if plan is None or profile is None or cluster is None:
        return []
    from pipeplan.presets.resolve import load_cluster, load_profile
    from pipeplan.sim.cost.chain_view import chain_view
    from pipeplan.sim.cost.model import CostModel

    chain, model = chain_view(plan, CostModel.build(load_profile(profile), load_cluster(cluster), scaling))
    return [
        (s, stage.devices, model.layers.stage(range(stage.first_layer, stage.last_layer + 1), 1, 1, 1.0).param_bytes)
        for s, stage in enumerate(chain.stages)
        if len(stage.devices) > 1
    ]
