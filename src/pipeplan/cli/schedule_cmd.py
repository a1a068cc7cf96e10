"""The `pipeplan schedule` command: print a generated schedule."""

from __future__ import annotations

import typer

from pipeplan.cli.common import print_json
from pipeplan.core.errors import ScheduleError
from pipeplan.core.validate import validate
from pipeplan.schedules import make_schedule


def schedule(
    name: str = typer.Argument(..., help="Schedule name: gpipe, 1f1b, kfkb, interleaved-1f1b, zb-h1."),
    stages: int = typer.Option(..., "--stages", "-p", help="Pipeline ranks p."),
    microbatches: int = typer.Option(..., "--microbatches", "-m", help="Microbatches m per iteration."),
    k: int = typer.Option(1, "--k", help="Group size k for kfkb."),
    chunks: int = typer.Option(1, "--chunks", "-v", help="Chunks v per rank for interleaved-1f1b."),
    fmt: str = typer.Option("text", "--format", help="text, json or csv."),
) -> None:
    """Generate a schedule and print each rank's actions."""
    from pipeplan.io.schedule_io import schedule_to_csv, schedule_to_json

    if fmt not in ("text", "json", "csv"):
        raise ScheduleError(f"--format must be text, json or csv, got {fmt!r}")
    sched = validate(make_schedule(name, stages, microbatches, k=k, chunks=chunks))
    if fmt == "json":
        print_json(schedule_to_json(sched))
    elif fmt == "csv":
        typer.echo(schedule_to_csv(sched), nl=False)
    else:
        width = max(len(str(a)) for rank in sched.ranks for a in rank)
        for r, actions in enumerate(sched.ranks):
            typer.echo(f"rank {r}: " + " ".join(str(a).ljust(width) for a in actions).rstrip())


def register(app: typer.Typer) -> None:
    """Add `schedule` to app."""
    app.command("schedule")(schedule)
