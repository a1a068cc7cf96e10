"""The `pipeplan demo` command: the main job end to end, on real models, in a few minutes (`--quick`: under one).

The command parses its flags and calls cli.demo.demo_run.run_demo (the steps), imported only when the demo runs.
"""

from __future__ import annotations

import typer


def demo(
    out: str = typer.Option("out", "--out", help="Directory for the timelines (PNG and Perfetto)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object (what every step found, the files written)."),
    quick: bool = typer.Option(False, "--quick", help="The same steps on smaller sizes: under a minute (CI)."),
) -> None:
    """Run the main job end to end: GPT-2 planned on A100s against the baselines, the profile-probe-plan-train chain on
    this machine (predicted against measured), PipeMare and Ada-Grouper; writes plans, timelines and traces."""
    from pipeplan.cli.demo.demo_run import run_demo

    run_demo(out, as_json, quick)


def register(app: typer.Typer) -> None:
    """Add `demo` to app."""
    app.command("demo")(demo)
