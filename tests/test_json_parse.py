"""The one JSON parser: what json.loads reads it reads the same, and it refuses depth, long integers, NaN, overflow and
repeated keys with the line, column and field, never with another exception."""

from __future__ import annotations

import contextlib
import json
import math
import tracemalloc
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeplan.core.errors import ProfileError
from pipeplan.io.json_parse import _max_depth, locate, parse_json

KEYS = st.text(alphabet='ab[]{}"\\:, \n\u00e9', max_size=6)
SCALARS = st.none() | st.booleans() | st.integers(-(10**20), 10**20) | st.floats(allow_nan=False, allow_infinity=False) | KEYS
VALUES = st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=4), max_leaves=30
)


def _depth(value: object) -> int:
    """Nesting levels of a JSON value (a scalar is 0)."""
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    return 0


def _refused(text: str) -> str:
    """The message parse_json refuses text with (one line, starting with the source)."""
    with pytest.raises(ProfileError) as caught:
        parse_json(text, "f.json", ProfileError)
    message = str(caught.value)
    assert message.startswith("f.json: ") and "\n" not in message, message
    return message


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(VALUES, st.sampled_from([None, 2]))
def test_any_json_value_reads_as_json_loads_reads_it(value: object, indent: int | None) -> None:
    """A value whose keys and strings hold brackets, quotes and backslashes parses to what json.loads gives."""
    text = json.dumps(value, indent=indent)
    assert parse_json(text, "f.json", ProfileError) == json.loads(text)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet='[]{}",:0123456789.eE-+ntrufalsNIy\\ \n', max_size=60))
def test_any_text_either_parses_or_is_one_line_naming_the_file(text: str) -> None:
    """Random JSON-like text never raises anything but the reader's error, in one line naming the file."""
    try:
        parse_json(text, "f.json", ProfileError)
    except ProfileError as exc:
        assert str(exc).startswith("f.json: ") and "\n" not in str(exc)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 200), st.sampled_from("[{"), st.booleans())
def test_nesting_up_to_32_levels_reads_and_deeper_is_refused_without_recursion(depth: int, bracket: str, closed: bool) -> None:
    """Arrays or objects nested d deep: accepted when d <= 32, else refused at the 33rd level with its path."""
    opener, closer = (bracket, "]") if bracket == "[" else ('{"k": ', "}")
    text = opener * depth + "1" + (closer * depth if closed else "")
    if depth <= 32 and closed:
        assert _depth(parse_json(text, "f.json", ProfileError)) == depth
    elif depth > 32:
        message = _refused(text)
        assert "JSON nesting too deep: 33 levels, the limit is 32 levels, because" in message


def test_a_million_levels_are_refused_at_once() -> None:
    """The pre-scan needs no stack: a million open brackets (which would be a RecursionError in json) is one line."""
    assert "line 1 column 33, at ...[0][0]" in _refused("[" * 1_000_000)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('{"layers": [{"fwd_ms": NaN}]}', "line 1 column 24, at layers[0].fwd_ms: NaN is not a number JSON allows"),
        ('{"a": [1, Infinity]}', "at a[1]: Infinity is not a number JSON allows"),
        ('{"a":\n  -Infinity}', "line 2 column 3, at a: -Infinity is not a number"),
        ('{"a": 1e400}', "at a: number 1e400 is beyond the float range"),
        ('{"n": -' + "9" * 5000 + "}", "at n: integer too large: 5,000 digits, the limit is 30 digits, because"),
        ('{"n": ' + "1" * 31 + "}", "integer too large: 31 digits, the limit is 30 digits"),
        ('{"a": 1, "b": {"c": 2, "c": 3}}', "line 1 column 24, at b.c: duplicate key 'c'"),
        ('{"x y": {"a": 1, "a": 1}}', "at ['x y'].a: duplicate key 'a'"),
        ('{"a": "[[[[", "a": 2}', "at a: duplicate key 'a'"),
        ('{"format": ', "invalid JSON at line 1 column 12: Expecting value"),
        ("", "invalid JSON at line 1 column 1: Expecting value"),
    ],
)
def test_refusals_name_the_line_column_and_field(text: str, fragment: str) -> None:
    """Each refused construct is located: line, column and the path of the field that holds it."""
    assert fragment in _refused(text)


