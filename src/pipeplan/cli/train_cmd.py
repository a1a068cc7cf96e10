"""The `pipeplan train` command: run a plan or a schedule with torch.distributed (under torchrun, or --local N)."""

from __future__ import annotations

import os
import sys
from typing import Annotated, Any

import typer

from pipeplan.cli.flags import MEMORY_BUDGET_HELP, parse_budget, refuse_sizes_for_file
from pipeplan.cli.train_checks import (
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
    refuse_predict_for_graph,
    split_ints,
)
from pipeplan.cli.train_network import largest_message_bytes, network_for_train, stage_allreduces
from pipeplan.core.errors import PipeplanError
from pipeplan.schedules.registry import ASYNCHRONOUS, SCHEDULES

WORKER_BOOT = (
    "from pipeplan.runtime.training.launch import watch_launcher; watch_launcher(); from pipeplan.cli import main; main()"
)
"""How --local starts each worker (after launch.PRELUDE: the launcher's import path): first the watch on its launcher
(no orphan if the launcher dies), then this same CLI, without --local, under the launcher's torchrun-like
environment."""


def _worker_argv(argv: list[str]) -> list[str]:
    """This command line without `--local N` (or `--local=N`)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == "--local":
            skip = True
            continue
        if arg.startswith("--local="):
            continue
        out.append(arg)
    return out


def train(
    plan: str | None = typer.Option(None, "--plan", help="A plan file (pipeplan.plan/1)."),
    schedule: str | None = typer.Option(
        None,
        "--schedule",
        help=f"Schedule name ({', '.join(n + (': asynchronous' if n in ASYNCHRONOUS else '') for n in SCHEDULES)}) or a "
        "schedule .csv/.json file.",
    ),
    lr_reschedule: int | None = typer.Option(
        None, "--lr-reschedule", help="pipemare: learning rate α/τ^(1-min(k/K,1)) at asynchronous step k (K >= 1)."
    ),
    discrepancy_decay: float | None = typer.Option(
        None, "--discrepancy-decay", help="pipemare: backward on w - τ·δ, velocity δ with γ = D^(1/τ) (0 <= D < 1)."
    ),
    sync_warmup: int = typer.Option(0, "--sync-warmup", help="pipemare: the first W steps synchronous (flushed 1F1B)."),
    weight_prediction: bool = typer.Option(
        False, "--weight-prediction", help="pipemare: forwards on w + τ·δ, δ the last step's change (no --discrepancy-decay)."
    ),
    stages: int | None = typer.Option(None, "--stages", "-p", help="Pipeline ranks p (with --schedule NAME) [2]."),
    microbatches: int | None = typer.Option(
        None, "--microbatches", "-m", help="Microbatches m per iteration (with --schedule NAME) [4]."
    ),
    k: int | None = typer.Option(None, "--k", help="Group size k for kfkb (with --schedule kfkb) [1]."),
    chunks: int | None = typer.Option(None, "--chunks", "-v", help="Chunks v per rank for interleaved-1f1b [1]."),
    replicas: str | None = typer.Option(None, "--replicas", help="Data-parallel copies per pipeline rank, e.g. 2,1."),
    module: str | None = typer.Option(
        None,
        "--module",
        help="MODULE_SPEC: a built-in (mlp, transformer, ...) or pkg.module:factory [with --plan: the "
        "model its profile was measured on; else mlp].",
    ),
    options: Annotated[list[str] | None, typer.Option("--opt", help="A MODULE_SPEC option KEY=VALUE (repeatable).")] = None,
    dataset: str = typer.Option(
        "auto",
        "--dataset",
        help="digits (scikit-learn's), sample (the spec's own samples) or auto: digits when the model "
        "takes in_features (mlp), else sample.",
    ),
    data: str | None = typer.Option(
        None,
        "--data",
        help="Your own samples instead of --dataset: MODULE:FACTORY returning a map-style Dataset or a list of (input, "
        "target) pairs or dicts (input_ids/pixel_values + labels), or a pair (train, held_out) of them.",
    ),
    loss: str | None = typer.Option(
        None, "--loss", help="MODULE:FN, called FN(output, target) -> scalar mean loss [the model's own loss]."
    ),
    eval_fraction: float = typer.Option(
        0.0, "--eval-fraction", help="With --data: hold out this share of the samples (seeded) for --eval."
    ),
    dtype: str = typer.Option("float32", "--dtype", help="The weights' (master) dtype: float32 or float64."),
    precision: str = typer.Option(
        "full",
        "--precision",
        help="What the layers compute in: full (the --dtype), bf16 (bfloat16 autocast) or fp16 (float16 autocast with "
        "dynamic loss scaling), both over float32 weights and optimizer state.",
    ),
    batch_size: int | None = typer.Option(
        None, "--batch-size", "-b", help="Global batch: samples per iteration (with --schedule) [64]."
    ),
    steps: int | None = typer.Option(None, "--steps", help="Iterations to run (a resumed run stops at the same total) [10]."),
    epochs: int | None = typer.Option(
        None, "--epochs", help="Instead of --steps: passes over the training split (whole global batches each)."
    ),
    evaluate: bool = typer.Option(
        False, "--eval", help="Held-out accuracy and loss on the dataset's test split after each epoch and at the end."
    ),
    lr: float = typer.Option(1e-3, "--lr", help="Learning rate."),
    lr_schedule: str = typer.Option(
        "constant", "--lr-schedule", help="The base rate over the run: constant, or cosine (annealed from --lr to 0)."
    ),
    optimizer: str = typer.Option("adam", "--optimizer", help="adam, sgd or sgd_momentum (momentum 0.9)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the weights, the sample order and the layers' dropout."),
    checkpoint_dir: str | None = typer.Option(None, "--checkpoint-dir", help="Directory for checkpoints."),
    checkpoint_every: int = typer.Option(0, "--checkpoint-every", help="Checkpoint every N iterations (0: never)."),
    keep_last: int = typer.Option(0, "--keep-last", help="Keep only the newest N checkpoints (0: keep every one)."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the last checkpoint in --checkpoint-dir."),
    trace: str | None = typer.Option(None, "--trace", help="Write the last iteration's measured timeline (Perfetto JSON)."),
    png: str | None = typer.Option(None, "--png", help="Draw the last iteration's measured timeline (PNG)."),
    predict: bool = typer.Option(
        False,
        "--predict/--no-predict",
        help="After training, profile every stage where it ran and simulate the schedule "
        "again (the re-profiled prediction), beside the plan's own.",
    ),
    profile: str | None = typer.Option(
        None, "--profile", help="With --plan: the profile to predict the step with [the plan's own, resolved beside it]."
    ),
    cluster: str | None = typer.Option(
        None, "--cluster", help="With --plan: the cluster to predict the step with [the plan's own, resolved beside it]."
    ),
    batch_scaling: str = typer.Option("auto", "--batch-scaling", help="With --plan: how the prediction scales layer times."),
    warmup_steps: int = typer.Option(2, "--warmup-steps", help="Steps left out of the measured median (warm-up)."),
    timeout: float = typer.Option(300.0, "--timeout", help="Seconds any rank waits for a peer before failing."),
    threads: int = typer.Option(1, "--threads", help="CPU threads per process."),
    bandwidth_trace: str | None = typer.Option(
        None,
        "--bandwidth-trace",
        help="Emulate a bandwidth trace (pipeplan.bandwidth_trace/1) on the links; its clock starts with the run.",
    ),
    emulate_gb_per_s: float | None = typer.Option(
        None, "--emulate-gb-per-s", help="Emulate every link at X GB/s (with --plan: default the cluster's link rates)."
    ),
    adaptive: bool = typer.Option(
        False,
        "--adaptive",
        help="kfkb: choose k between iterations from the measured times (Ada-Grouper); a plan with an adaptive setting "
        "adapts without it.",
    ),
    memory_budget: str | None = typer.Option(None, "--memory-budget", help=MEMORY_BUDGET_HELP),
    local: int | None = typer.Option(None, "--local", help="Start N processes on this machine (loopback) instead of torchrun."),
    backend: str | None = typer.Option(None, "--backend", help="gloo or nccl (default: nccl when CUDA is available)."),
    save_grads: str | None = typer.Option(
        None,
        "--save-grads",
        help="A folder (created if its parent exists) where each rank writes grads-rank-N.pt: its gradients of the "
        "last iteration.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object (losses, times, prediction) at the end."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No per-iteration lines."),
) -> None:
    """Train a model with pipeline parallelism: each process walks its schedule actions with torch.distributed."""
    from pipeplan.api.data_checks import check_user_data, user_dataset
    from pipeplan.cli.profile_cmd import parse_options
    from pipeplan.runtime.execution.job import ScheduleLayout
    from pipeplan.runtime.options import check_adaptable, check_async_precision, check_global_batch, check_seed
    from pipeplan.runtime.rank_errors import TrainConfigError
    from pipeplan.runtime.training.launch import launched_locally
    from pipeplan.runtime.transport.launch_env import check_launch_env

    if local is None:  # a worker: the launcher's variables, checked before anything reads them
        check_launch_env()
    check_seed(seed)
    budget = parse_budget("--memory-budget", memory_budget)

    if (plan is None) == (schedule is None):
        raise TrainConfigError("give --plan FILE or --schedule NAME (one of them)")
    if plan is not None:
        refuse_beside_plan({"--stages": stages, "--microbatches": microbatches, "--batch-size": batch_size, "--k": k,
                            "--chunks": chunks, "--replicas": replicas})  # fmt: skip
    if steps is not None and epochs is not None:
        raise TrainConfigError("give --steps or --epochs, not both")
    if epochs is not None and epochs < 1:
        raise TrainConfigError(f"--epochs must be >= 1, got {epochs}")
    run_steps = steps if steps is not None else 10
    asynchronous = async_settings(schedule, lr_reschedule, discrepancy_decay, sync_warmup, weight_prediction,
                                  None if epochs else run_steps,
                                  {"--checkpoint-dir": checkpoint_dir, "--trace": trace, "--png": png,
                                   "--predict": predict or None, "--save-grads": save_grads,
                                   "--bandwidth-trace": bandwidth_trace, "--emulate-gb-per-s": emulate_gb_per_s,
                                   "--adaptive": adaptive or None})  # fmt: skip
    if asynchronous is not None:
        check_async_precision(precision, str(schedule))
    if plan is None and (profile is not None or cluster is not None):
        raise TrainConfigError("--profile and --cluster predict a plan's step; they need --plan")
    check_options(local=local, steps=run_steps, lr=lr, threads=threads, timeout=timeout, warmup_steps=warmup_steps,
                  checkpoint_every=checkpoint_every, checkpoint_dir=checkpoint_dir, resume=resume, optimizer=optimizer,
                  dtype=dtype, keep_last=keep_last, lr_schedule=lr_schedule, batch_scaling=batch_scaling,
                  backend=backend, batch_size=batch_size, precision=precision)  # fmt: skip
    spec_options = parse_options(options or [])
    given_module = module
    layout = plan_obj = links_from = plan_profile = None
    predicting = False  # whether the plan's step is predicted from a profile (measured in this run's numbers)
    if plan is not None:
        from pipeplan.presets.resolve import load_plan

        plan_obj, names = load_plan(plan, profile)
        check_global_batch(plan_obj.global_batch, f"plan {plan} global batch")
        if local is not None and len(plan_obj.all_devices) != local:
            raise TrainConfigError(f"plan {plan} uses {len(plan_obj.all_devices)} devices but --local starts {local} processes")
        links_from = cluster or names["cluster"]  # an emulated network's rates: the plan's cluster even unpredicted
        explicit = profile is not None or predict
        plan_profile = profile or names["profile"]  # what the plan was made from, even when it cannot predict
        profile, cluster = prediction_inputs(profile, cluster, names, say=local is None)
        predicting = prediction_numerics(profile, explicit, (dtype, precision), say=local is None)
        if not launched_locally():  # the --local launcher has checked the plan once for every worker
            check_plan(plan, profile, cluster, batch_scaling, optimizer)
        module, spec_options, dataset = model_of_profile(profile, module, spec_options, dataset, options is not None)
        if predict:
            refuse_predict_for_graph(plan, plan_obj, profile)
        adaptive = adaptive or plan_obj.adaptive is not None  # a plan's adaptive setting adapts with no other flag
        if adaptive:
            check_adaptable(plan_obj.schedule, plan_obj.chunks)
            setting = plan_obj.adaptive
            named = "--memory-budget" if budget is not None or setting is None else f"plan {plan} adaptive.memory_budget_bytes"
            given = budget if budget is not None or setting is None else setting.memory_budget_bytes
            budget = adaptive_budget(plan_obj, given, named, (profile, cluster), batch_scaling, optimizer)
    else:
        assert schedule is not None
        if adaptive:
            check_adaptable(schedule, chunks if chunks is not None else 1)
        refuse_sizes_for_file(schedule, stages, microbatches, k if k is not None else 1, chunks if chunks is not None else 1)
        sizes = [value if value is not None else default for value, default in
                 ((stages, 2), (microbatches, 4), (batch_size, 64), (k, 1), (chunks, 1))]  # fmt: skip
        layout = ScheduleLayout(schedule, *sizes, split_ints("--replicas", replicas),
                                run_steps if epochs is None else max(sync_warmup, 1), sync_warmup)  # fmt: skip
        checked = check_layout(layout, local)  # a bad name, size or world size fails here, once, before any start
        if checked is not None:
            _, per_rank, copies = checked
            if copies > 1:
                typer.echo(f"note: {local} processes hold {copies} copies of the {sum(per_rank)}-device pipeline "
                           f"(data parallel); --local {sum(per_rank)} runs one", err=True)  # fmt: skip
    if budget is not None and not adaptive:
        raise TrainConfigError(
            f"--memory-budget {memory_budget} bounds the k of an adaptive run; give --adaptive too (or a plan with an "
            "adaptive setting: pipeplan plan --adaptive)"
        )
    dataset = user_dataset(dataset, data, plan, plan_profile)  # a profile of your samples records the dataset `data`
    check_model_flags("mlp" if module is None else module, spec_options, dataset, given_module)
    # --eval, --data and --loss before any process starts: the launcher runs one batch through the model and the loss
    check_user_data(module or "mlp", spec_options, dataset, data=data, loss=loss, eval_fraction=eval_fraction,
                    evaluate=evaluate, dtype=dtype, seed=seed, build=local is not None)  # fmt: skip
    refuse_asynchronous_split(layout, local, (module or "mlp", spec_options, dataset, dtype, seed, data, loss))
    if checkpoint_dir is not None:
        job = {"module": module or "mlp", "module_options": spec_options, "dataset": dataset or "auto", "dtype": dtype,
               "optimizer": optimizer, "seed": seed, "lr": lr, "data": data, "loss": loss,
               "eval_fraction": eval_fraction}  # fmt: skip
        note, finished = prepare_checkpoints(checkpoint_dir, resume, checkpoint_every, run_steps, job,
                                             (plan_obj, plan, layout), local)  # fmt: skip
        # Said once: by the launcher when nothing will start, else by process 0 of the job.
        if note is not None and (finished if local is not None else int(os.environ.get("RANK", "0")) == 0):
            typer.echo(f"note: {note}", err=True)
        if finished:
            sys.exit(0)
    emulated = bandwidth_trace is not None or emulate_gb_per_s is not None
    message = largest_message_bytes(plan_obj, profile, cluster, batch_scaling) if emulated else None
    allreduces = stage_allreduces(plan_obj, profile, cluster, batch_scaling) if emulated else []
    network = network_for_train(bandwidth_trace, emulate_gb_per_s, links_from, plan_obj.all_devices if plan_obj else None,
                                local, timeout, message, allreduces)  # fmt: skip
    if local is not None:
        from pipeplan.runtime.training.launch import launch_local

        code = launch_local(local, WORKER_BOOT, _worker_argv(sys.argv[1:]), grace_s=min(timeout, 10.0),
                            modules=((module or "mlp", spec_options),
                                     *(spec for spec in (data, loss) if spec is not None)))  # fmt: skip
        sys.exit(code)  # not typer.Exit: main() runs click with standalone_mode=False, which turns Exit into a return value
    from pipeplan.runtime.training.train_config import TrainConfig

    config = TrainConfig(
        plan=plan_obj, plan_path=plan, layout=layout, module=module or "mlp",
        module_options=tuple(sorted(spec_options.items())), dataset=dataset or "auto",
        dtype=dtype, precision=precision, steps=run_steps, lr=lr, lr_schedule=lr_schedule, optimizer=optimizer,
        seed=seed, checkpoint_dir=checkpoint_dir,
        checkpoint_every=checkpoint_every, keep_last=keep_last, resume=resume, timeout_s=timeout,
        trace=trace is not None or png is not None,
        threads=threads, save_grads=save_grads, predict=predict, backend=backend,
        profile=profile if predicting else None, cluster=cluster if predicting else None,
        batch_scaling=batch_scaling, warmup_steps=warmup_steps, asynchronous=asynchronous, evaluate=evaluate,
        epochs=epochs or 0, network=network, adaptive=adaptive, memory_budget_bytes=budget, data=data, loss=loss,
        eval_fraction=eval_fraction,
    )  # fmt: skip
    _run_worker(config, trace, png, as_json, quiet)


def _run_worker(config: Any, trace: str | None, png: str | None, as_json: bool, quiet: bool) -> None:
    """Run this process's part; a failure prints one line naming the rank and exits non-zero at once (no hang).

    A result file that cannot be written at the end (a full disk, a folder gone) is not such a failure: the
    results already computed are printed and the other files written, then one line names what was not written,
    and the process leaves with its peers and exits 1.
    """
    from pipeplan.cli.train_report import report_results
    from pipeplan.runtime.rank_errors import RuntimeFault
    from pipeplan.runtime.training.error_once import say_error
    from pipeplan.runtime.training.launch import finish_worker
    from pipeplan.runtime.training.worker import train as run_training

    rank = int(os.environ.get("RANK", "0"))

    def on_step(step: int, loss: float, pipeline_ms: float, optimizer_ms: float) -> None:
        if not quiet and not as_json:
            times = f"pipeline {pipeline_ms:8.2f} ms  optimizer {optimizer_ms:7.2f} ms"
            of = "" if config.epochs else f"/{config.steps}"
            typer.echo(f"step {step + 1:>5}{of}  loss {loss:.6f}  {times}")

    failures: list[str] = []  # results this process could not write: said once at the end, the job goes on
    try:
        report = run_training(config, on_step, on_note=lambda line: None if as_json else typer.echo(line),
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
        failures += report_results(report, trace, png, as_json)
    if failures:
        print(f"error: OutputError: rank {rank}: {'; '.join(failures)}", file=sys.stderr, flush=True)
    finish_worker(1 if failures else 0)  # with the peers, in the job's final barrier: no peer is left to fail alone


def register(app: typer.Typer) -> None:
    """Add `train` to app."""
    app.command("train")(train)
