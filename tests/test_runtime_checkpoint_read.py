"""Checkpoint fuzzing: every file kind and every field of a rank's files, damaged one at a time, is refused by prepare
(the launcher's check, before any process starts) with one line naming the file and the field, changing nothing."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from checkpoint_files import rerecord, save, snapshot  # noqa: E402
from pipeplan.runtime.rank_errors import TrainConfigError  # noqa: E402
from pipeplan.runtime.state.checkpoint import prepare  # noqa: E402

pytestmark = pytest.mark.torch

STEP = 2


def _folder(root: Path) -> Path:
    return root / f"step-{STEP:06d}"


def _kind(make: Callable[[Path], None], name: str = "rank-0.pt") -> Callable[[Path], str]:
    """Put something else than the written file at `name` (the record unchanged)."""

    def damage(root: Path) -> str:
        path = _folder(root) / name
        path.unlink()
        make(path)
        return name

    return damage


def _meta(change: Callable[[dict[str, Any]], None], name: str = "rank-1.json") -> Callable[[Path], str]:
    """Change a field of a rank's JSON and record the file as it now is."""

    def damage(root: Path) -> str:
        path = _folder(root) / name
        meta = json.loads(path.read_text())
        change(meta)
        path.write_text(json.dumps(meta))
        rerecord(root, STEP, name)
        return name

    return damage


def _tensors(change: Callable[[dict[str, Any]], None], name: str = "rank-0.pt") -> Callable[[Path], str]:
    """Change a rank's tensors and record the file as it now is."""

    def damage(root: Path) -> str:
        path = _folder(root) / name
        state = torch.load(path, weights_only=True)
        change(state)
        torch.save(state, path)
        rerecord(root, STEP, name)
        return name

    return damage


def _weight(state: dict[str, Any]) -> torch.Tensor:
    return state["stages"][0]["0.weight"]


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """Set a dotted field of a JSON object."""

    def change(obj: dict[str, Any]) -> None:
        *outer, last = path.split(".")
        for key in outer:
            obj = obj[key]
        obj[int(last) if isinstance(obj, list) else last] = value  # type: ignore[index]

    return change


def _truncate(root: Path) -> str:
    path = _folder(root) / "rank-0.pt"
    path.write_bytes(path.read_bytes()[:-100])
    return "rank-0.pt"


def _bigger(root: Path) -> str:
    path = _folder(root) / "rank-1.json"
    path.write_bytes(path.read_bytes() + b" " * 10)
    return "rank-1.json"


