"""The runnable examples of a Markdown document: console blocks (commands and their output) and files to write.

A ```console block holds commands (lines starting with `$ `, continued by a trailing backslash) each followed
by the output it prints; a line `...` alone stands for any number of lines. `<!-- docs-test: masked -->`
before a block compares its numbers as placeholders (measurements); `<!-- docs-test: file NAME -->` before
any fenced block writes its text to NAME before the commands after it run. Other blocks (```bash, ```json)
are not run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

ELISION = "..."
MARKER = re.compile(r"^<!--\s*docs-test:\s*(masked|file\s+(\S+))\s*-->\s*$")
TORCH_COMMANDS = re.compile(r"\bpipeplan\s+(profile|probe|train)\b|^python\b|\|\s*python\b|;\s*python\b")


@dataclass
class Command:
    """One `$ ` command of a console block: its shell text and the output lines the document shows."""

    text: str
    line: int  # 1-based line of the `$ ` in the document
    expected: list[str]
    output_start: int  # 0-based index of the first expected line in the document's lines
    masked: bool = False


@dataclass
class Step:
    """A file to write (name, text) or a console block's commands, in document order."""

    line: int
    file_name: str | None = None
    file_text: str = ""
    commands: list[Command] = field(default_factory=list)


def parse(text: str) -> list[Step]:
    """The files and console blocks of a Markdown text, in order."""
    lines = text.split("\n")
    steps: list[Step] = []
    pending: dict[str, str] = {}
    i = 0
    while i < len(lines):
        marker = MARKER.match(lines[i].strip())
        if marker:
            if marker.group(2):
                pending["file"] = marker.group(2)
            else:
                pending["masked"] = "1"
            i += 1
            continue
        if not lines[i].startswith("```"):
            if lines[i].strip():
                pending.clear()
            i += 1
            continue
        info = lines[i][3:].strip()
        end = _fence_end(lines, i)
        body = lines[i + 1 : end]
        if "file" in pending:
            steps.append(Step(line=i + 1, file_name=pending["file"], file_text="\n".join(body) + "\n"))
        elif info == "console":
            steps.append(Step(line=i + 1, commands=_commands(body, i + 1, masked="masked" in pending)))
        pending.clear()
        i = end + 1
    return steps


def _fence_end(lines: list[str], start: int) -> int:
    """The index of the line closing the fence opened at start (the last line when none does)."""
    for j in range(start + 1, len(lines)):
        if lines[j].startswith("```"):
            return j
    return len(lines) - 1


def _commands(body: list[str], first: int, masked: bool) -> list[Command]:
    """The commands of a console block whose first body line is document index first."""
    commands: list[Command] = []
    j = 0
    while j < len(body):
        if not body[j].startswith("$ "):
            j += 1  # text before the first command is not checked
            continue
        line = first + j + 1
        parts = [body[j][2:]]
        while parts[-1].endswith("\\") and j + 1 < len(body):
            j += 1
            parts.append(body[j])
        j += 1
        start = j
        while j < len(body) and not body[j].startswith("$ "):
            j += 1
        expected = body[start:j]
        while expected and not expected[-1].strip():
            expected.pop()
        commands.append(Command("\n".join(parts), line, expected, first + start, masked))
    return commands


def needs_torch(steps: list[Step]) -> bool:
    """Whether any command runs the profiler or the runtime (profile, probe, train) or a Python file."""
    return any(TORCH_COMMANDS.search(c.text) for s in steps for c in s.commands)


def masked_line(line: str) -> str:
    """A line with every number a placeholder and runs of padding collapsed (column widths follow the numbers)."""
    line = re.sub(r"\d+(?:[.,]\d+)*", "0", line)
    return re.sub(r"([ ─━═\-])\1+", r"\1", line)


def matches(expected: list[str], got: list[str], masked: bool = False) -> bool:
    """Whether got matches expected, `...` lines standing for any number of lines."""
    norm = masked_line if masked else (lambda s: s)
    exp = [ELISION if e == ELISION else norm(e) for e in expected]
    out = [norm(g) for g in got]
    memo: dict[tuple[int, int], bool] = {}

    def match(i: int, j: int) -> bool:
        if (i, j) in memo:
            return memo[(i, j)]
        if i == len(exp):
            result = j == len(out)
        elif exp[i] == ELISION:
            result = any(match(i + 1, k) for k in range(j, len(out) + 1))
        else:
            result = j < len(out) and exp[i] == out[j] and match(i + 1, j + 1)
        memo[(i, j)] = result
        return result

    return match(0, 0)


def refreshed(expected: list[str], got: list[str], masked: bool = False) -> list[str]:
    """got with expected's elisions kept: the lines before and after each `...` keep their count."""
    segments: list[list[str]] = [[]]
    for line in expected:
        if line == ELISION:
            segments.append([])
        else:
            segments[-1].append(line)
    if len(segments) == 1:
        return list(got)
    head, *middle, tail = segments
    if len(head) + len(tail) + sum(len(m) for m in middle) > len(got):
        return list(got)
    out = got[: len(head)]
    pos, stop = len(head), len(got) - len(tail)
    for seg in middle:
        found = _find(seg, got, pos, stop)
        if found is not None:
            out += [ELISION, *got[found : found + len(seg)]]
            pos = found + len(seg)
    out.append(ELISION)
    out += got[stop:]
    return out


def _find(segment: list[str], got: list[str], start: int, stop: int) -> int | None:
    """Where segment's first line (numbers as placeholders) appears in got[start:stop] with room for the rest."""
    first = masked_line(segment[0]) if segment else ""
    for k in range(start, stop - len(segment) + 1):
        if masked_line(got[k]) == first:
            return k
    return None


def write_file(directory: Path, step: Step) -> None:
    """Write a file step's text under directory (folders created)."""
    assert step.file_name is not None
    path = directory / step.file_name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(step.file_text)
