"""The demo's run: its steps (`STEPS`), each a function of a `DemoContext`, and `run_demo`, which `pipeplan demo`
calls (cli.demo_cmd only parses; this module is imported when the demo runs, not at every command's start).

Later features add a step rather than editing the others. The steps on real
models live in cli.demo_steps; each calls pipeplan.api, never a command line.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from pipeplan.cli import demo_steps
from pipeplan.cli.demo_steps import DemoSizes
from pipeplan.viz.json_print import print_json
from pipeplan.viz.tables import wide_console

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
    sizes: DemoSizes = field(default_factory=DemoSizes)
    best: Any = None
    """The fastest plan of step 1 (a PlanResult), and below the cost model it was scored with."""
    best_model: Any = None


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

    from pipeplan.api.outputs import Output, check_outputs

    check_outputs([Output("--out", out, folder=True)])
    check_outputs([Output(f"--out {out!r}: file", os.path.join(out, name)) for name in FILES if os.path.isdir(out)])
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
    typer.echo(f"\nDone in {seconds:.0f} s. Wrote {len(ctx.written)} files (PNG timelines; traces open in "
               "https://ui.perfetto.dev):")  # fmt: skip
    for path in ctx.written:
        typer.echo(f"  {path}")
