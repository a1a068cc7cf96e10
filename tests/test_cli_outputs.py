"""The one output guard, over every command's output options: an output that names an input, another output, a
non-regular file or a missing folder is refused before any work (exit 2, one line naming the flag), nothing changed."""

from __future__ import annotations

import contextlib
import io
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from file_kinds import NON_FILES, NON_FOLDERS, snapshot
from pipeplan.cli import main
from pipeplan.core.plan import Plan, Stage

TRAIN_OUTPUTS = {"--trace": "t.json", "--png": "t.png", "--save-grads": "grads", "--checkpoint-dir": "ckpt"}
COMMANDS: dict[str, tuple[list[str], dict[str, str], tuple[str, ...]]] = {
    "plan": (["plan", "--profile", "profile.json", "--cluster", "cluster.json", "--global-batch", "8"], {"--out": "o.json"},
             ("profile.json", "cluster.json")),
    "compare": (["compare", "--profile", "profile.json", "--cluster", "cluster.json", "--global-batch", "8"],
                {"--png": "best.png"}, ("profile.json", "cluster.json")),
    "simulate --plan": (["simulate", "--plan", "plan.json", "--bandwidth-trace", "bandwidth.json"],
                        {"--trace": "t.json", "--png": "t.png"}, ("plan.json", "bandwidth.json", "profile.json", "cluster.json")),
    "simulate FILE": (["simulate", "order.csv"], {"--trace": "t.json", "--png": "t.png"}, ("order.csv",)),
    "show cluster": (["show", "cluster", "cluster.json"], {"--png": "c.png"}, ("cluster.json",)),
    "profile": (["profile", "mlp", "-b", "8"], {"--out": "p.json"}, ()),
    "probe": (["probe", "--profile", "profile.json"], {"--out": "c.json"}, ("profile.json",)),
    "train --plan": (["train", "--local", "2", "--plan", "plan.json"], TRAIN_OUTPUTS,
                     ("plan.json", "profile.json", "cluster.json")),
    "train --schedule FILE": (["train", "--local", "2", "--schedule", "order.csv"], TRAIN_OUTPUTS, ("order.csv",)),
    "demo": (["demo"], {"--out": "demo"}, ()),
}  # fmt: skip
"""command -> (arguments, {output flag: a good path}, the input files it reads)."""

FOLDERS = {"--save-grads", "--checkpoint-dir"}
EXTRA = {"--checkpoint-dir": ["--checkpoint-every", "1"]}
"""Flags an output needs beside it to be valid (a checkpoint folder needs --checkpoint-every)."""


def is_folder(command: str, flag: str) -> bool:
    """Whether `flag` of `command` names a folder the command writes files into."""
    return flag in FOLDERS or command == "demo"


def write_inputs(folder: Path) -> None:
    """The input files: a real profile and cluster, a plan naming them, a bandwidth trace, a schedule CSV."""
    from pipeplan.io.cluster_json import cluster_to_json
    from pipeplan.io.plan_json import write_plan
    from pipeplan.io.profile_json import write_profile_json
    from pipeplan.io.schedule_io import write_schedule_csv
    from pipeplan.presets.resolve import load_cluster, load_profile
    from pipeplan.schedules import make_schedule

    write_profile_json(load_profile("dapple/vgg-19"), folder / "profile.json")
    (folder / "cluster.json").write_text(json.dumps(cluster_to_json(load_cluster("v100-8x1"))))
    plan = Plan((Stage(0, 12, (0,)), Stage(13, 25, (1,))), 1, 4, 2, "1f1b")
    cwd = os.getcwd()
    os.chdir(folder)  # the plan records its profile and cluster as the files beside it
    try:
        write_plan(plan, "plan.json", "profile.json", "cluster.json")
    finally:
        os.chdir(cwd)
    (folder / "bandwidth.json").write_text(json.dumps({"steps": [{"t_ms": 0, "link": "all", "factor": 0.5}]}))
    write_schedule_csv(make_schedule("1f1b", 2, 4), folder / "order.csv")


@contextlib.contextmanager
def inside(folder: Path) -> Iterator[None]:
    """Run with `folder` as the working folder."""
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(cwd)


