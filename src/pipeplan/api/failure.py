"""An error turned into the one line the user reads: stderr, `error: <Kind>Error: ...`, exit 2 for a refusal (1 for a
full disk or memory found while working); said once for a job of several processes, not once a rank. The CLI's
main and train's --local workers end through here."""

from __future__ import annotations

import os
import sys

from pipeplan.core.errors import PipeplanError

REPORTED = (PipeplanError, OSError, UnicodeDecodeError, MemoryError, RuntimeError)
"""The exceptions `fail_for` may turn into one line (others, and a RuntimeError that is no allocation failure, are
bugs: their traceback is shown)."""


def fail_for(exc: BaseException) -> None:
    """Exit with the one line `exc` gives (see the module's docstring); return when it is not one of those."""
    if isinstance(exc, (PipeplanError, OSError)):
        from pipeplan.api.outputs import no_space_line

        full = no_space_line(exc)  # a full disk is found while writing, after the work: exit 1, naming the option
        if full is not None:
            fail(full, code=1)
        fail(f"{type(exc).__name__}: {exc}" if isinstance(exc, PipeplanError) else str(exc))
    if isinstance(exc, UnicodeDecodeError):
        fail(str(exc))
    if isinstance(exc, MemoryError):
        fail("out of memory: the request is larger than this machine's memory (see docs/troubleshooting.md)")
    if isinstance(exc, RuntimeError) and ("can't allocate memory" in str(exc) or type(exc).__name__ == "OutOfMemoryError"):
        fail(f"out of memory: {_allocation(str(exc))} (see docs/troubleshooting.md)")  # torch's allocator


def fail(message: str, code: int = 2) -> None:
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
    world = os.environ.get("WORLD_SIZE", "")
    return world.isdigit() and int(world) > 1 and os.environ.get("RANK", "").isdigit()


def _allocation(message: str) -> str:
    """The part of torch's allocation failure that says how much was asked for."""
    asked = message.split("you tried to allocate ", 1)
    if len(asked) == 2:
        return f"torch tried to allocate {asked[1].split(' bytes', 1)[0]} bytes"
    return message.splitlines()[0][:200] if message else "torch could not allocate memory"
