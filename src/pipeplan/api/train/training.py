"""`pipeplan train` wired once (the CLI maps its flags to `train` here): every check before any process starts
(api.train.train_setup, runtime.options), the emulated network priced, then the --local launcher or this process's part."""

from __future__ import annotations

import math
import os
import sys
from typing import TYPE_CHECKING

from pipeplan.api.option_text import parse_budget, parse_options, refuse_sizes_for_file
from pipeplan.api.train.train_flags import TrainFlags, check_train_files
from pipeplan.api.train.train_inputs import read_plan_inputs
from pipeplan.api.train.train_network import largest_message_bytes, network_for_train, stage_allreduces
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
from pipeplan.api.train.train_tensor import check_runnable, check_split_model
from pipeplan.api.train.train_workers import launch, run_part

if TYPE_CHECKING:
    from pipeplan.core.hardware.cluster import Cluster
    from pipeplan.core.profile import ModelProfile
    from pipeplan.runtime.training.train_config import TrainConfig


def train(f: TrainFlags) -> int | None:
    """Check `f` once and build the job's TrainConfig (`train_config`), then start --local's processes, each given
    that config (returns their exit code), or run this process's part (a torchrun rank: ends the process with its
    peers, runtime.training.launch.finish_worker). Notes go to stderr; per-step lines and process 0's results
    (viz.train_report) to stdout.

    Returns:
        The exit code when nothing runs here (a finished run: 0) or the --local launcher's; None after this
        process's part (a rank that could not leave through finish_worker, e.g. under a test's stand-in).

    Raises:
        PipeplanError: a bad value, naming the flag, before any process starts.
    """
    config = train_config(f)
    if config is None:
        return 0
    if f.local is not None:
        modules = ((config.module, dict(config.module_options)), *(s for s in (config.data, config.loss) if s is not None))
        return launch(config, f, f.local, modules)
    run_part(config, f)
    return None


