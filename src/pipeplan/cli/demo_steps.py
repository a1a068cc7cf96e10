"""The demo's steps on real models: GPT-2 planned on two A100 servers, the whole chain on this machine, the seeds'
other ideas, and what to try next. Each step calls pipeplan.api (or the library under it), never a command line."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from pipeplan.cli.demo_run import DemoContext


@dataclass(frozen=True, slots=True)
class DemoSizes:
    """How big each step runs: the full demo (`make demo`, a few minutes on two cores) or --quick (CI, under a minute)."""

    gpt2: str = "gpt2-small"
    gpt2_batch: int = 32
    gpu: str = "A100"
    cluster: str = "a100-8x2"
    global_batch: int = 256
    local_options: tuple[tuple[str, str], ...] = (("hidden", "1024"), ("blocks", "8"))
    local_batch: int = 64
    local_runs: int = 5
    processes: int = 2
    probe_steps: int = 8
    probe_rounds: int = 5
    train_steps: int = 30
    adapt_iterations: int = 24


QUICK = DemoSizes(
    gpt2_batch=8,
    global_batch=64,
    local_options=(("hidden", "512"), ("blocks", "4")),
    local_batch=32,
    local_runs=3,
    probe_steps=2,
    probe_rounds=2,
    train_steps=8,
    adapt_iterations=6,
)
"""--quick: the same steps on smaller sizes."""

GPT2_PROFILE, GPT2_PLAN, BEST_PNG, BEST_TRACE = "gpt2-a100.json", "gpt2-plan.json", "plan_best.png", "plan_best.trace.json"
LOCAL_PROFILE, LOCAL_CLUSTER, LOCAL_PLAN, ADAPT_PNG = "local-profile.json", "local-cluster.json", "local-plan.json", "adapt.png"
FILES = (GPT2_PROFILE, GPT2_PLAN, BEST_PNG, BEST_TRACE, LOCAL_PROFILE, LOCAL_CLUSTER, LOCAL_PLAN, ADAPT_PNG)
"""The files these steps write under --out."""


def say(ctx: DemoContext, text: str) -> None:
    """A line for the reader (nothing with --json)."""
    if ctx.report is None:
        ctx.console.print(text, highlight=False, soft_wrap=True)


def heading(ctx: DemoContext, text: str) -> None:
    """The line that opens a step."""
    if ctx.report is None:
        ctx.console.print(f"\n[bold]{text}[/bold]", highlight=False)


def _bars(ctx: DemoContext) -> bool:
    """Whether to draw progress bars: not under --json, and only where stderr is a terminal."""
    import sys

    return ctx.report is None and sys.stderr.isatty()


@contextmanager
def waiting(ctx: DemoContext, what: str, total: int | None = None) -> Iterator[Callable[[int, int], None]]:
    """A rich progress bar (a spinner without `total`) on stderr while the block runs; yields update(done, total)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    if ctx.report is not None or not console.is_terminal:
        yield lambda done, of: None
        return
    columns = [SpinnerColumn(), TextColumn(what), BarColumn(), TimeElapsedColumn()]
    if total is not None:
        columns.insert(3, MofNCompleteColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task(what, total=total)
        yield lambda done, of: bar.update(task, completed=done, total=of) if total is not None else None


def gpt2_on_a100s(ctx: DemoContext) -> None:
    """GPT-2 built from its configuration, projected onto A100s, planned by every fast planner on two A100 servers."""
    from pipeplan import api
    from pipeplan.cli.plan_cmd import print_comparison
    from pipeplan.io.profile_json import write_profile_json
    from pipeplan.planner.compare import Comparison
    from pipeplan.viz.progress import progress_display

    z = ctx.sizes
    heading(ctx, f"1. Plan {z.gpt2} on two 8-GPU {z.gpu} servers, against DAPPLE, PipeDream and a balanced split")
    say(
        ctx,
        f"   Building {z.gpt2} from its published configuration (random weights, nothing downloaded) and projecting "
        f"every layer onto an {z.gpu} from its counted FLOPs and bytes (roofline), at batch sizes 1..{z.gpt2_batch}.",
    )
    with waiting(ctx, f"projecting {z.gpt2} onto {z.gpu}"):
        profile = api.profile_model(z.gpt2, z.gpt2_batch, project_to=z.gpu)
    path = ctx.out / GPT2_PROFILE
    write_profile_json(profile, path)
    ctx.wrote(path)
    say(
        ctx,
        f"   {profile.num_layers} layers, {profile.total_param_bytes / 2**30:.2f} GiB of fp32 weights; profile written to {path}",
    )
    say(
        ctx,
        f"   Planning on the built-in cluster {z.cluster} (16 {z.gpu}s, NVSwitch inside a server, HDR InfiniBand between), "
        f"global batch {z.global_batch}; every plan is scored by the same simulator:",
    )
    with progress_display(ctx.report is None) as progress:
        run = api.compare(
            profile, z.cluster, z.global_batch, planners=["pipeplan", "dapple", "pipedream", "balanced"], progress=progress
        )
    table = Comparison(str(path), z.cluster, profile.name, run.request, run.rows)
    if ctx.report is not None:
        ctx.report["planners"] = {"profile": str(path), "cluster": z.cluster, "global_batch": z.global_batch, **table.to_json()}
    else:
        print_comparison(table)
    best = run.best
    if best is None:
        raise typer.Exit(1)
    ctx.best, ctx.best_model = best, run.request.model


def best_plan_files(ctx: DemoContext) -> None:
    """The winning plan's file, its simulated timeline as a PNG and as a Perfetto trace."""
    from pipeplan import api
    from pipeplan.sim.plan_sim import simulate_plan
    from pipeplan.viz.gantt import render_gantt
    from pipeplan.viz.perfetto import write_trace

    best, z = ctx.best, ctx.sizes
    heading(ctx, "2. The winning plan: its file, its timeline and a trace")
    plan_path, png, trace = ctx.out / GPT2_PLAN, ctx.out / BEST_PNG, ctx.out / BEST_TRACE
    api.save_plan(best.plan, str(plan_path), GPT2_PROFILE, z.cluster)
    timeline = simulate_plan(best.plan, ctx.best_model, record=True)
    render_gantt(timeline, str(png), title=f"{best.planner}: {z.gpt2} on {z.cluster}")
    write_trace(timeline, str(trace))
    ctx.wrote(plan_path, png, trace)
    p = best.plan
    say(
        ctx,
        f"   {best.planner}: {p.schedule}, {p.num_ranks} stages x {p.pipeline_replicas} pipeline replicas, "
        f"{p.microbatches} microbatches of {p.microbatch_size}; {best.iteration_time:.1f} ms per iteration",
    )
    say(ctx, f"   plan      {plan_path}\n   timeline  {png}\n   trace     {trace}  (open in https://ui.perfetto.dev)")
    if ctx.report is not None:
        ctx.report["best_plan"] = {
            "planner": best.planner,
            "iteration_time": best.iteration_time,
            "plan": str(plan_path),
            "png": str(png),
            "trace": str(trace),
        }


def chain_on_this_machine(ctx: DemoContext) -> None:
    """profile -> probe -> plan -> train on local processes, the plan's prediction beside the measured step."""
    from pipeplan import api
    from pipeplan.io.profile_json import write_profile_json
    from pipeplan.viz.progress import progress_display

    z = ctx.sizes
    options = dict(z.local_options)
    name = f"mlp ({', '.join(f'{k} {v}' for k, v in z.local_options)})"
    heading(ctx, f"3. The same chain on this machine: profile, probe, plan and train {name} on {z.processes} processes")
    say(
        ctx,
        f"   Measuring every layer's forward, backward and optimizer step at batch sizes 1..{z.local_batch} "
        "(one thread, as training runs):",
    )
    profile = api.profile_model("mlp", z.local_batch, options=options, runs=z.local_runs, warmup=2, progress=_bars(ctx))
    paths = {key: ctx.out / file for key, file in (("profile", LOCAL_PROFILE), ("cluster", LOCAL_CLUSTER), ("plan", LOCAL_PLAN))}
    write_profile_json(profile, paths["profile"])
    say(
        ctx,
        f"   Probing {z.processes} local processes: each one's speed on this model, the links between them, the "
        "all-reduce and what each message costs:",
    )
    with waiting(ctx, f"probing {z.processes} processes", None) as update:
        cluster = api.probe_local(
            z.processes,
            str(paths["profile"]),
            steps=z.probe_steps,
            rounds=z.probe_rounds,
            name=f"local-{z.processes}",
            out=str(paths["cluster"]),
            on_progress=update,
        )
    speeds = ", ".join(f"{d.speed:.3f}" for d in cluster.devices)
    say(
        ctx,
        f"   speeds {speeds} (1.0: the profile's own process); link {cluster.bandwidth_bytes_per_s[0, 1] / 1e9:.2f} GB/s, "
        f"message overhead {cluster.message_overhead_s * 1e6:.0f} us",
    )
    with progress_display(ctx.report is None) as progress:
        result = api.plan(profile, cluster, z.local_batch, progress=progress)
    api.save_plan(result.plan, str(paths["plan"]), LOCAL_PROFILE, LOCAL_CLUSTER)
    ctx.wrote(*paths.values())
    p = result.plan
    say(
        ctx,
        f"   plan: {p.schedule}, {p.num_ranks} stage(s) on {len(p.all_devices)} process(es), {p.microbatches} "
        f"microbatch(es) of {p.microbatch_size}; predicted {result.iteration_time:.2f} ms per step",
    )
    say(ctx, f"   Training the plan for {z.train_steps} steps on {len(p.all_devices)} local process(es) (gloo, loopback):")
    with waiting(ctx, "training", z.train_steps) as update:
        run = api.train_local(p, str(paths["profile"]), str(paths["cluster"]), steps=z.train_steps, on_progress=update)
    measured, predicted = run.measured_step_ms, run.predicted_step_ms
    say(ctx, f"   loss {run.losses[0]:.4f} at step 1 -> {run.losses[-1]:.4f} at step {len(run.losses)}")
    if measured is not None and predicted is not None:
        say(
            ctx,
            f"   predicted {predicted:.2f} ms per step, measured {measured:.2f} ms (median after warm-up): "
            f"measured/predicted = {measured / predicted:.3f}",
        )
        say(ctx, "   (on a busy machine the processes share cores with others, and the measured step grows with them)")
    if ctx.report is not None:
        ctx.report["local"] = {
            "profile": str(paths["profile"]),
            "cluster": str(paths["cluster"]),
            "plan": str(paths["plan"]),
            "speeds": [d.speed for d in cluster.devices],
            "schedule": p.schedule,
            "processes": len(p.all_devices),
            "losses": run.losses,
            "step_ms": run.step_ms,
            "measured_step_ms": measured,
            "predicted_step_ms": predicted,
        }


def pipemare_delays(ctx: DemoContext) -> None:
    """PipeMare's asynchronous pipeline against 1F1B on one synthetic pipeline: delays, weight copies, utilization."""
    from pipeplan.schedules import make_schedule
    from pipeplan.schedules.pipemare import pipemare
    from pipeplan.sim import simulate, uniform_costs
    from pipeplan.sim.steady import steady_state

    p, m, fwd, bwd = 4, 4, 1.0, 2.0
    heading(ctx, "4. The seeds' other ideas. PipeMare: asynchronous pipelining, no flush")
    stream = pipemare(p, m)
    state = steady_state(stream, simulate(stream, uniform_costs(stream, fwd, bwd), record=True), m)
    flushed = make_schedule("1f1b", p, m)
    sync = simulate(flushed, uniform_costs(flushed, fwd, bwd))
    say(
        ctx,
        f"   p={p} stages, m={m} microbatches, F={fwd:g} ms, B={bwd:g} ms. 1F1B flushes every minibatch: "
        f"{1 - sync.bubble_fraction:.1%} of the ranks' time busy.",
    )
    say(
        ctx,
        f"   PipeMare streams minibatches: {state.utilization:.1%} busy in the steady state, at the price of stale "
        f"weights: stage delays {list(state.delays)} optimizer steps (stage 0 first), weight copies "
        f"{list(state.weight_copies)} (weight stashing would keep {list(state.stashed_weight_copies)}).",
    )
    say(ctx, "   Train it: pipeplan train --local 4 --schedule pipemare -p 4 -m 4 --lr-reschedule 10 --discrepancy-decay 0.5")
    if ctx.report is not None:
        ctx.report["pipemare"] = {
            "stages": p,
            "microbatches": m,
            "one_f_one_b_utilization": 1 - sync.bubble_fraction,
            **state.to_json(),
        }


def adaptive_k(ctx: DemoContext) -> None:
    """Ada-Grouper's controller against fixed 1F1B under a preempted network, all simulated."""
    from pipeplan import api
    from pipeplan.adapt.fixed_baselines import compare_policies
    from pipeplan.adapt.pipeline import PipelineModel
    from pipeplan.sim.cost.model import CostModel
    from pipeplan.sim.trace_gen import markov_trace
    from pipeplan.viz.adapt_plot import render_adapt

    profile, cluster, n = "dapple/bert-48", "pcie-4x4-10g", ctx.sizes.adapt_iterations
    heading(ctx, "   Ada-Grouper: kFkB with k chosen at every iteration while the network is preempted")
    machines = api.load_cluster(cluster)
    plan = api.plan(profile, machines, 128, microbatch_size=4, schedule="1f1b").plan
    links = [(a.id, b.id) for a in machines.devices for b in machines.devices if a.node != b.node]
    trace = markov_trace(7, 12_000.0, 18_000.0, (0.1, 0.5), 4_000.0 * n, links)
    model = CostModel.build(api.load_profile(profile), machines)
    pipeline = PipelineModel.from_plan(plan, model, trace)
    with waiting(ctx, f"{n} iterations of every policy"):
        comparison = compare_policies(pipeline, trace, n)
    png = ctx.out / ADAPT_PNG
    render_adapt(comparison, pipeline, trace, str(png), title=f"{profile} on {cluster}, inter-node links preempted")
    ctx.wrote(png)
    runs = comparison.policies
    say(
        ctx,
        f"   {profile} on {cluster} (1F1B plan, {plan.num_ranks} stages), the links between servers slowed to "
        f"0.1-0.5x in random bursts, {n} iterations:",
    )
    for name in ("1f1b", "adaptive", "best_static", "oracle"):
        run = runs[name]
        used = sorted(set(run.k))
        say(ctx, f"   {name:<12} {run.total_ms / 1000:8.2f} s  {comparison.speedup(name):.3f}x vs 1F1B  k {used}")
    say(ctx, f"   plot: {png}")
    if ctx.report is not None:
        ctx.report["adaptive"] = {
            "profile": profile,
            "cluster": cluster,
            "iterations": n,
            **{name: {"total_ms": runs[name].total_ms, "k": runs[name].k} for name in runs},
        }


NEXT = (
    ("your model", "pipeplan profile your_package.module:factory -b 64 -o mine.json   (or --project-to H100 for a GPU)"),
    (
        "your cluster",
        "pipeplan probe --local 2 --profile mine.json --module your_package.module:factory --out cluster.json   "
        "(torchrun on your nodes, or a cluster JSON: docs/formats.md)",
    ),
    ("a plan", "pipeplan plan --profile mine.json --cluster cluster.json --global-batch 64 --out plan.json"),
    (
        "run it",
        "pipeplan train --local 2 --plan plan.json --module your_package.module:factory --steps 100   (torchrun "
        "--nnodes N ... train --plan on GPUs)",
    ),
    ("compare", "pipeplan compare --profile mine.json --cluster a100-8x2 --global-batch 256 --png best.png"),
    ("from Python", "import pipeplan; pipeplan.plan(...), pipeplan.pipeline(...)   (docs/api.md)"),
)
"""The commands the last step names."""


def what_next(ctx: DemoContext) -> None:
    """The commands for the user's own model and cluster."""
    heading(ctx, "5. What to try next")
    for what, command in NEXT:
        say(ctx, f"   {what:<13} {command}")
    if ctx.report is not None:
        ctx.report["next"] = [command for _, command in NEXT]
