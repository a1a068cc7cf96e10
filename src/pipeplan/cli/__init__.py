"""The `pipeplan` command: one typer app, one module per command group."""

from __future__ import annotations

import sys

import typer
from typer._click.exceptions import ClickException, NoArgsIsHelpError

from pipeplan.api.failure import REPORTED, fail, fail_for
from pipeplan.cli import (
    adapt_cmd,
    plan_cmd,
    probe_cmd,
    profile_cmd,
    schedule_cmd,
    show_cmd,
    simulate_cmd,
    trace_cmd,
    train_cmd,
)
from pipeplan.cli.demo import demo_cmd

app = typer.Typer(
    name="pipeplan",
    help="Plan, simulate and run pipeline-parallel training of large DNNs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # help text is plain: '[planner's choice]' is a default, not Rich markup
)


@app.callback()
def _root() -> None:
    """Plan, simulate and run pipeline-parallel training of large DNNs."""


for _module in (
    schedule_cmd,
    simulate_cmd,
    show_cmd,
    profile_cmd,
    probe_cmd,
    plan_cmd,
    adapt_cmd,
    trace_cmd,
    train_cmd,
    demo_cmd,
):
    _module.register(app)


def main(argv: list[str] | None = None) -> None:
    """Run the CLI; a bad input prints one line on stderr and exits with code 2 (no traceback)."""
    command = typer.main.get_command(app)
    try:
        code = command.main(args=argv, prog_name="pipeplan", standalone_mode=False)
        # Without standalone mode, click returns typer.Exit's code instead of raising it.
        sys.exit(code if isinstance(code, int) else 0)
    except NoArgsIsHelpError as exc:
        print(exc.ctx.get_help() if exc.ctx else "", file=sys.stderr)
        sys.exit(2)
    except ClickException as exc:  # usage errors: bad or missing flags
        fail(exc.format_message() + "  (see pipeplan --help)")
    except REPORTED as exc:
        fail_for(exc)
        raise
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        print("aborted", file=sys.stderr)
        sys.exit(1)
