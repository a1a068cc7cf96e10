"""JSON text to Python values, refusing what no pipeplan file holds, each refusal located by line, column and field.

Refused: nesting deeper than core.limits.JSON_DEPTH (checked before parsing,
without recursion, so no RecursionError ever), integers longer than
JSON_INT_DIGITS, numbers beyond the float range, the literals NaN, Infinity
and -Infinity, and a key given twice in one object. The standard library's C
parser does the work; the hooks it calls only flag a problem, and a
Python walk of the tokens (`locate`, run only then) says where it is: the
first problem in the text, with the line, column and path of fields such as
`layers[3].fwd_ms`.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import numpy as np

from pipeplan.core.errors import PipeplanError
from pipeplan.core.limits import JSON_DEPTH, JSON_INT_DIGITS

_STRING = r'"(?:[^"\\]++|\\[\s\S])*+(?:"|\\?\Z)'
"""A JSON string; an unterminated one runs to the end of the text, so a match never backtracks (linear time). The
repeats are possessive (`++`, `*+`): a plain `*` over a group makes Python's regex engine keep one backtracking entry
per character, about 120 bytes each (a 52 MB string took 6.1 GB); possessive ones keep none."""
_STRINGS = re.compile(_STRING)
_CLOSED_STRING = r'"(?:[^"\\]++|\\[\s\S])*+"'
_SUSPECT_NUMBER = re.compile(r"(?<!\d)\d{" + str(int(JSON_INT_DIGITS.value) + 1) + r"}|[eE][-+]?\d{3}")
"""Outside strings: an integer too long, or an exponent that may overflow; only then are numbers parsed by hooks."""
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_TOKEN = re.compile(
    r"\s*(?:(?P<string>" + _STRING + r")|(?P<number>-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)"
    r"|(?P<literal>true|false|null|NaN|-?Infinity)|(?P<punct>[\[\]{}:,])|(?P<other>\S))"
)


_PLAIN_RUN = re.compile(
    r"(?:\s*(?:-?\d{1,30}(?:\.\d+)?(?:[eE][-+]?\d{1,2})?(?![\d.eE])|true|false|null|" + _CLOSED_STRING + r")\s*,)*+"
)
"""Array items that cannot be refused, each followed by a comma: `locate` skips such a run at C speed (a NaN, a long
integer, a 3-digit exponent or a nested value ends it). Possessive (`*+`), so a run of millions of items keeps no
backtracking entries (see _STRING)."""


class _Flagged(Exception):
    """Raised by a parse hook: the text holds something refused (located afterwards by `locate`)."""


def parse_json(text: str, source: str, error: type[PipeplanError]) -> Any:
    """The value of JSON `text`; `source` (a file path) begins every message.

    Raises:
        error: invalid JSON (line and column), or a refused construct (line, column, field path and why).
    """
    outside = _STRINGS.sub('""', text)
    depth = _max_depth(outside)
    if depth > JSON_DEPTH.value:
        raise error(f"{source}: {locate(text) or JSON_DEPTH.message('JSON nesting', depth)}")
    hooks: dict[str, Any] = {"object_pairs_hook": _unique_keys, "parse_constant": _refuse_constant}
    if _SUSPECT_NUMBER.search(outside):
        hooks |= {"parse_int": _bounded_int, "parse_float": _finite_float}
    del outside  # a copy of the text's size: freed before the parsed values are built
    try:
        return json.loads(text, **hooks)
    except _Flagged as flag:
        raise error(f"{source}: {locate(text) or flag}") from None
    except json.JSONDecodeError as exc:
        raise error(f"{source}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except (RecursionError, ValueError) as exc:  # not expected after the checks above; never a traceback
        raise error(f"{source}: cannot parse JSON: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None


def locate(text: str) -> str | None:
    """The first refused construct of `text` in reading order, as `line L column C, at PATH: why`; None when there is
    none (or the text stops being JSON before one)."""
    stack: list[list[Any]] = []  # [is_object, keys seen, label (key or index), expecting a key]
    pos = 0
    while (match := _TOKEN.match(text, pos)) is not None:
        pos = match.end()
        if stack and not stack[-1][0] and match.group("punct") in ("[", ","):
            # inside an array: skip a run of plain items ("1, 2.5, "x", ") in C, counting its commas
            if match.group("punct") == "[":
                stack.append([False, set(), 0, False])
                if len(stack) > JSON_DEPTH.value:
                    return _at(text, match.start("punct"), stack[:-1], JSON_DEPTH.message("JSON nesting", len(stack)))
            else:
                stack[-1][2] += 1
            run = _PLAIN_RUN.match(text, pos)
            if run is not None and run.end() > pos:
                stack[-1][2] += _commas_outside_strings(run.group())
                pos = run.end()
            continue
        kind = match.lastgroup
        token = match.group(kind or 0)
        problem = None
        if kind == "punct":
            if token in "[{":
                if len(stack) + 1 > JSON_DEPTH.value:
                    problem = JSON_DEPTH.message("JSON nesting", len(stack) + 1)
                else:
                    stack.append([token == "{", set(), None if token == "{" else 0, token == "{"])
            elif token in "]}":
                if not stack:
                    return None
                stack.pop()
            elif token == "," and stack:
                frame = stack[-1]
                if frame[0]:
                    frame[3] = True
                elif isinstance(frame[2], int):
                    frame[2] += 1
        elif kind == "string" and stack and stack[-1][0] and stack[-1][3]:
            frame = stack[-1]
            try:
                key = json.loads(token)
            except ValueError:
                return None
            if key in frame[1]:
                problem = f"duplicate key {key!r} (a key may appear once in an object)"
            frame[1].add(key)
            frame[2], frame[3] = key, False
        elif kind == "number":
            problem = _number_problem(token)
        elif kind == "literal" and token in ("NaN", "Infinity", "-Infinity"):
            problem = f"{token} is not a number JSON allows (numbers must be finite)"
        elif kind == "other":
            return None
        if problem is not None:
            return _at(text, match.start(kind or 0), stack, problem)
    return None


def _commas_outside_strings(run: str) -> int:
    """The commas of a run of array items that are not inside its strings (one string at a time: blanking them all at
    once made a piece per string, 12 times the run's size)."""
    commas = run.count(",")
    if '"' in run:
        commas -= sum(match.group().count(",") for match in _STRINGS.finditer(run))
    return commas


def _at(text: str, where: int, stack: list[list[Any]], problem: str) -> str:
    """`line L column C, at PATH: problem` for the character at index `where`."""
    line = text.count("\n", 0, where) + 1
    column = where - text.rfind("\n", 0, where)
    return f"line {line} column {column}, at {_path(stack)}: {problem}"


def _number_problem(token: str) -> str | None:
    """Why a number token is refused, or None."""
    digits = token.lstrip("-")
    if digits.isdigit():
        if not JSON_INT_DIGITS.allows(len(digits)):
            return JSON_INT_DIGITS.message("integer", len(digits))
        return None
    if not math.isfinite(float(token)):
        return f"number {token[:20]}{'...' if len(token) > 20 else ''} is beyond the float range (about 1.8e308)"
    return None


def _path(stack: list[list[Any]]) -> str:
    """The field path of the innermost open value, e.g. `layers[3].fwd_ms` (`the top level` outside any)."""
    parts = []
    for is_object, _, label, _ in stack:
        if label is None:
            continue
        if is_object:
            parts.append(f".{label}" if isinstance(label, str) and label.isidentifier() else f"[{label!r}]")
        else:
            parts.append(f"[{label}]")
    path = "".join(parts).lstrip(".")
    return ("..." + path[-57:] if len(path) > 60 else path) or "the top level"


_DEPTH_CHUNK = 1 << 20
"""Brackets counted per numpy pass: a chunk's arrays take about 11 bytes a bracket (11 MiB), whatever the file's size."""


def _max_depth(outside: str) -> int:
    """The deepest nesting of brackets in text whose strings were blanked (numpy, no recursion, linear time, memory
    bounded by _DEPTH_CHUNK)."""
    brackets = np.frombuffer(outside.encode("utf-8", "surrogatepass").translate(None, _NOT_BRACKETS), dtype=np.uint8)
    depth = deepest = 0
    for start in range(0, brackets.size, _DEPTH_CHUNK):
        chunk = brackets[start : start + _DEPTH_CHUNK]
        steps = np.where((chunk == ord("[")) | (chunk == ord("{")), np.int32(1), np.int32(-1))
        running = np.cumsum(steps, dtype=np.int32) + depth
        deepest = max(deepest, int(running.max()))
        depth = int(running[-1])
    return deepest


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object's dict; a key given twice is flagged."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise _Flagged("a key appears twice in one object")
    return obj


def _refuse_constant(name: str) -> Any:
    """NaN, Infinity and -Infinity are flagged."""
    raise _Flagged(f"{name} is not a number JSON allows (numbers must be finite)")


def _bounded_int(token: str) -> int:
    """An integer of at most JSON_INT_DIGITS digits, else flagged."""
    if not JSON_INT_DIGITS.allows(len(token.lstrip("-"))):
        raise _Flagged(JSON_INT_DIGITS.message("integer", len(token.lstrip("-"))))
    return int(token)


def _finite_float(token: str) -> float:
    """A float within range, else flagged."""
    value = float(token)
    if not math.isfinite(value):
        raise _Flagged(f"number {token[:20]} is beyond the float range (about 1.8e308)")
    return value
