"""The `pipeplan` command: one typer app, one module per command group."""

from __future__ import annotations

import sys

import typer

from pipeplan.cli import (
    demo_cmd,
    plan_cmd,
    profile_cmd,
    schedule_cmd,
    show_cmd,
    simulate_cmd,
    train_cmd,
)
from pipeplan.core.errors import PipeplanError

app = typer.Typer(
    name="pipeplan",
    help="Plan, simulate and run pipeline-parallel training of large DNNs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)



@app.callback()
def _root() -> None:
    """Plan, simulate and run pipeline-parallel training of large DNNs."""


for _module in (schedule_cmd, simulate_cmd, show_cmd, profile_cmd, plan_cmd, train_cmd, demo_cmd):
    _module.register(app)


def main() -> None:
    """Run the CLI; a bad input prints one line on stderr and exits with code 2."""
    try:
        app()
    except PipeplanError as exc:
        first, *rest = str(exc).splitlines() or [""]
        print(f"error: {type(exc).__name__}: {first}", file=sys.stderr)
        for line in rest:
            print(line, file=sys.stderr)
        sys.exit(2)
    except (OSError, UnicodeDecodeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