CASES: dict[str, tuple[Callable[[Path], str], str]] = {
    # what stands at a rank's file
    "fifo": (_kind(os.mkfifo), "is not a regular file (a FIFO)"),
    "link to /dev/zero": (_kind(lambda p: p.symlink_to("/dev/zero")), "is a symbolic link (to '/dev/zero')"),
    "link inside the folder": (_kind(lambda p: p.symlink_to("rank-1.pt")), "is a symbolic link (to 'rank-1.pt')"),
    "directory": (_kind(Path.mkdir), "is a directory"),
    "missing": (_kind(lambda p: None, "rank-1.pt"), "does not exist"),
    "truncated": (_truncate, "is shorter than pipeplan wrote"),
    "grown": (_bigger, "too large"),
    "changed, record kept": (lambda root: (_folder(root) / "rank-0.json").write_text(
        (_folder(root) / "rank-0.json").read_text().replace('"seed": 1', '"seed": 2')) and "rank-0.json",
        "has other contents than pipeplan wrote"),
    # the JSON's fields
    "samples_seen -64": (_meta(_set("samples_seen", -64)), "field 'samples_seen' is -64"),
    "samples_seen abc": (_meta(_set("samples_seen", "abc")), "field 'samples_seen' is 'abc'"),
    "samples_seen 1e25": (_meta(_set("samples_seen", 1e25)), "field 'samples_seen' is 1e+25"),
    "samples_seen off by one": (_meta(_set("samples_seen", 17)), "but 2 steps of global batch 8 saw 16"),
    "step": (_meta(_set("step", 3)), "field 'step' is 3"),
    "format": (_meta(_set("format", "pipeplan.checkpoint/9")), "format 'pipeplan.checkpoint/9'"),
    "unknown field": (_meta(_set("code", "os:system")), "unknown field 'code'"),
    "missing field": (_meta(lambda m: m.pop("python_rng")), "missing field 'python_rng'"),
    "python_rng short": (_meta(_set("python_rng", [3, [1, 2], None])), "field 'python_rng'"),
    "python_rng word": (_meta(lambda m: m["python_rng"][1].__setitem__(5, 2**40)), "field 'python_rng'"),
    "python_rng gauss": (_meta(_set("python_rng.2", "x")), "field 'python_rng'"),
    "world size": (_meta(_set("fingerprint.world_size", 0)), "field 'fingerprint.world_size'"),
    "global batch": (_meta(_set("fingerprint.global_batch", "8")), "field 'fingerprint.global_batch'"),
    "dtype": (_meta(_set("fingerprint.dtype", "float16")), "field 'fingerprint.dtype'"),
    "another job": (_meta(_set("fingerprint.seed", 9), "rank-0.json"), "belongs to another job (seed: 9 != 1)"),
    # the tensors
    "nan weight": (_tensors(lambda s: _weight(s).view(-1).__setitem__(0, float("nan"))), "field 'stages.0.0.weight' holds 1"),
    "inf bias": (_tensors(lambda s: s["stages"][0]["0.bias"].fill_(float("inf"))), "field 'stages.0.0.bias' holds 3"),
    "float64 weight": (_tensors(lambda s: s["stages"][0].__setitem__("0.weight", _weight(s).double())),
                       "field 'stages.0.0.weight' has dtype torch.float64"),
    "not a tensor": (_tensors(lambda s: s["stages"][0].__setitem__("0.weight", [1.0])),
                     "field 'stages.0.0.weight' must be a tensor"),
    "stage out of range": (_tensors(lambda s: s.__setitem__("stages", {7: s["stages"][0]})), "field 'stages' has stage 7"),
    "nan in adam": (_tensors(lambda s: s["optimizer"]["state"][0]["exp_avg"].fill_(float("nan"))),
                    "field 'optimizer.state.0.exp_avg' holds"),
    "adam shape": (_tensors(lambda s: s["optimizer"]["state"][0].__setitem__("exp_avg", torch.zeros(2, 2))),
                   "field 'optimizer.state.0.exp_avg' has shape [2, 2], its parameter's is [3, 4]"),
    "lr nan": (_tensors(lambda s: s["optimizer"]["param_groups"][0].__setitem__("lr", float("nan"))),
               "field 'optimizer.param_groups.0.lr' must be a finite number"),
    "params": (_tensors(lambda s: s["optimizer"]["param_groups"][0].__setitem__("params", [0, 0])),
               "field 'optimizer.param_groups' names parameters [0, 0]"),
    "rng size": (_tensors(lambda s: s["rng"].__setitem__("torch", torch.zeros(10, dtype=torch.uint8))),
                 "field 'rng.torch' must be torch's generator state (uint8, 5056 bytes), got uint8 [10]"),
    "rng dtype": (_tensors(lambda s: s["rng"].__setitem__("torch", s["rng"]["torch"].float())), "field 'rng.torch'"),
    "rng missing": (_tensors(lambda s: s.__setitem__("rng", {})), "field 'rng' must hold torch"),
    "extra key": (_tensors(lambda s: s.__setitem__("code", 1)), "is not a pipeplan checkpoint"),
    "rank 1 nan": (_tensors(lambda s: s["stages"][1]["0.weight"].fill_(float("nan")), "rank-1.pt"), "field 'stages.1.0.weight'"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_damaged_file_or_field_is_refused_before_any_start(tmp_path: Path, case: str) -> None:
    """prepare(--resume) refuses each damage with one TrainConfigError line naming the file and the field, and
    changes nothing in the folder."""
    root = tmp_path / "ck"
    save(root, STEP, world=2)
    damage, said = CASES[case]
    name = damage(root)
    before = snapshot(root)
    with pytest.raises(TrainConfigError) as caught:
        prepare(root, resume=True, writes=True, steps=6, every=2, job={"seed": 1, "world_size": 2})
    message = str(caught.value)
    assert "\n" not in message and str(_folder(root) / name) in message and said in message, message
    assert snapshot(root) == before


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(where=st.floats(0, 1, exclude_max=True), value=st.integers(0, 255), name=st.sampled_from(["rank-0.pt", "rank-1.json"]))
def test_any_byte_changed_and_recorded_is_refused_or_loads_checked(
    tmp_path_factory: pytest.TempPathFactory, where: float, value: int, name: str
) -> None:
    """One byte of a rank's file changed (and the record rewritten to match): prepare either accepts it (the byte
    fell in tensor data, still finite) or refuses it with one TrainConfigError line naming the file; never another
    error, never a hang."""
    root = tmp_path_factory.mktemp("ck")
    save(root, STEP, world=2)
    path = _folder(root) / name
    data = bytearray(path.read_bytes())
    data[int(where * len(data))] = value
    path.write_bytes(bytes(data))
    rerecord(root, STEP, name)
    try:
        prepare(root, resume=True, writes=True, steps=6, every=2)
    except TrainConfigError as exc:
        assert "\n" not in str(exc) and str(path) in str(exc), str(exc)