def run_cli(argv: list[str]) -> tuple[int, str]:
    """Run `pipeplan ARGV` in-process; return the exit code and stderr."""
    err = io.StringIO()
    code = 0
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            main(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    return code, err.getvalue()


def assert_refused(folder: Path, argv: list[str], *fragments: str) -> None:
    """Exit 2, one `error:` line holding every fragment, and every file under `folder` as it was (bytes, mtime, kind)."""
    before = snapshot(folder)
    with inside(folder):
        code, err = run_cli(argv)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, (argv, err)
    assert len(lines) == 1 and lines[0].startswith("error: "), (argv, err)
    for fragment in fragments:
        assert fragment in lines[0], (argv, fragment, lines[0])
    assert snapshot(folder) == before, argv


def command_args(command: str, outputs: dict[str, str]) -> list[str]:
    """The command line of `command` with `outputs` (flag -> path) and what they need beside them."""
    args = list(COMMANDS[command][0])
    for flag, path in outputs.items():
        args += [flag, path, *EXTRA.get(flag, [])]
    return args


NEEDS_TORCH = {"profile"}
"""Commands that import torch before they check their outputs (profile's batch sizes come from the torch profiler)."""
OUTPUT_CASES = [
    pytest.param(command, flag, marks=pytest.mark.torch) if command in NEEDS_TORCH else (command, flag)
    for command, (_, outputs, _) in COMMANDS.items()
    for flag in outputs
]


@pytest.mark.parametrize(("command", "flag"), OUTPUT_CASES)
@pytest.mark.parametrize("kind", sorted(set(NON_FILES) | set(NON_FOLDERS) | {"missing folder"}))
def test_an_output_on_a_non_file_or_in_a_missing_folder_is_refused(command: str, flag: str, kind: str, tmp_path: Path) -> None:
    """Every output option of every command, at a FIFO, a socket, a device node, a link, a folder (or, for a folder
    output, a file) or in a folder that does not exist: refused, naming the flag, the path and what stands there."""
    write_inputs(tmp_path)
    folder_output = is_folder(command, flag)
    good = COMMANDS[command][1][flag]
    if kind == "missing folder":
        path = f"nodir/{good}"
        assert_refused(tmp_path, command_args(command, {flag: path}), flag, repr(path), "does not exist")
        assert not (tmp_path / "nodir").exists()
        return
    kinds = NON_FOLDERS if folder_output else NON_FILES
    if kind not in kinds:
        pytest.skip(f"{kind} is what a {'folder' if folder_output else 'file'} output may be")
    make, name = kinds[kind]
    make(tmp_path / good)
    assert_refused(tmp_path, command_args(command, {flag: good}), flag, repr(good), name)


def spellings(folder: Path, name: str) -> list[str]:
    """Ways to name the file `name` in `folder`: relative, ./, absolute, through a linked folder, through `..`."""
    link = folder / "here"
    if not link.exists():
        link.symlink_to(folder)
    return [name, f"./{name}", str(folder / name), f"here/{name}", f"../{folder.name}/{name}"]


@pytest.mark.slow
@pytest.mark.parametrize("command", [c for c, (_, _, inputs) in COMMANDS.items() if inputs])
def test_an_output_naming_an_input_is_refused_however_it_is_spelled(command: str, tmp_path: Path) -> None:
    """An output that names one of the command's inputs (given, or named by its plan file), spelled any way or through
    a hard link, is refused; the input keeps its bytes."""
    write_inputs(tmp_path)
    _, outputs, inputs = COMMANDS[command]
    for flag in outputs:
        for name in inputs:
            for path in spellings(tmp_path, name):
                fragments = [flag, repr(path)] + ([] if is_folder(command, flag) or flag == "--png" else ["is the input"])
                assert_refused(tmp_path, command_args(command, {flag: path}), *fragments)
        (tmp_path / "hard").unlink(missing_ok=True)
        os.link(tmp_path / inputs[0], tmp_path / "hard")
        if not is_folder(command, flag) and flag != "--png":
            assert_refused(tmp_path, command_args(command, {flag: "hard"}), flag, "is the input")


MULTI = [(command, flags) for command, (_, outputs, _) in COMMANDS.items() for flags in [list(outputs)] if len(flags) > 1]


@pytest.mark.slow
@given(st.sampled_from(MULTI), st.data())
def test_two_outputs_of_one_command_on_one_path_are_refused(case: tuple[str, list[str]], data: st.DataObject) -> None:
    """Any two outputs of a command given one path (spelled alike or not): refused naming both flags, nothing written."""
    import tempfile

    command, flags = case
    first, second = data.draw(st.permutations(flags))[:2]
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        write_inputs(folder)
        target = data.draw(st.sampled_from(["x.png", "x.json", "sub"]))
        (folder / "sub").mkdir()
        one, other = data.draw(st.sampled_from(spellings(folder, target))), data.draw(st.sampled_from(spellings(folder, target)))
        argv = command_args(command, {first: one, second: other})
        assert_refused(folder, argv)
        with inside(folder):
            _, err = run_cli(argv)
        assert first in err or second in err


@pytest.mark.slow
@pytest.mark.parametrize("command", ["plan", "simulate --plan", "simulate FILE", "show cluster"])
def test_an_existing_regular_file_that_is_no_input_is_replaced_keeping_its_mode(command: str, tmp_path: Path) -> None:
    """The guard lets a regular file that is no input be an output: the command rewrites it, with its mode kept."""
    write_inputs(tmp_path)
    outputs = COMMANDS[command][1]
    for path in outputs.values():
        (tmp_path / path).write_text("old\n")
        (tmp_path / path).chmod(0o640)
    with inside(tmp_path):
        code, err = run_cli(command_args(command, outputs))
    assert code == 0, err
    for path in outputs.values():
        assert (tmp_path / path).read_bytes() != b"old\n"
        assert (tmp_path / path).stat().st_mode & 0o777 == 0o640
