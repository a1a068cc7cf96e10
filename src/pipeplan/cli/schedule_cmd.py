"""The `pipeplan schedule` command: print a generated schedule."""

from __future__ import annotations

import typer

from pipeplan.api.scheduling import ASYNCHRONOUS_NAMES, SCHEDULE_NAMES, schedule_of
from pipeplan.cli.flags import refuse_sizes_for_file
from pipeplan.core.errors import ScheduleError
from pipeplan.viz.json_print import print_json


def schedule(
    name: str = typer.Argument(
        ...,
        help=f"Schedule name: {', '.join(n for n in SCHEDULE_NAMES if n not in ASYNCHRONOUS_NAMES)}; or a schedule "
        ".csv/.json file to convert.",
    ),
    stages: int | None = typer.Option(None, "--stages", "-p", help="Pipeline ranks p (with a name)."),
    microbatches: int | None = typer.Option(None, "--microbatches", "-m", help="Microbatches m per iteration (with a name)."),
    k: int = typer.Option(1, "--k", help="Group size k for kfkb."),
    chunks: int = typer.Option(1, "--chunks", "-v", help="Chunks v per rank for interleaved-1f1b."),
    fmt: str = typer.Option("text", "--format", help="text, json or csv."),
    as_json: bool = typer.Option(False, "--json", help="Same as --format json."),
) -> None:
    """Generate a schedule (or read a schedule file) and print each rank's actions."""
    from pipeplan.io.schedule_io import schedule_to_csv, schedule_to_json

    if fmt not in ("text", "json", "csv"):
        raise ScheduleError(f"--format must be text, json or csv, got {fmt!r}")
    if as_json and fmt not in ("text", "json"):
        raise ScheduleError(f"--json and --format {fmt} disagree; give one of them")
    fmt = "json" if as_json else fmt
    refuse_sizes_for_file(name, stages, microbatches, k, chunks)
    sched = schedule_of(name, stages, microbatches, k=k, chunks=chunks)
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
