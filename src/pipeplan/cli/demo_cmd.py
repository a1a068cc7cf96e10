"""The `pipeplan demo` command: a short tour that prints tables and writes timelines under out/.

The demo is a list of steps (`STEPS`), each a function of a `DemoContext`;
later features add a step rather than editing the others.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from pipeplan.viz.json_print import print_json

MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class DemoSetting:
    """The synthetic pipeline every schedule in the demo runs on."""

    stages: int = 4
    microbatches: int = 8
    fwd_ms: float = 1.0
    bwd_ms: float = 2.0
    comm_ms: float = 0.25
    act_bytes: int = 64 * MIB

    def describe(self) -> str:
        """One line naming the setting."""
        return (
            f"p={self.stages}, m={self.microbatches}, F={self.fwd_ms:g} ms, B={self.bwd_ms:g} ms, "
            f"transfers {self.comm_ms:g} ms, {self.act_bytes // MIB} MiB saved per microbatch"
        )


@dataclass(frozen=True, slots=True)
class DemoCase:
    """One schedule to simulate: `label` in the table, `name` for make_schedule and the file names."""

    label: str
    name: str
    k: int = 1
    chunks: int = 1


CASES = (
    DemoCase("gpipe", "gpipe"),
    DemoCase("1f1b", "1f1b"),
    DemoCase("kfkb k=2", "kfkb", k=2),
    DemoCase("interleaved-1f1b v=2", "interleaved-1f1b", chunks=2),
    DemoCase("zb-h1", "zb-h1"),
)


@dataclass
class DemoContext:
    """What the steps share: where to write, where to print, and the files written so far."""

    out: Path
    console: Console
    setting: DemoSetting = field(default_factory=DemoSetting)
    written: list[Path] = field(default_factory=list)
    report: dict[str, Any] | None = None
    """With --json: what each step found, printed as one object at the end (tables are not printed)."""


def compare_schedules(ctx: DemoContext) -> None:
    """Simulate every case on the demo setting; print a comparison table; write a PNG and a trace for each."""
    from pipeplan.schedules import make_schedule
    from pipeplan.sim import simulate
    from pipeplan.sim.cost.synthetic import rank_costs
    from pipeplan.viz.gantt import render_gantt
    from pipeplan.viz.perfetto import write_trace
    from pipeplan.viz.tables import comparison_table

    s = ctx.setting
    rows = []
    for case in CASES:
        schedule = make_schedule(case.name, s.stages, s.microbatches, k=case.k, chunks=case.chunks)
        costs = rank_costs(schedule, s.fwd_ms, s.bwd_ms, s.comm_ms, float(s.act_bytes))
        result = simulate(schedule, costs, record=True)
        rows.append((case.label, result))
        png, trace = ctx.out / f"{case.name}.png", ctx.out / f"{case.name}.trace.json"
        render_gantt(result, str(png), title=f"{case.label}, p={s.stages}, m={s.microbatches}")
        write_trace(result, str(trace))
        ctx.written += [png, trace]
    if ctx.report is not None:
        ctx.report["schedules"] = {"setting": s.describe(), "results": [{"label": label, **r.to_json()} for label, r in rows]}
        return
    ctx.console.print(f"Schedules compared on one pipeline:\n  {s.describe()}", highlight=False)
    ctx.console.print(comparison_table(rows, title=""))


PLAN_PROFILE, PLAN_CLUSTER, PLAN_BATCH = "dapple/bert-48", "v100-8x2-25g", 256
"""The real planning problem of the demo: a measured BERT-48 profile on two DGX-1 servers over 25 Gb/s."""
PLANNERS = ("pipeplan", "dapple", "pipedream", "balanced")
"""The fast planners the demo compares (exact is left out: it takes minutes)."""


def compare_planners(ctx: DemoContext) -> None:
    """Plan a real profile on a real topology with every fast planner; write the best plan and its timeline."""
    from pipeplan.cli.plan_cmd import draw_best, print_comparison
    from pipeplan.planner.compare import run_comparison
    from pipeplan.viz.progress import progress_display

    png = ctx.out / "plan_best.png"
    quiet = ctx.report is not None
    if not quiet:
        ctx.console.print(
            f"\nPlanners compared on {PLAN_PROFILE} over {PLAN_CLUSTER}, global batch {PLAN_BATCH} "
            "(all plans scored by the same simulator):",
            highlight=False,
        )
    with progress_display(not quiet) as progress:
        run = run_comparison(PLAN_PROFILE, PLAN_CLUSTER, PLAN_BATCH, list(PLANNERS), progress)
    if ctx.report is not None:
        ctx.report["planners"] = {"profile": PLAN_PROFILE, "cluster": PLAN_CLUSTER, "global_batch": PLAN_BATCH, **run.to_json()}
    else:
        print_comparison(run)
    draw_best(run, str(png))
    ctx.written.append(png)


STEPS: list[Callable[[DemoContext], None]] = [compare_schedules, compare_planners]
"""The demo's steps, run in order."""

FILES = (*(f"{case.name}{suffix}" for case in CASES for suffix in (".png", ".trace.json")), "plan_best.png")
"""The files the steps write under --out, checked before the first step (a step that writes more adds them here)."""


def demo(
    out: str = typer.Option("out", "--out", help="Directory for the timelines (PNG) and Perfetto traces."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object (both comparisons, the files written)."),
) -> None:
    """Compare the built-in schedules on one pipeline; write timeline PNGs and Perfetto traces."""
    from pipeplan.cli.outputs import Output, check_outputs

    check_outputs([Output("--out", out, folder=True)])
    check_outputs([Output(f"--out {out!r}: file", os.path.join(out, name)) for name in FILES if os.path.isdir(out)])
    out_dir = Path(out)
    out_dir.mkdir(exist_ok=True)
    ctx = DemoContext(out=out_dir, console=Console(), report={} if as_json else None)
    for step in STEPS:
        step(ctx)
    if ctx.report is not None:
        print_json({**ctx.report, "written": [str(path) for path in ctx.written]})
        return
    # Plain echo: rich would wrap long paths, and paths must stay copyable.
    typer.echo(f"\nWrote {len(ctx.written)} files (PNG timelines; traces open in https://ui.perfetto.dev):")
    for path in ctx.written:
        typer.echo(f"  {path}")


def register(app: typer.Typer) -> None:
    """Add `demo` to app."""
    app.command("demo")(demo)
