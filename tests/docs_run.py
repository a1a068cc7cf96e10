"""Run a document's examples in order in one temporary folder, and compare (or refresh) the output it shows.

Each command runs in bash with `pipeplan` a console script like the one pip installs (so the current folder is
not on the Python path, as for a user) and `python` this interpreter, with the repository's src/ first on the
path, a 120-column terminal, stdout and stderr as one stream. A command must
exit 0: a failure the document shows ends with `; echo "exit $?"`, which prints the code the reader sees.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from docs_blocks import Command, matches, needs_torch, parse, refreshed, write_file

REPO = Path(__file__).resolve().parent.parent
SHOWN_DIR = "/tmp/tour"  # the temporary folder's path as the documents show it
PRELUDE = 'python() { "$DOCS_PYTHON" "$@"; }\n'
SCRIPT = "#!{python}\nimport sys\nfrom pipeplan.cli import main\nsys.argv[0] = 'pipeplan'\nmain()\n"
COMMAND_TIMEOUT_S = 900


@dataclass
class Outcome:
    """One command's result: what it printed (normalized), its exit status and whether it matches."""

    command: Command
    got: list[str]
    status: int
    ok: bool
    seconds: float


def environment(bin_dir: Path) -> dict[str, str]:
    """The commands' environment: a `pipeplan` script in bin_dir first on PATH, src/ first on PYTHONPATH, fixed
    terminal width, unbuffered, no colour."""
    script = bin_dir / "pipeplan"
    script.write_text(SCRIPT.format(python=sys.executable))
    script.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "CLICOLOR_FORCE")}
    env["PATH"] = os.pathsep.join(filter(None, [str(bin_dir), env.get("PATH")]))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "src"), env.get("PYTHONPATH")]))
    env.update(DOCS_PYTHON=sys.executable, COLUMNS="120", LINES="50", PYTHONUNBUFFERED="1", NO_COLOR="1", TERM="dumb")
    return env


def run_command(command: Command, directory: Path, env: dict[str, str]) -> Outcome:
    """Run one command in directory; its output lines, right-stripped, leading and trailing blank lines dropped."""
    start = time.perf_counter()
    done = subprocess.run(
        ["bash", "-c", PRELUDE + command.text],
        cwd=directory,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=COMMAND_TIMEOUT_S,
        check=False,
    )
    text = done.stdout.decode("utf-8", "replace").replace(str(directory.resolve()), SHOWN_DIR)
    got = [line.rstrip() for line in text.split("\n")]
    while got and not got[-1]:
        got.pop()
    while got and not got[0]:
        got.pop(0)
    ok = done.returncode == 0 and matches(command.expected, got, command.masked)
    return Outcome(command, got, done.returncode, ok, time.perf_counter() - start)


def run_document(path: Path, stop_at_first: bool = False) -> tuple[list[Outcome], float]:
    """Run every example of the document at path in order; the outcomes and the seconds it took."""
    steps = parse(path.read_text())
    outcomes: list[Outcome] = []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="pipeplan-docs-") as tmp, tempfile.TemporaryDirectory() as bin_dir:
        directory = Path(tmp)
        env = environment(Path(bin_dir))
        for step in steps:
            if step.file_name is not None:
                write_file(directory, step)
            for command in step.commands:
                outcome = run_command(command, directory, env)
                outcomes.append(outcome)
                if stop_at_first and not outcome.ok:
                    return outcomes, time.perf_counter() - start
    return outcomes, time.perf_counter() - start


def report(path: Path, outcome: Outcome) -> str:
    """A readable account of a failed command: where it is, its exit status, expected against got."""
    where = f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path}:{outcome.command.line}"
    head = f"{where}: $ {outcome.command.text}"
    if outcome.status != 0:
        head += f'\n  exited {outcome.status} (a failure the document shows ends with `; echo "exit $?"`)'
    if outcome.command.masked:
        head += "\n  (masked block: numbers are compared as placeholders)"
    diff = difflib.unified_diff(outcome.command.expected, outcome.got, "expected (document)", "got (today)", lineterm="")
    return head + "\n" + "\n".join(diff)


def refresh_document(path: Path, outcomes: list[Outcome]) -> int:
    """Rewrite the expected output of every failed command with what it printed; the number of commands rewritten."""
    lines = path.read_text().split("\n")
    changed = 0
    for outcome in sorted(outcomes, key=lambda o: o.command.output_start, reverse=True):
        if outcome.ok and outcome.status == 0:
            continue
        command = outcome.command
        new = refreshed(command.expected, outcome.got, command.masked)
        lines[command.output_start : command.output_start + len(command.expected)] = new
        changed += 1
    if changed:
        path.write_text("\n".join(lines))
    return changed


def documents() -> list[Path]:
    """The documents whose examples are tested: README.md and docs/*.md."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def check_document(path: Path) -> None:
    """Run a document's examples as a test: skipped without console blocks, or without torch when they need it;
    failed with every difference (document, line, expected against got) when one does not print what it shows."""
    import pytest

    steps = parse(path.read_text())
    if not any(s.commands for s in steps):
        pytest.skip("no console blocks")
    if needs_torch(steps) and importlib.util.find_spec("torch") is None:
        pytest.skip("its examples profile, probe or train: they need the torch extra")
    outcomes, seconds = run_document(path)
    failures = [report(path, o) for o in outcomes if not o.ok]
    detail = "\n\n".join(failures)
    head = f"{len(failures)} of {len(outcomes)} examples differ ({seconds:.0f} s); `make docs` rewrites them:"
    assert not failures, f"{head}\n{detail}"