def test_numbers_within_the_limits_read_exactly() -> None:
    """30-digit integers, 1e308 and subnormal floats read as json.loads reads them."""
    text = '{"i": ' + "9" * 30 + ', "f": 1e308, "g": 5e-324, "e": 1e-400}'
    value = parse_json(text, "f.json", ProfileError)
    assert value == {"i": int("9" * 30), "f": 1e308, "g": 5e-324, "e": 0.0} and math.isfinite(value["f"])


LEAVES = st.integers(-(10**12), 10**12) | st.floats(-1e300, 1e300) | st.text(alphabet='a,"\\[] ', max_size=4) | st.none()
TREES = st.recursive(
    LEAVES,
    lambda inner: (
        st.lists(inner, min_size=1, max_size=30)
        | st.dictionaries(st.sampled_from(["a", "b2", "x y", "fwd_ms", "[k]"]), inner, min_size=1, max_size=4)
    ),
    max_leaves=60,
)


def _leaf_paths(value: object, path: str = "") -> list[str]:
    """Every leaf's path as parse_json writes it (`.key`, `['key']`, `[i]`)."""
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _leaf_paths(v, f"{path}[{i}]")]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _leaf_paths(v, f"{path}.{k}" if k.isidentifier() else f"{path}[{k!r}]")]
    return [path.lstrip(".") or "the top level"]


def _with_nan(value: object, target: str, path: str = "") -> object:
    """value with the leaf at `target` replaced by a marker string."""
    here = path.lstrip(".") or "the top level"
    if isinstance(value, list):
        return [_with_nan(v, target, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {k: _with_nan(v, target, f"{path}.{k}" if k.isidentifier() else f"{path}[{k!r}]") for k, v in value.items()}
    return "@@NAN@@" if here == target else value


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(TREES, st.data())
def test_a_refused_literal_is_located_at_its_field(tree: object, data: st.DataObject) -> None:
    """NaN put at any leaf of any value is reported at that leaf's path (the fast skip over array runs agrees with the
    token walk), with the line and column where it stands."""
    target = data.draw(st.sampled_from(_leaf_paths(tree)))
    text = json.dumps(_with_nan(tree, target), indent=data.draw(st.sampled_from([None, 1]))).replace('"@@NAN@@"', "NaN")
    message = _refused(text)
    where = text.index("NaN")
    line, column = text.count("\n", 0, where) + 1, where - text.rfind("\n", 0, where)
    shown = target if len(target) <= 60 else "..." + target[-57:]
    assert f"line {line} column {column}, at {shown}: NaN is not a number JSON allows" in message, (message, target)


def _peak_bytes(read: Callable[[str], object], text: str) -> int:
    """The peak of memory Python allocates (tracemalloc) while `read` reads or refuses text."""
    tracemalloc.start()
    try:
        with contextlib.suppress(ProfileError):
            read(text)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _parse(text: str) -> object:
    return parse_json(text, "f.json", ProfileError)


@pytest.mark.parametrize(
    ("read", "text"),
    [
        (_parse, '{"notes": "' + "n" * 2_000_000 + '"}'),
        (_parse, '{"notes": "' + "\\n" * 1_000_000 + '"}'),
        (locate, "[" + '"ab", ' * 400_000 + "NaN]"),
        (locate, "[" + "1.5, " * 400_000 + "NaN]"),
        (_max_depth, "[" + "[]," * 3_000_000 + "[]]"),
    ],
    ids=["long string", "escapes", "locate a run of strings", "locate a run of numbers", "depth of many brackets"],
)
def test_prescan_and_locate_take_memory_within_a_few_times_the_text(read: Callable[[str], object], text: str) -> None:
    """The string blanking, the depth pre-scan and `locate` stay within 4x the text: no per-character regex
    backtracking entries (a 52 MB `notes` string once took 6.1 GB) and no per-bracket int64 arrays."""
    assert _peak_bytes(read, text) <= 4 * len(text)
