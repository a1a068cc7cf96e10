"""The `pipeplan` command: one typer app, one module per command group."""

from __future__ import annotations

import sys

import typer
from typer._click.exceptions import ClickException, NoArgsIsHelpError

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
from pipeplan.core.errors import PipeplanError

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


def _fail(message: str, code: int = 2) -> None:
    """Print an error on stderr (first line prefixed) and exit with `code` (2: a refusal, before any work)."""
    first, *rest = message.splitlines() or [""]
    if _in_job():  # a process of torchrun or --local: the same refusal is said once for the job, not once a rank
        from pipeplan.api.local import job_speaks

        if not job_speaks(f"error: {first}"):
            sys.exit(code)
    print(f"error: {first}", file=sys.stderr)
    for line in rest:
        print(line, file=sys.stderr)
    sys.exit(code)


def _in_job() -> bool:
    """Whether this process is one of several of a job (torchrun's or --local's variables: WORLD_SIZE above 1)."""
    import os

    world = os.environ.get("WORLD_SIZE", "")
    return world.isdigit() and int(world) > 1 and os.environ.get("RANK", "").isdigit()


def _allocation(message: str) -> str:
    """The part of torch's allocation failure that says how much was asked for."""
    asked = message.split("you tried to allocate ", 1)
    if len(asked) == 2:
        return f"torch tried to allocate {asked[1].split(' bytes', 1)[0]} bytes"
    return message.splitlines()[0][:200] if message else "torch could not allocate memory"


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
        _fail(exc.format_message() + "  (see pipeplan --help)")
    except (PipeplanError, OSError) as exc:
        from pipeplan.api.outputs import no_space_line

        full = no_space_line(exc)  # a full disk is found while writing, after the work: exit 1, naming the option
        if full is not None:
            _fail(full, code=1)
        _fail(f"{type(exc).__name__}: {exc}" if isinstance(exc, PipeplanError) else str(exc))
    except UnicodeDecodeError as exc:
        _fail(str(exc))
    except MemoryError:
        _fail("out of memory: the request is larger than this machine's memory (see docs/troubleshooting.md)")
    except RuntimeError as exc:  # torch's allocator: a size no limit could foresee (e.g. a model's activations)
        if "can't allocate memory" not in str(exc) and type(exc).__name__ != "OutOfMemoryError":
            raise
        _fail(f"out of memory: {_allocation(str(exc))} (see docs/troubleshooting.md)")
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        print("aborted", file=sys.stderr)
        sys.exit(1)
