"""The demo's run: its steps (`STEPS`), each a function of a `DemoContext`, and `run_demo`, which `pipeplan demo`
calls (cli.demo.demo_cmd only parses; this module is imported when the demo runs, not at every command's start).

Later features add a step rather than editing the others. The steps on real
models live in cli.demo.demo_steps; each calls pipeplan.api, never a command line.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import typer

from pipeplan.cli.demo import demo_steps
from pipeplan.cli.demo.demo_steps import DemoContext, DemoSizes
from pipeplan.viz.json_print import print_json
from pipeplan.viz.tables import wide_console


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


def compare_schedules(ctx: DemoContext) -> None:
    """Simulate every case on the demo setting; print a comparison table; write a PNG and a Perfetto timeline for each."""
    from pipeplan.api.scheduling import simulate_schedule
    from pipeplan.viz.gantt import render_gantt
    from pipeplan.viz.perfetto import write_timeline
    from pipeplan.viz.tables import comparison_table

    s = ctx.setting
    costs = {"--fwd": repr(s.fwd_ms), "--bwd": repr(s.bwd_ms), "--comm": repr(s.comm_ms), "--act-bytes": str(s.act_bytes)}
    rows = []
    for case in CASES:
        result = simulate_schedule(case.name, s.stages, s.microbatches, costs, k=case.k, chunks=case.chunks, record=True).result
        rows.append((case.label, result))
        png, trace = ctx.out / f"{case.name}.png", ctx.out / f"{case.name}.trace.json"
        render_gantt(result, str(png), title=f"{case.label}, p={s.stages}, m={s.microbatches}")
        write_timeline(result, str(trace))
        ctx.wrote(png, trace)
    if ctx.report is not None:
        ctx.report["schedules"] = {"setting": s.describe(), "results": [{"label": label, **r.to_json()} for label, r in rows]}
        return
    ctx.console.print(f"[bold]0. The schedules pipeplan simulates, on one synthetic pipeline[/bold]\n   {s.describe()}",
                      highlight=False)  # fmt: skip
    ctx.console.print(comparison_table(rows, title=""))


STEPS: list[Callable[[DemoContext], None]] = [
    compare_schedules,
    demo_steps.gpt2_on_a100s,
    demo_steps.best_plan_files,
    demo_steps.chain_on_this_machine,
    demo_steps.pipemare_delays,
    demo_steps.adaptive_k,
    demo_steps.what_next,
]
"""The demo's steps, run in order."""

FILES = (*(f"{case.name}{suffix}" for case in CASES for suffix in (".png", ".trace.json")), *demo_steps.FILES)
"""The files the steps write under --out, checked before the first step (a step that writes more adds them here)."""


def run_demo(out: str, as_json: bool, quick: bool) -> None:
    """Check --out, run every step in order, then print the JSON report or the files written (`pipeplan demo`)."""
    import time

    from pipeplan.cli.declared_files import check_files
    from pipeplan.cli.demo.demo_manifest import check_folder

    check_files("demo")
    check_folder(out, FILES)
    out_dir = Path(out)
    out_dir.mkdir(exist_ok=True)
    sizes = demo_steps.QUICK if quick else DemoSizes()
    console = wide_console()
    ctx = DemoContext(out=out_dir, console=console, report={} if as_json else None, sizes=sizes)
    started = time.perf_counter()
    took: dict[str, float] = {}
    for step in STEPS:
        begun = time.perf_counter()
        step(ctx)
        took[step.__name__] = time.perf_counter() - begun
        if ctx.report is None:
            ctx.console.print(f"   [dim]({took[step.__name__]:.1f} s)[/dim]", highlight=False)
    seconds = time.perf_counter() - started
    if ctx.report is not None:
        print_json({**ctx.report, "quick": quick, "seconds": seconds, "step_seconds": took,
                    "written": [str(path) for path in ctx.written]})  # fmt: skip
        return
    # Plain echo: rich would wrap long paths, and paths must stay copyable.
    typer.echo(f"\nDone in {seconds:.0f} s. Wrote {len(ctx.written)} files (PNG timelines; the .trace.json "
               "timelines open in https://ui.perfetto.dev):")  # fmt: skip
    for path in ctx.written:
        typer.echo(f"  {path}")
