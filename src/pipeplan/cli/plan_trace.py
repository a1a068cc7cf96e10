"""`plan --bandwidth-trace`: re-score the planner's finalists under the trace and report how that changed the choice."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from pipeplan.planner.request import PlanRequest, PlanResult
    from pipeplan.planner.search.trace_aware import TraceScore
    from pipeplan.sim.trace import BandwidthTrace


def choose_under_trace(
    result: PlanResult, request: PlanRequest, trace: BandwidthTrace, iterations: int | None
) -> tuple[PlanResult, list[TraceScore]]:
    """The plan with the least expected time under the trace among the search's finalists (the idle choice first),
    as a PlanResult with its idle-network simulation and memory, and every score."""
    import dataclasses

    from pipeplan.planner.search.trace_aware import rescore
    from pipeplan.sim.cost.memory import check_fits
    from pipeplan.sim.plan_sim import simulate_plan

    finalists = [result.plan, *result.extra.get("finalists", [])]
    scores = rescore(finalists, request.model, trace, iterations)
    best = scores[0].plan
    if best == result.plan:
        return result, scores
    sim = simulate_plan(best, request.model)
    memory = check_fits(best, request.model, sim)
    return dataclasses.replace(result, plan=best, sim=sim, memory_per_device=memory), scores


def trace_json(scores: list[TraceScore], idle: PlanResult) -> dict[str, Any]:
    """plan --json's "bandwidth_trace": every re-scored candidate, whether the choice changed, and by how much."""
    chosen = scores[0]
    before = next(s for s in scores if s.plan == idle.plan)
    return {
        "candidates": [s.to_json() for s in scores],
        "changed": chosen.plan != idle.plan,
        "idle_choice_expected_ms": before.expected_ms,
        "expected_ms": chosen.expected_ms,
        "expected_gain": before.expected_ms / chosen.expected_ms - 1.0,
    }


def print_trace_report(scores: list[TraceScore], idle: PlanResult) -> None:
    """A table of the re-scored candidates and one line saying whether (and how much) the trace changed the choice."""
    from rich.table import Table

    from pipeplan.viz.tables import format_ms, print_tables

    table = Table(title="finalists under the bandwidth trace (expected = mean iteration over a run that covers it)")
    for header in ("idle rank", "plan", "idle ms", "expected ms", "with"):
        table.add_column(header, justify="left" if header in ("plan", "with") else "right")
    for s in scores:
        p = s.plan
        shape = f"{p.schedule}{f' k={p.k}' if p.schedule == 'kfkb' else ''}{f' v={p.chunks}' if p.chunks > 1 else ''}"
        shape += f" {p.num_ranks}x{p.pipeline_replicas} m={p.microbatches}x{p.microbatch_size}"
        table.add_row(str(s.idle_rank + 1), shape, format_ms(s.idle_ms), format_ms(s.expected_ms), s.how)
    print_tables(table)
    chosen = scores[0]
    before = next(s for s in scores if s.plan == idle.plan)
    if chosen.plan == idle.plan:
        typer.echo(f"the trace did not change the choice: the idle-network plan is also the fastest under it "
                   f"({format_ms(chosen.expected_ms)} ms expected, {chosen.how})")  # fmt: skip
    else:
        typer.echo(
            f"the trace changed the choice: finalist {chosen.idle_rank + 1} of the idle-network ranking is expected "
            f"{before.expected_ms / chosen.expected_ms - 1:.1%} faster under it than the idle-network plan "
            f"({format_ms(chosen.expected_ms)} against {format_ms(before.expected_ms)} ms, {chosen.how})"
        )
