"""A checkpoint folder's record: --keep-last deletes only files pipeplan wrote and recorded, unchanged, whatever else
the folder holds."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from checkpoint_files import save, snapshot  # noqa: E402
from pipeplan.runtime.rank_errors import TrainConfigError  # noqa: E402
from pipeplan.runtime.state.manifest import read_manifest  # noqa: E402

pytestmark = pytest.mark.torch

_NAMES = st.sampled_from(["rank-0.pt", "rank-0.json", "rank-1.pt", "rank-0.pt.tmp", ".rank-0.pt.x1.tmp", "notes.txt",
                          "latest.json.tmp", "step-000001", "data"])  # fmt: skip
_LAYOUT = st.fixed_dictionaries(
    {
        "steps": st.integers(2, 4),
        "keep": st.integers(1, 3),
        "top": st.lists(_NAMES, max_size=3, unique=True),  # foreign files beside latest.json
        "inside": st.lists(st.tuples(st.integers(1, 4), _NAMES), max_size=3),  # foreign files in step folders
        "unrecorded": st.lists(st.integers(5, 9), max_size=2, unique=True),  # step folders pipeplan never wrote
        "changed": st.lists(st.tuples(st.integers(1, 4), st.sampled_from(["rank-0.pt", "rank-0.json"]),
                                      st.sampled_from(["append", "same size", "link", "gone"])), max_size=3),
    }
)  # fmt: skip


def _foreign(root: Path, layout: dict) -> dict[str, object]:
    """Put the layout's foreign files and changes into a folder of recorded checkpoints; what must survive."""
    for name in layout["top"]:
        if not (root / name).exists():
            (root / name).write_bytes(b"user " + name.encode())
    for step, name in layout["inside"]:
        folder = root / f"step-{step:06d}"
        if folder.is_dir() and not (folder / name).exists():
            (folder / name).write_bytes(b"user " + name.encode())
    for step in layout["unrecorded"]:
        folder = root / f"step-{step:06d}"
        folder.mkdir(exist_ok=True)
        (folder / "rank-0.pt").write_bytes(b"someone else's")
    for step, name, how in layout["changed"]:
        path = root / f"step-{step:06d}" / name
        if not path.is_file() or path.is_symlink():
            continue
        data = path.read_bytes()
        if how == "append":
            path.write_bytes(data + b"x")
        elif how == "same size":
            path.write_bytes(bytes([data[0] ^ 1]) + data[1:])
        elif how == "link":
            (root / "target").write_bytes(data)  # the same bytes, but a link is never pipeplan's
            path.unlink()
            path.symlink_to(root / "target")
        else:
            path.unlink()
    recorded = read_manifest(root)
    assert recorded is not None
    ours = {f"step-{s:06d}/{n}" for s, files in recorded.checkpoints.items() for n in files}
    after = snapshot(root)
    # what is not pipeplan's as it wrote it: every entry but the recorded files still unchanged, and the folders
    changed = {f"step-{s:06d}/{n}" for s, n, _ in layout["changed"]}
    return {k: v for k, v in after.items() if (k not in ours or k in changed) and v != "folder" and k != "latest.json"}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(layout=_LAYOUT)
def test_keep_last_never_deletes_a_file_pipeplan_did_not_write(tmp_path_factory: pytest.TempPathFactory, layout: dict) -> None:
    """Over folder layouts (foreign files at the top and in step folders, step folders the record does not list,
    recorded files changed, replaced by a link or removed), the next checkpoint with --keep-last K leaves every such
    file as it was; it removes exactly the recorded unchanged files of the dropped steps, and a dropped step's folder
    only when nothing else is in it, naming what it kept."""
    root = tmp_path_factory.mktemp("ck")
    for step in range(1, layout["steps"] + 1):
        save(root, step)
    survivors = _foreign(root, layout)
    recorded = read_manifest(root)
    assert recorded is not None
    newest = layout["steps"] + 1
    note = save(root, newest, keep_last=layout["keep"])[0]
    after = snapshot(root)
    for key, value in survivors.items():
        assert after.get(key) == value, (key, sorted(after))
    dropped = sorted([*recorded.checkpoints, newest])[: -layout["keep"]]
    for step in dropped:
        folder = f"step-{step:06d}"
        leftovers = [k for k in after if k.startswith(folder + "/")]
        assert all(k in survivors for k in leftovers), leftovers  # nothing of pipeplan's left in a dropped step
        assert (folder in after) == bool(leftovers)
        if leftovers:
            assert note is not None and "kept" in note and "not written by pipeplan, or changed since" in note
    kept_steps = sorted([*recorded.checkpoints, newest])[-layout["keep"] :]
    index = read_manifest(root)
    assert index is not None and sorted(index.checkpoints) == kept_steps and index.step == newest


def test_a_malformed_record_is_refused_naming_the_field(tmp_path: Path) -> None:
    """A record whose file entry is not a size and a SHA-256, names a file pipeplan never writes, or whose step has no
    files, is refused naming latest.json and the field."""
    save(tmp_path, 1)
    index = json.loads((tmp_path / "latest.json").read_text())
    cases = [
        ({"checkpoints": {"1": {"rank-0.pt": {"bytes": -1, "sha256": "00"}}}}, r"field 'checkpoints.1.rank-0.pt' holds"),
        ({"checkpoints": {"1": {"../escape": {"bytes": 1, "sha256": "0" * 64}}}}, r"names '../escape', not a rank file"),
        ({"checkpoints": {}}, r"names step 1, but records no files for it"),
        ({"step": -3}, r"has step '-3', expected an integer"),
        ({"writing": "abc"}, r"has writing 'abc'"),
        ({"extra": 1}, r"unknown field 'extra'"),
    ]
    for change, said in cases:
        (tmp_path / "latest.json").write_text(json.dumps(index | change))
        with pytest.raises(TrainConfigError, match=said):
            read_manifest(tmp_path)


def test_the_record_is_read_without_following_a_fifo(tmp_path: Path) -> None:
    """A FIFO at latest.json is refused at once (the one bounded reader), not waited on."""
    os.mkfifo(tmp_path / "latest.json")
    with pytest.raises(TrainConfigError, match=r"latest.json: cannot read checkpoint index: is not a regular file \(a FIFO\)"):
        read_manifest(tmp_path)


def test_a_link_at_the_record_is_not_followed(tmp_path: Path) -> None:
    """latest.json that is a symbolic link (to a record elsewhere, or to /dev/zero) is refused, naming the link."""
    save(tmp_path / "ck", 1)
    (tmp_path / "ck" / "latest.json").rename(tmp_path / "elsewhere.json")
    (tmp_path / "ck" / "latest.json").symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(TrainConfigError, match=r"latest.json: cannot read checkpoint index: is a symbolic link"):
        read_manifest(tmp_path / "ck")
