"""api.train_flags: train's flags as one JSON object (what the --local launcher hands its workers) and their files'
guard."""

from __future__ import annotations

import dataclasses
import json
import typing
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeplan.api.train.train_flags import TRAIN_FILES, TrainFlags, check_train_files
from pipeplan.core.errors import OutputError, TrainConfigError

TEXT = st.text(max_size=12)
FLOATS = st.floats(allow_nan=False)  # NaN is no JSON value equal to itself; the checks refuse it before any launch


def _values(kind: object) -> st.SearchStrategy[object]:
    """Values of a field's declared type (the union with None included)."""
    text = str(kind)
    strategy: st.SearchStrategy[object] = (
        st.booleans() if text.startswith("bool") else st.integers(-(2**40), 2**40) if text.startswith("int")
        else FLOATS if text.startswith("float") else st.lists(TEXT, max_size=3) if text.startswith("list")
        else TEXT
    )  # fmt: skip
    return strategy | st.none() if "None" in text else strategy


FIELDS = {f.name: _values(f.type) for f in dataclasses.fields(TrainFlags)}


@given(st.fixed_dictionaries({}, optional=FIELDS))
def test_flags_come_back_equal_from_their_json(values: dict[str, object]) -> None:
    """from_json(to_json(f)) == f for flags of any field values, through the JSON text the workers read."""
    flags = TrainFlags(**values)  # type: ignore[arg-type]
    assert TrainFlags.from_json(json.loads(json.dumps(flags.to_json()))) == flags


def test_every_field_is_a_json_value() -> None:
    """Each field's type is bool, int, float, str, a list of str, or one of them or None: JSON holds it as is."""
    hints = typing.get_type_hints(TrainFlags)
    assert set(hints) == set(FIELDS)
    allowed = {bool, int, float, str, list[str], type(None)}
    for name, hint in hints.items():
        assert set(typing.get_args(hint) or (hint,)) <= allowed, name


def test_an_unknown_key_is_refused() -> None:
    """A JSON object with a key that names no field (another version's launcher) is refused, naming the key."""
    with pytest.raises(TrainConfigError, match="no field 'tracer'"):
        TrainFlags.from_json({"tracer": "t.json"})


def test_the_guard_names_the_timeline_as_it_was_given(tmp_path: Path) -> None:
    """--timeline on the plan file is refused naming --timeline, or --trace when the old name gave it."""
    plan = tmp_path / "plan.json"
    plan.write_text("{}")
    for option in ("--timeline", "--trace"):
        flags = TrainFlags(plan=str(plan), timeline=str(plan), timeline_option=option)
        with pytest.raises(OutputError, match=f"^{option} .* is the input --plan"):
            check_train_files(flags)


def test_the_declared_options_are_fields() -> None:
    """Every option TRAIN_FILES declares is a field of TrainFlags by the same name."""
    for flag in (*TRAIN_FILES.inputs, *TRAIN_FILES.outputs, *TRAIN_FILES.modules):
        assert flag[2:].replace("-", "_") in FIELDS, flag
