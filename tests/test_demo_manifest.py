"""demo --out replaces only files it wrote and recorded, unchanged since: a same-named file of the user's (or one
changed since) is refused before any work, naming it, and left byte-identical."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from file_kinds import snapshot
from pipeplan.cli import main
from pipeplan.cli.demo.demo_manifest import MANIFEST, check_folder, digest, read_manifest, record
from pipeplan.cli.demo.demo_run import FILES
from pipeplan.core.errors import OutputError


def run_demo_cli(out: Path) -> tuple[int, str]:
    """`pipeplan demo --out OUT` in-process; (exit code, stderr). Used only where it is refused before any step."""
    err = io.StringIO()
    code = 0
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            main(["demo", "--quick", "--out", str(out)])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    return code, err.getvalue()


@pytest.mark.parametrize("name", FILES)
def test_a_foreign_same_named_file_is_refused_and_untouched(name: str, tmp_path: Path) -> None:
    """A file of the user's named like one the demo writes, in --out: exit 2, one line naming it, nothing changed."""
    out = tmp_path / "out"
    out.mkdir()
    (out / name).write_bytes(b"the user's own file\n")
    before = snapshot(tmp_path)
    code, err = run_demo_cli(out)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith(f"error: OutputError: --out {str(out)!r}: {name!r} was not written by pipeplan demo"), err
    assert "move it away, or give another --out" in lines[0]
    assert snapshot(tmp_path) == before


def test_a_recorded_file_changed_since_is_refused(tmp_path: Path) -> None:
    """A file the demo recorded and the user edited afterwards: refused, naming it, untouched."""
    name = FILES[0]
    (tmp_path / name).write_bytes(b"as the demo wrote it\n")
    record(tmp_path, [tmp_path / name])
    check_folder(str(tmp_path), FILES)  # unchanged: accepted
    (tmp_path / name).write_bytes(b"edited by the user\n")
    with pytest.raises(OutputError, match=rf"{name!r} has changed since pipeplan demo wrote it"):
        check_folder(str(tmp_path), FILES)
    assert (tmp_path / name).read_bytes() == b"edited by the user\n"


@given(st.lists(st.sampled_from(FILES), unique=True), st.lists(st.sampled_from(FILES), unique=True))
def test_only_recorded_unchanged_files_are_accepted(recorded: list[str], present: list[str]) -> None:
    """For any files recorded and any present: the folder is accepted exactly when every present file is recorded."""
    import tempfile

    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        for file in recorded:
            (folder / file).write_bytes(file.encode())
        record(folder, [folder / f for f in recorded])
        for file in set(recorded) - set(present):
            (folder / file).unlink()
        for file in set(present) - set(recorded):
            (folder / file).write_bytes(b"foreign")
        if set(present) <= set(recorded):
            check_folder(str(folder), FILES)
        else:
            with pytest.raises(OutputError, match="was not written by pipeplan demo"):
                check_folder(str(folder), FILES)


def test_the_manifest_records_each_file_s_hash(tmp_path: Path) -> None:
    """The manifest is {"format": "pipeplan.demo/1", "files": {name: sha256}}; recording more keeps the earlier."""
    import hashlib

    (tmp_path / "a.png").write_bytes(b"a")
    (tmp_path / "b.json").write_bytes(b"b")
    record(tmp_path, [tmp_path / "a.png"])
    record(tmp_path, [tmp_path / "b.json"])
    obj = json.loads((tmp_path / MANIFEST).read_text())
    assert obj == {
        "format": "pipeplan.demo/1",
        "files": {n: hashlib.sha256(n[0].encode()).hexdigest() for n in ("a.png", "b.json")},
    }
    assert read_manifest(tmp_path) == obj["files"]
    assert digest(tmp_path / "a.png") == hashlib.sha256(b"a").hexdigest()


@pytest.mark.parametrize("content", [b"not json", b'{"format": "other/1", "files": {}}', b'{"format": "pipeplan.demo/1"}'])
def test_a_manifest_the_demo_did_not_write_is_refused(content: bytes, tmp_path: Path) -> None:
    """A .pipeplan-demo.json that is not the demo's manifest: refused (it could list anything), untouched."""
    (tmp_path / MANIFEST).write_bytes(content)
    with pytest.raises(OutputError, match="is not a manifest pipeplan demo wrote"):
        check_folder(str(tmp_path), FILES)
    assert (tmp_path / MANIFEST).read_bytes() == content


def test_a_non_regular_file_with_a_demo_name_is_refused(tmp_path: Path) -> None:
    """A folder named like a demo file: refused, naming it."""
    (tmp_path / FILES[0]).mkdir()
    with pytest.raises(OutputError, match=rf"{FILES[0]!r} is a folder, not a regular file"):
        check_folder(str(tmp_path), FILES)