def train_config(f: TrainFlags) -> TrainConfig | None:
    """The one function from train's flags to its TrainConfig: every flag checked, the plan, profile, cluster, schedule
    file and bandwidth trace each read once and checked (api.train.train_inputs; their contents carried to the
    workers: TrainConfig.loaded), the emulated network
    priced, a checkpoint folder prepared; None when the run is already finished (a resumed run at its last step:
    nothing to start).

    Raises:
        PipeplanError: a bad value, naming the flag.
    """
    from pipeplan.api.data_checks import check_user_data, user_dataset
    from pipeplan.runtime.execution.job import ScheduleLayout
    from pipeplan.runtime.options import check_adaptable, check_async_precision, check_global_batch, check_seed
    from pipeplan.runtime.rank_errors import TrainConfigError
    from pipeplan.runtime.transport.launch_env import check_launch_env

    plan, schedule, local, profile, cluster = f.plan, f.schedule, f.local, f.profile, f.cluster
    if local is None:  # a worker: the launcher's variables, checked before anything reads them
        check_launch_env()
    check_seed(f.seed)
    budget = parse_budget("--memory-budget", f.memory_budget)
    bucket_mb = f.allreduce_bucket_mb
    if bucket_mb is not None and (isinstance(bucket_mb, bool) or not 0 < bucket_mb < math.inf):
        raise TrainConfigError(
            f"--allreduce-bucket-mb must be a number of MiB > 0 (PyTorch DDP's default is 25), got {bucket_mb}; "
            "leave it out to all-reduce after the backward"
        )
    if bucket_mb is not None and f.adaptive:
        raise TrainConfigError(
            "--allreduce-bucket-mb buckets the all-reduce, which --adaptive's controller prices unbucketed: give one of them"
        )

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
                                   "--adaptive": f.adaptive or None, "--allreduce-bucket-mb": bucket_mb})  # fmt: skip
    if asynchronous is not None:
        check_async_precision(f.precision, str(schedule))
    if plan is None and (profile is not None or cluster is not None):
        raise TrainConfigError("--profile and --cluster predict a plan's step; they need --plan")
    # the plan, its profile and cluster, each read once, here; an error is said below, in its turn
    plan_read = None if plan is None else read_plan_inputs(plan, profile, cluster)
    read_names = None if plan_read is None else {} if plan_read.value is None else plan_read.value.names
    check_options(local=local, steps=run_steps, lr=f.lr, threads=f.threads, timeout=f.timeout,
                  warmup_steps=f.warmup_steps, checkpoint_every=f.checkpoint_every, checkpoint_dir=f.checkpoint_dir,
                  resume=f.resume, optimizer=f.optimizer, dtype=f.dtype, keep_last=f.keep_last,
                  lr_schedule=f.lr_schedule, batch_scaling=f.batch_scaling, backend=f.backend,
                  batch_size=f.batch_size, precision=f.precision,
                  check_outputs=lambda: check_train_files(f, read_names))  # fmt: skip
    spec_options = parse_options(f.options or [])
    module, dataset, adaptive = f.module, f.dataset, f.adaptive
    layout = plan_obj = links = plan_profile = None
    values: tuple[ModelProfile | None, Cluster | None] = (None, None)  # what the step is predicted with, as read
    notes: list[str] = []  # said once every check has passed (so that a refusal stays its one line)
    predicting = False  # whether the plan's step is predicted from a profile (measured in this run's numbers)
    if plan is not None:
        assert plan_read is not None
        inputs = plan_read.get()
        plan_obj = inputs.plan
        check_runnable(plan_obj, plan, {"--checkpoint-dir": f.checkpoint_dir, "--save-grads": f.save_grads,
                                        "--eval": f.evaluate, "--predict": f.predict, "--adaptive": f.adaptive,
                                        "--bandwidth-trace": f.bandwidth_trace, "--emulate-gb-per-s": f.emulate_gb_per_s,
                                        "--precision": f.precision, "--allreduce-bucket-mb": bucket_mb})  # fmt: skip
        check_global_batch(plan_obj.global_batch, f"plan {plan} global batch")
        if local is not None and len(plan_obj.all_devices) != local:
            raise TrainConfigError(f"plan {plan} uses {len(plan_obj.all_devices)} devices but --local starts {local} processes")
        links = inputs.cluster  # an emulated network's rates: the plan's cluster even unpredicted
        explicit = profile is not None or f.predict
        plan_profile = inputs.profile  # what the plan was made from, even when it cannot predict
        chosen = prediction_inputs(inputs, (profile is not None, cluster is not None), notes)
        profile_read = None if chosen is None else chosen[0]
        profile, cluster = (None, None) if chosen is None else (chosen[0].spec, chosen[1].spec)
        values = (None, None) if chosen is None else (chosen[0].get(), chosen[1].get())
        predicting = prediction_numerics(profile_read, explicit, (f.dtype, f.precision), notes)
        check_plan(plan, plan_obj, values, (f.batch_scaling, f.optimizer))
        module, spec_options, dataset = model_of_profile(profile_read, module, spec_options, dataset, f.options is not None)
        if f.predict:
            from pipeplan.api.train.train_setup import refuse_predict_for_graph

            refuse_predict_for_graph(plan, plan_obj, values[0])
        adaptive = adaptive or plan_obj.adaptive is not None  # a plan's adaptive setting adapts with no other flag
        if adaptive:
            check_adaptable(plan_obj.schedule, plan_obj.chunks)
            setting = plan_obj.adaptive
            named = "--memory-budget" if budget is not None or setting is None else f"plan {plan} adaptive.memory_budget_bytes"
            given = budget if budget is not None or setting is None else setting.memory_budget_bytes
            budget = adaptive_budget(plan_obj, given, named, values, f.batch_scaling, f.optimizer)
    else:
        assert schedule is not None
        if adaptive:
            check_adaptable(schedule, f.chunks if f.chunks is not None else 1)
        refuse_sizes_for_file(schedule, f.stages, f.microbatches, f.k if f.k is not None else 1,
                                    f.chunks if f.chunks is not None else 1)  # fmt: skip
        sizes = [value if value is not None else default for value, default in
                 ((f.stages, 2), (f.microbatches, 4), (f.batch_size, 64), (f.k, 1), (f.chunks, 1))]  # fmt: skip
        layout = ScheduleLayout(schedule, *sizes, split_ints("--replicas", f.replicas),
                                run_steps if f.epochs is None else max(f.sync_warmup, 1), f.sync_warmup).loaded()  # fmt: skip
        checked = check_layout(layout, local)  # a bad name, size or world size fails here, once, before any start
        if checked is not None:
            _, per_rank, copies = checked
            if copies > 1:
                notes.append(f"note: {local} processes hold {copies} copies of the {sum(per_rank)}-device pipeline "
                             f"(data parallel); --local {sum(per_rank)} runs one")  # fmt: skip
    if budget is not None and not adaptive:
        raise TrainConfigError(
            f"--memory-budget {f.memory_budget} bounds the k of an adaptive run; give --adaptive too (or a plan with an "
            "adaptive setting: pipeplan plan --adaptive)"
        )
    recorded = None if plan_profile is None or plan_profile.value is None else plan_profile.value.source
    # a profile of your samples records the dataset `data`
    dataset = user_dataset(dataset, f.data, plan, None if plan_profile is None else plan_profile.spec,
                           None if recorded is None else recorded.dataset)  # fmt: skip
    check_model_flags("mlp" if module is None else module, spec_options, dataset, f.module)
    # --eval, --data and --loss before any process starts: the launcher runs one batch through the model and the loss
    check_user_data(module or "mlp", spec_options, dataset, data=f.data, loss=f.loss, eval_fraction=f.eval_fraction,
                    evaluate=f.evaluate, dtype=f.dtype, seed=f.seed, build=local is not None)  # fmt: skip
    refuse_asynchronous_split(layout, local, (module or "mlp", spec_options, dataset, f.dtype, f.seed, f.data, f.loss))
    if plan_obj is not None and local is not None:  # a torchrun rank's worker checks its own model (tp_layers)
        check_split_model(plan_obj, plan, (module or "mlp", spec_options, dataset, f.dtype, f.seed, f.data, f.loss))
    if f.checkpoint_dir is not None:
        job = {"module": module or "mlp", "module_options": spec_options, "dataset": dataset or "auto",
               "dtype": f.dtype, "optimizer": f.optimizer, "seed": f.seed, "lr": f.lr, "data": f.data,
               "loss": f.loss, "eval_fraction": f.eval_fraction}  # fmt: skip
        note, finished = prepare_checkpoints(f.checkpoint_dir, f.resume, f.checkpoint_every, run_steps, job,
                                             (plan_obj, plan, layout), local)  # fmt: skip
        if note is not None:
            notes.append(f"note: {note}")
        if finished:
            _say_once(notes, local)
            return None
    emulated = f.bandwidth_trace is not None or f.emulate_gb_per_s is not None
    priced = (plan_obj, *values, f.batch_scaling)
    message = largest_message_bytes(*priced) if emulated else None
    allreduces = stage_allreduces(*priced) if emulated else []
    network = network_for_train(f.bandwidth_trace, f.emulate_gb_per_s, links,
                                plan_obj.all_devices if plan_obj else None, local, f.timeout, message,
                                allreduces)  # fmt: skip
    _say_once(notes, local)
    from pipeplan.runtime.training.train_config import TrainConfig

    return TrainConfig(
        plan=plan_obj, plan_path=plan, layout=layout, module=module or "mlp",
        module_options=tuple(sorted(spec_options.items())), dataset=dataset or "auto",
        dtype=f.dtype, precision=f.precision, steps=run_steps, lr=f.lr, lr_schedule=f.lr_schedule,
        optimizer=f.optimizer, seed=f.seed, checkpoint_dir=f.checkpoint_dir,
        checkpoint_every=f.checkpoint_every, keep_last=f.keep_last, resume=f.resume, timeout_s=f.timeout,
        timeline=f.timeline is not None or f.png is not None,
        threads=f.threads, save_grads=f.save_grads, predict=f.predict, backend=f.backend,
        profile=profile if predicting else None, cluster=cluster if predicting else None,
        profile_value=values[0] if predicting else None, cluster_value=values[1] if predicting else None,
        batch_scaling=f.batch_scaling, warmup_steps=f.warmup_steps, asynchronous=asynchronous, evaluate=f.evaluate,
        epochs=f.epochs or 0, network=network, adaptive=adaptive, memory_budget_bytes=budget, data=f.data,
        loss=f.loss, eval_fraction=f.eval_fraction,
        allreduce_bucket_bytes=None if bucket_mb is None else float(bucket_mb) * 2**20,
    ).loaded()  # fmt: skip  # a schedule file read once, here; the workers are handed every file's contents


def _say_once(notes: list[str], local: int | None) -> None:
    """The notes the checks collected, said once every check has passed: by the --local launcher, else by process 0
    of the job (under torchrun every rank builds the config)."""
    if local is not None or int(os.environ.get("RANK", "0")) == 0:
        for line in notes:
            print(line, file=sys.stderr, flush=True)
