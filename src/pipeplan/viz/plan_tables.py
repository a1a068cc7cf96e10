"""Tables of plans (`plan`, `compare`, `plan --bandwidth-trace`): a plan's summary and stages, planners side by side."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rich.table import Table

from pipeplan.core.hardware.cluster import Cluster
from pipeplan.core.plan import Plan
from pipeplan.core.profile import ModelProfile
from pipeplan.planner.bound.plan_bound import PlanBound
from pipeplan.planner.compare import BASELINES, PlannerFailure, best_baseline, speedup
from pipeplan.planner.request import PlanResult
from pipeplan.planner.search.trace_aware import TraceScore
from pipeplan.schedules.registry import TAKES_K
from pipeplan.sim.cost.model import CostModel
from pipeplan.viz.tables import format_bytes, format_ms, id_runs


def plan_shape(plan: Plan) -> str:
    """A plan in one line: schedule (k, v), ranks x pipelines, microbatches x size: '1f1b 4x2 m=16x8'."""
    shape = f"{plan.schedule}{f' k={plan.k}' if plan.schedule == 'kfkb' else ''}{f' v={plan.chunks}' if plan.chunks > 1 else ''}"
    return shape + f" {plan.num_ranks}x{plan.pipeline_replicas} m={plan.microbatches}x{plan.microbatch_size}"


def stage_table(result: PlanResult) -> Table:
    """One row per (chunk-)stage: layers, devices (pipeline replica 0), replicas, F/B, all-reduce and optimizer ms, memory
    (the costs the plan result carries)."""
    plan = result.plan
    title = "stages (devices of pipeline replica 0; replicas = per stage x pipelines)"
    if plan.layer_order is not None:
        title += "; layers are positions in the plan's layer order (--json lists each stage's layers)"
    table = Table(title=title, title_justify="left")
    for header in ("stage", "rank", "layers", "devices", "replicas", "F ms", "B ms", "AR ms", "opt ms", "memory"):
        table.add_column(header, justify="right")
    for s, stage in enumerate(plan.stages):
        rank = s % plan.num_ranks
        cost = result.costs.stages[s]
        memory = max(result.memory_per_device[d] for d in plan.stages[rank].devices)
        layers = f"{stage.first_layer}-{stage.last_layer}" if stage.last_layer > stage.first_layer else str(stage.first_layer)
        table.add_row(
            str(s),
            str(rank),
            layers,
            id_runs(plan.replica_devices(s, 0)),
            f"{plan.replicas_of(s)}x{plan.pipeline_replicas}",
            format_ms(cost.fwd_ms),
            format_ms(cost.bwd_ms),
            format_ms(cost.allreduce_ms),
            format_ms(cost.optimizer_ms),
            format_bytes(memory),
        )
    return table


def plan_summary(result: PlanResult, profile: ModelProfile, cluster: Cluster, model: CostModel) -> Table:
    """Planner, schedule, batching, memory, iteration time (each shared parameter's exchange), efficiency and
    planning time."""
    plan, sim = result.plan, result.sim
    capacity = min(cluster.devices[d].memory_bytes for d in plan.all_devices)
    schedule = plan.schedule + (f" (k={plan.k})" if plan.schedule in TAKES_K else "")
    schedule += f" (v={plan.chunks})" if plan.chunks > 1 else ""
    table = Table(title=f"plan for {profile.name} on {cluster.name}", show_header=False, title_justify="left")
    table.add_column("quantity")
    table.add_column("value", justify="right")
    rows = [
        ("planner", result.planner),
        ("schedule", schedule),
        ("pipeline replicas", str(plan.pipeline_replicas)),
        ("microbatches x size", f"{plan.microbatches} x {plan.microbatch_size} (global batch {plan.global_batch})"),
        ("devices used", f"{len(plan.all_devices)} of {cluster.num_devices}"),
        ("peak memory / smallest device", f"{format_bytes(max(result.memory_per_device))} / {format_bytes(capacity)}"),
        ("costs", f"batch scaling {model.layers.mode}, optimizer {model.optimizer}"),
        ("iteration time (ms)", format_ms(result.iteration_time)),
        ("lower bound (ms)", format_ms(sim.lower_bound)),
        ("efficiency", f"{sim.efficiency:.1%}"),
        ("bubble fraction", f"{sim.bubble_fraction:.1%}"),
        ("planning time (s)", f"{result.planning_seconds:.2f}"),
    ]
    for x in result.costs.shared:  # a shared parameter split over stages: its gradient exchange every iteration
        rows.insert(-4, (f"shared {x.name} (ms)", f"{format_ms(x.exchange_ms)} on stages {', '.join(map(str, x.stages))}"))
    for name, value in rows:
        table.add_row(name, value)
    return table


def planners_table(
    title: str, rows: Sequence[PlanResult | PlannerFailure], bounds: Mapping[str, PlanBound] | None = None
) -> Table:
    """Every planner's plan side by side (`compare`): time, speed-up over the best baseline, memory, planning time,
    and with `bounds` (planner name -> its plan against its class's bound) the time over that bound."""
    baseline = best_baseline(rows)
    table = Table(title=title, title_justify="left")
    headers = ["planner", "iteration ms", "speed-up", "peak memory", "planning s", "plan"]
    if bounds is not None:
        headers.insert(3, "over bound")
    for header in headers:
        table.add_column(header, justify="left" if header in ("planner", "plan") else "right")
    for r in rows:
        if not isinstance(r, PlanResult):
            cells = [r.planner, "-", "-", "-", f"{r.planning_seconds:.2f}", "no plan (below)"]
        else:
            ratio = speedup(r, baseline)
            cells = [
                r.planner,
                format_ms(r.iteration_time),
                "-" if ratio is None else f"{ratio:.2f}x",
                format_bytes(max(r.memory_per_device)),
                f"{r.planning_seconds:.2f}",
                plan_shape(r.plan),
            ]
        if bounds is not None:
            cells.insert(3, f"{bounds[r.planner].gap:.3f}x" if r.planner in bounds else "-")
        table.add_row(*cells)
    return table


def bound_line(measured: PlanBound) -> str:
    """`plan --bound`: the proven lower bound of the plan's class, where it binds, and the plan's time over it."""
    b = measured.bound
    return (
        f"proven lower bound over {measured.of}: {format_ms(b.ms)} ms (binding term {b.term} at {b.pipelines} "
        f"pipeline(s) x microbatch {b.microbatch_size}); this plan is {measured.gap:.3f}x it: no plan of its class is "
        f"more than {1 - 1 / measured.gap:.1%} faster"
    )


def budget_line(row: PlanResult | PlannerFailure) -> str | None:
    """`plan` and `compare`: one line when a planner's time budget stopped its search (planner.time_budget), saying
    the plan is the best found in the budget and how far the search got; None otherwise (or for a failure)."""
    planning = row.extra.get("planning", {}) if isinstance(row, PlanResult) else {}
    if not planning.get("stopped_early"):
        return None
    where = f"phase {planning['phase_reached']} ({' > '.join(planning['phases_open'])})"
    got = planning if "simulations" in planning else row.extra  # how far it got: the stopped search's counts
    counts = f"{got['simulations']:,} simulations, {got['candidates']:,} candidates" if "simulations" in got else ""
    return (
        f"time budget: {row.planner}'s plan is the best found in {planning['time_budget_s']:g} s; the search stopped in "
        f"{where}{' after ' + counts if counts else ''}; give --time-budget none (or more seconds) to search it all"
    )


def tensor_line(result: PlanResult) -> str:
    """`plan`: one line on pipeplan's 3D search (planner.search.tensor_grid): the plan's t x p x d, its ZeRO stage and
    why, sequence parallelism, and the times of the best plain (t = 1) plan and the Megatron-style grid."""
    info, plan = result.extra["tensor"], result.plan
    stage = plan.stages[0]
    d = plan.data_parallel_of(0)

    def ms(value: float | None) -> str:
        return "none fits" if value is None else f"{value:.4g} ms"

    flat = ms(result.extra.get("flat_ms")) if result.extra.get("flat_searched") else "not searched (t or zero forced)"
    return (
        f"3D: t x p x d = {stage.tp} x {plan.num_ranks} x {d}, zero {plan.zero}, sequence parallel "
        f"{'on' if stage.sequence_parallel else 'off'}; best 3D plan's zero: {info['zero_reason']}; best t = 1 plan "
        f"{flat}, Megatron-style grid {ms(info['megatron_ms'])}"
    )


def trace_table(scores: Sequence[TraceScore]) -> Table:
    """The finalists re-scored under a bandwidth trace (`plan --bandwidth-trace`)."""
    table = Table(title="finalists under the bandwidth trace (expected = mean iteration over a run that covers it)")
    for header in ("idle rank", "plan", "idle ms", "expected ms", "with"):
        table.add_column(header, justify="left" if header in ("plan", "with") else "right")
    for s in scores:
        table.add_row(str(s.idle_rank + 1), plan_shape(s.plan), format_ms(s.idle_ms), format_ms(s.expected_ms), s.how)
    return table


def trace_verdict(scores: Sequence[TraceScore], idle: PlanResult) -> str:
    """One line: whether the bandwidth trace changed the planner's choice, and by how much."""
    chosen = scores[0]
    before = next(s for s in scores if s.plan == idle.plan)
    if chosen.plan == idle.plan:
        return (
            "the trace did not change the choice: the idle-network plan is also the fastest under it "
            f"({format_ms(chosen.expected_ms)} ms expected, {chosen.how})"
        )
    return (
        f"the trace changed the choice: finalist {chosen.idle_rank + 1} of the idle-network ranking is expected "
        f"{before.expected_ms / chosen.expected_ms - 1:.1%} faster under it than the idle-network plan "
        f"({format_ms(chosen.expected_ms)} against {format_ms(before.expected_ms)} ms, {chosen.how})"
    )


def failure_lines(rows: Sequence[PlanResult | PlannerFailure]) -> list[str]:
    """Each failed planner's reason, one line each (printed under `planners_table`)."""
    return [f"{r.planner}: {r.error}" for r in rows if not isinstance(r, PlanResult)]


BOUND_NOTE = "over bound: this time / the proven lower bound of its plan's class ({bounds}; planner.bound.plan_bound)"
"""Printed under `planners_table` with bounds; {bounds} lists each class's bound."""
SPEEDUP_NOTE = f"speed-up: best baseline ({', '.join(BASELINES)}) time / this time; plan: ranks x pipelines"
"""Printed under `planners_table`."""


def adaptive_line(plan: Plan) -> str:
    """One line: a plan's adaptive setting (start k, the k a run may pick, the memory budget)."""
    setting = plan.adaptive
    if setting is None:
        return "adaptive: none (k stays fixed)"
    ks = setting.k_choices
    shown = ",".join(map(str, ks)) if len(ks) <= 8 else f"{ks[0]}..{ks[-1]} ({len(ks)} values)"
    return (
        f"adaptive: starts at k={plan.k} (the fastest at nominal bandwidth); k {shown} fit the memory budget "
        f"{format_bytes(setting.memory_budget_bytes)} per device"
    )
