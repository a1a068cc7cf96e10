"""The `pipeplan train` command: run a plan or a schedule with torch.distributed (under torchrun, or --local N)."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from pipeplan.api.scheduling import TRAIN_SCHEDULES_TEXT
from pipeplan.cli.flags import MEMORY_BUDGET_HELP
from pipeplan.core.errors import OutputError


def train(
    plan: str | None = typer.Option(None, "--plan", help="A plan file (pipeplan.plan/1)."),
    schedule: str | None = typer.Option(
        None,
        "--schedule",
        help=f"Schedule name ({TRAIN_SCHEDULES_TEXT}) or a schedule .csv/.json file.",
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
    timeline: str | None = typer.Option(
        None, "--timeline", help="Write the last iteration's measured timeline (Perfetto JSON; open in ui.perfetto.dev)."
    ),
    trace_out: str | None = typer.Option(None, "--trace", hidden=True, help="Deprecated: the old name of --timeline."),
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
    allreduce_bucket_mb: float | None = typer.Option(
        None,
        "--allreduce-bucket-mb",
        help="All-reduce a replicated stage's gradients in buckets of X MiB during its last backward, as PyTorch DDP "
        "(its default: 25), and predict the step so; default: one all-reduce after the backward.",
    ),
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
    from pipeplan.api.train import training

    if timeline is not None and trace_out is not None:
        raise OutputError(
            f"--trace is the old name of --timeline; give one of them (got --timeline {timeline!r} and --trace {trace_out!r})"
        )
    from pipeplan.api.train.train_flags import TrainFlags

    flags = TrainFlags(
        plan=plan, schedule=schedule, lr_reschedule=lr_reschedule, discrepancy_decay=discrepancy_decay,
        sync_warmup=sync_warmup, weight_prediction=weight_prediction, stages=stages, microbatches=microbatches, k=k,
        chunks=chunks, replicas=replicas, module=module, options=options, dataset=dataset, data=data, loss=loss,
        eval_fraction=eval_fraction, dtype=dtype, precision=precision, batch_size=batch_size, steps=steps,
        epochs=epochs, evaluate=evaluate, lr=lr, lr_schedule=lr_schedule, optimizer=optimizer, seed=seed,
        checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every, keep_last=keep_last, resume=resume,
        timeline=timeline if timeline is not None else trace_out,
        timeline_option="--timeline" if trace_out is None else "--trace",
        png=png, predict=predict, profile=profile, cluster=cluster, batch_scaling=batch_scaling,
        warmup_steps=warmup_steps, timeout=timeout, threads=threads, bandwidth_trace=bandwidth_trace,
        emulate_gb_per_s=emulate_gb_per_s, adaptive=adaptive, memory_budget=memory_budget,
        allreduce_bucket_mb=allreduce_bucket_mb, local=local, backend=backend, save_grads=save_grads, as_json=as_json,
        quiet=quiet,
    )  # fmt: skip
    code = training.train(flags)
    if code is not None:
        sys.exit(code)  # not typer.Exit: main() runs click with standalone_mode=False, which turns Exit into a return value


def register(app: typer.Typer) -> None:
    """Add `train` to app."""
    app.command("train")(train)
