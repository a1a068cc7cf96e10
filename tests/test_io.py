"""Tests of io, every reader of a user's file, against every kind of thing a path can name and every kind of content: each answers
with its own error in one line naming the path and what is wrong, never blocks and never raises anything else."""

from __future__ import annotations

import errno
import json
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeplan.core.errors import ClusterError, CostError, PipeplanError, PlanError, ProfileError, ScheduleError
from pipeplan.io import files
from pipeplan.io.bandwidth_trace_json import read_bandwidth_trace
from pipeplan.io.cluster_json import read_cluster_json
from pipeplan.io.graph_txt import read_graph_txt
from pipeplan.io.plan_json import read_plan
from pipeplan.io.profile_json import read_profile_json
from pipeplan.io.schedule_io import read_schedule_csv, read_schedule_json
from pipeplan.presets.resolve import load_cluster, load_profile, load_schedule

READERS: dict[str, tuple[Callable[[str], Any], type[PipeplanError], str, str]] = {
    # name: (reader, its error, file name, the word its messages use)
    "profile json": (read_profile_json, ProfileError, "p.json", "profile"),
    "graph.txt": (read_graph_txt, ProfileError, "g-pbs-1.txt", "profile"),
    "cluster": (read_cluster_json, ClusterError, "c.json", "cluster"),
    "plan": (read_plan, PlanError, "plan.json", "plan"),
    "schedule json": (read_schedule_json, ScheduleError, "s.json", "schedule"),
    "schedule csv": (read_schedule_csv, ScheduleError, "s.csv", "schedule"),
    "bandwidth trace": (read_bandwidth_trace, CostError, "t.json", "bandwidth trace"),
    "load_profile": (load_profile, ProfileError, "lp.json", "profile"),
    "load_cluster": (load_cluster, ClusterError, "lc.json", "cluster"),
    "load_schedule": (lambda path: load_schedule(path, None, None), ScheduleError, "ls.csv", "schedule"),
}
JSON_READERS = [name for name, (_, _, file, _) in READERS.items() if file.endswith(".json")]


@pytest.fixture(autouse=True)
def _no_blocking() -> Iterator[None]:
    """Fail (instead of hanging) should a reader block, e.g. on a FIFO."""

    def _blocked(signum: int, frame: object) -> None:
        raise AssertionError("a reader blocked for 10 s")

    previous = signal.signal(signal.SIGALRM, _blocked)
    signal.alarm(10)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def _refusal(name: str, path: str) -> str:
    """The one-line message the reader `name` refuses path with (its own error class)."""
    reader, error, _, _ = READERS[name]
    with pytest.raises(error) as caught:
        reader(path)
    message = str(caught.value)
    assert "\n" not in message and path in message, message
    return message


def _place(kind: str, path: Path) -> None:
    """Put a thing of `kind` at path."""
    if kind == "directory":
        path.mkdir()
    elif kind == "FIFO":
        os.mkfifo(path)
    elif kind == "symlink loop":
        path.symlink_to(path.name + ".other")
        path.with_name(path.name + ".other").symlink_to(path.name)
    elif kind == "broken symlink":
        path.symlink_to("nowhere.json")
    elif kind == "too large":
        with open(path, "wb") as sparse:  # 129 MiB of holes: no disk used, refused from its size before any read
            sparse.truncate(129 * 2**20)
    elif kind == "not UTF-8":
        path.write_bytes(b'{"name": "\xff\xfe"}')


KINDS = {
    "missing": "does not exist",
    "directory": "is a directory",
    "FIFO": "is not a regular file (a FIFO)",
    "symlink loop": "symlink loop",
    "broken symlink": "does not exist (a broken symlink to 'nowhere.json')",
    "too large": "file too large: 135,266,304 bytes, the limit is 134,217,728 bytes, because",
    "not UTF-8": "not a UTF-8 text file (invalid start byte at byte 10)",
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", READERS)
def test_every_reader_says_what_stands_at_the_path(name: str, kind: str, tmp_path: Path) -> None:
    """A missing file, a directory, a FIFO (without blocking), a symlink loop, a broken symlink, a file over the size
    limit or one not in UTF-8: `{path}: cannot read {what}: {reason}`."""
    _, _, file, what = READERS[name]
    path = tmp_path / file
    _place(kind, path)
    if name.startswith("load_") and kind == "missing":
        return  # a path where nothing stands is a built-in name to the loaders (tests/test_presets.py)
    assert f"{path}: cannot read {what}: {KINDS[kind]}" in _refusal(name, str(path))


@pytest.mark.parametrize("name", READERS)
def test_every_reader_names_a_device_as_a_device(name: str) -> None:
    """/dev/null is a character device, not an empty file (and /dev/zero would never end)."""
    _, _, _, what = READERS[name]
    for device in ("/dev/null", "/dev/zero"):
        assert f"{device}: cannot read {what}: is not a regular file (a character device)" in _refusal(name, device)


@pytest.mark.parametrize("name", READERS)
def test_every_reader_reports_permission_denied(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file the user may not read is "permission denied" (os.stat is made to answer EACCES: the tests may run as root)."""
    _, _, file, what = READERS[name]
    path = tmp_path / file
    path.write_text("{}")
    real_stat = os.stat

    def stat(target: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        if os.fspath(target) == str(path):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_stat(target, *args, **kwargs)

    monkeypatch.setattr(files.os, "stat", stat)
    assert f"{path}: cannot read {what}: permission denied" in _refusal(name, str(path))


HAZARDS = {
    "deep nesting": ("[" * 5000 + "]" * 5000, "JSON nesting too deep: 33 levels, the limit is 32 levels"),
    "5,000-digit integer": ('{"format": ' + "7" * 5000 + "}", "integer too large: 5,000 digits, the limit is 30 digits"),
    "NaN": ('{"format": NaN}', "at format: NaN is not a number JSON allows"),
    "Infinity": ('{"steps": [{"t_ms": Infinity}]}', "at steps[0].t_ms: Infinity is not a number JSON allows"),
    "overflow": ('{"a": [1e999]}', "at a[0]: number 1e999 is beyond the float range"),
    "duplicate key": ('{"format": 1,\n "format": 2}', "line 2 column 2, at format: duplicate key 'format'"),
}


@pytest.mark.parametrize("hazard", HAZARDS)
@pytest.mark.parametrize("name", JSON_READERS)
def test_every_json_reader_refuses_what_no_format_holds(name: str, hazard: str, tmp_path: Path) -> None:
    """Every JSON reader goes through the one parser: nesting, long integers, NaN/Infinity, overflow, repeated keys."""
    text, fragment = HAZARDS[hazard]
    path = tmp_path / READERS[name][2]
    path.write_text(text)
    message = _refusal(name, str(path))
    assert message.startswith(f"{path}: ") and fragment in message, message


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    name=st.sampled_from(sorted(READERS)),
    content=st.binary(max_size=200)
    | st.text(alphabet='[]{}":,0123456789.eE-+ \nabflnrstuNIy#F', max_size=200).map(str.encode)
    | st.recursive(
        st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=5),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
        max_leaves=20,
    ).map(lambda v: json.dumps(v).encode()),
)
def test_any_bytes_give_a_value_or_one_line_of_the_readers_error(name: str, content: bytes, tmp_path: Path) -> None:
    """Whatever a file holds, a reader returns a value or raises its own error in one line, never anything else."""
    reader, error, file, _ = READERS[name]
    path = tmp_path / file
    path.write_bytes(content)
    try:
        reader(str(path))
    except error as exc:
        assert "\n" not in str(exc), str(exc)
