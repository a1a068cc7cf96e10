"""The one output guard, over every command's output options: an output that names an input, another output, a
non-regular file, a missing folder, or a file pipeplan did not write of its kind is refused before any work (exit 2,
one line naming the flag), nothing changed; a full disk while writing is one line naming the option, exit 1."""

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
from full_disk import fill, full_folder_fixture, leftovers  # noqa: F401 (the fixture full_folder)
from pipeplan.cli import main
from pipeplan.cli.file_options import COMMAND_FILES
from pipeplan.core.plan import Plan, Stage

MODULE = "pp_guard_model"
"""The user's model module the tests write (a name no other test imports: the guard reads sys.modules first)."""
TRAIN_OUTPUTS = {"--timeline": "t.json", "--png": "t.png", "--save-grads": "grads", "--checkpoint-dir": "ckpt"}
TRAIN_OLD_NAME = {"--trace": "t.json", "--png": "t.png", "--save-grads": "grads", "--checkpoint-dir": "ckpt"}
"""train's outputs with --timeline's old name."""
TRACE_OUTPUT = {"--out": "trace.json"}
PERIODIC = ["--period-ms", "100", "--duty", "0.5", "--factor", "0.5", "--duration-ms", "1000"]
COMMANDS: dict[str, tuple[list[str], dict[str, str], tuple[str, ...]]] = {
    "plan": (["plan", "--profile", "profile.json", "--cluster", "cluster.json", "--global-batch", "8"], {"--out": "o.json"},
             ("profile.json", "cluster.json")),
    "plan --bandwidth-trace": (["plan", "--profile", "profile.json", "--cluster", "cluster.json", "--global-batch", "8",
                                "--bandwidth-trace", "bandwidth.json"], {"--out": "o.json"}, ("bandwidth.json",)),
    "compare": (["compare", "--profile", "profile.json", "--cluster", "cluster.json", "--global-batch", "8"],
                {"--png": "best.png"}, ("profile.json", "cluster.json")),
    "simulate --plan": (["simulate", "--plan", "plan.json", "--bandwidth-trace", "bandwidth.json"],
                        {"--timeline": "t.json", "--png": "t.png"},
                        ("plan.json", "bandwidth.json", "profile.json", "cluster.json")),
    "simulate --plan --profile": (["simulate", "--plan", "plan.json", "--profile", "profile.json", "--cluster",
                                   "cluster.json"], {"--trace": "t.json", "--png": "t.png"},
                                  ("profile.json", "cluster.json", "plan.json")),
    "simulate FILE": (["simulate", "order.csv", "--bandwidth-trace", "bandwidth.json"],
                      {"--timeline": "t.json", "--png": "t.png"},
                      ("order.csv", "bandwidth.json")),
    "show cluster": (["show", "cluster", "cluster.json"], {"--png": "c.png"}, ("cluster.json",)),
    "profile": (["profile", f"{MODULE}:build", "-b", "8"], {"--out": "p.json"}, (f"{MODULE}.py",)),
    "adapt": (["adapt", "--plan", "plan.json", "--bandwidth-trace", "bandwidth.json", "--iterations", "2"], {"--png": "a.png"},
              ("plan.json", "bandwidth.json", "profile.json", "cluster.json")),
    "adapt --profile": (["adapt", "--plan", "plan.json", "--bandwidth-trace", "bandwidth.json", "--iterations", "2",
                         "--profile", "profile.json", "--cluster", "cluster.json"], {"--png": "a.png"},
              ("plan.json", "bandwidth.json", "profile.json", "cluster.json")),
    "trace periodic": (["trace", "periodic", *PERIODIC, "--links", "inter-node", "--cluster", "cluster.json"], TRACE_OUTPUT,
                       ("cluster.json",)),
    "trace markov": (["trace", "markov", "--seed", "1", "--mean-slow-ms", "10", "--mean-fast-ms", "10", "--factor-range",
                      "0.1,0.5", "--duration-ms", "100", "--links", "inter-node", "--cluster", "cluster.json"], TRACE_OUTPUT,
                     ("cluster.json",)),
    "trace replay": (["trace", "replay", "series.csv", "--nominal", "10"], TRACE_OUTPUT, ("series.csv",)),
    "trace replay --cluster": (["trace", "replay", "series.csv", "--nominal", "10", "--links", "inter-node", "--cluster",
                                "cluster.json"], TRACE_OUTPUT, ("cluster.json", "series.csv")),
    "probe": (["probe", "--profile", "profile.json"], {"--out": "c.json"}, ("profile.json",)),
    "probe --module": (["probe", "--profile", "profile.json", "--module", f"{MODULE}:build"], {"--out": "c.json"},
                       ("profile.json", f"{MODULE}.py")),
    "train --plan": (["train", "--local", "2", "--plan", "plan.json"], TRAIN_OUTPUTS,
                     ("plan.json", "profile.json", "cluster.json")),
    "train --plan --profile": (["train", "--local", "2", "--plan", "plan.json", "--profile", "profile.json", "--cluster",
                                "cluster.json"], TRAIN_OUTPUTS, ("profile.json", "cluster.json", "plan.json")),
    "train --schedule FILE": (["train", "--local", "2", "--schedule", "order.csv", "--bandwidth-trace", "bandwidth.json"],
                              TRAIN_OUTPUTS, ("order.csv", "bandwidth.json")),
    "train --module": (["train", "--local", "2", "--schedule", "1f1b", "--module", f"{MODULE}:build"], TRAIN_OLD_NAME,
                       (f"{MODULE}.py",)),
    "train --data": (["train", "--local", "2", "--schedule", "1f1b", "--data", f"{MODULE}:build", "--loss",
                      f"{MODULE}:build"], TRAIN_OUTPUTS, (f"{MODULE}.py",)),
    "profile --data": (["profile", "mlp", "-b", "8", "--data", f"{MODULE}:build", "--loss", f"{MODULE}:build"],
                       {"--out": "p.json"}, (f"{MODULE}.py",)),
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
    (folder / "series.csv").write_text("time_s,value\n0,10\n1,5\n2,10\n")
    (folder / f"{MODULE}.py").write_text("def build():\n    raise SystemExit('the guard must refuse before any import')\n")


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


def declared_name(command: str) -> str:
    """The name cli.file_options declares `command` (a key of COMMANDS) under."""
    argv = COMMANDS[command][0]
    return " ".join(argv[:2]) if argv[0] in ("show", "trace") else argv[0]


def test_every_declared_output_and_input_option_is_tried_here() -> None:
    """COMMANDS covers every output option of every command and every input option beside it, as declared."""
    tried: dict[str, set[str]] = {}
    for command, (argv, outputs, _) in COMMANDS.items():
        tried.setdefault(declared_name(command), set()).update(outputs, (a for a in argv if a.startswith("--")))
    for name, files in COMMAND_FILES.items():
        if not files.outputs:
            continue
        wanted = {flag for flag in (*files.outputs, *files.inputs, *files.modules) if flag.startswith("--")}
        assert wanted <= tried.get(name, set()), (name, wanted - tried.get(name, set()))


NEEDS_TORCH = {"profile", "profile --data"}
"""Commands that import torch before they check their outputs (profile's batch sizes come from the torch profiler)."""
OUTPUT_CASES_PLAIN = [(command, flag) for command, (_, outputs, _) in COMMANDS.items() for flag in outputs]
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
@pytest.mark.parametrize(
    "command", [pytest.param(c, marks=pytest.mark.torch) if c in NEEDS_TORCH else c for c, (_, _, i) in COMMANDS.items() if i]
)
def test_an_output_naming_an_input_is_refused_however_it_is_spelled(command: str, tmp_path: Path) -> None:
    """An output that names one of the command's inputs (given, or named by its plan file), spelled any way or through
    a hard link, is refused; the input keeps its bytes."""
    write_inputs(tmp_path)
    _, outputs, inputs = COMMANDS[command]
    for flag in outputs:
        for name in inputs:
            for path in spellings(tmp_path, name):
                assert_refused(tmp_path, command_args(command, {flag: path}), flag, repr(path), "is the input")
        (tmp_path / "hard").unlink(missing_ok=True)
        os.link(tmp_path / inputs[0], tmp_path / "hard")
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
@pytest.mark.parametrize("command", ["plan", "simulate --plan", "simulate FILE", "show cluster", "adapt", "trace replay"])
def test_a_file_the_command_wrote_is_replaced_keeping_its_mode(command: str, tmp_path: Path) -> None:
    """A file of the output's kind that pipeplan wrote (or an empty one) is no input: run again, the command
    rewrites it, with its mode kept."""
    write_inputs(tmp_path)
    outputs = COMMANDS[command][1]
    with inside(tmp_path):
        code, err = run_cli(command_args(command, outputs))
        assert code == 0, err
        for path in outputs.values():
            Path(path).write_bytes(Path(path).read_bytes() + b"\n")  # still its kind: a byte later, its own file
            Path(path).chmod(0o640)
        before = {path: Path(path).read_bytes() for path in outputs.values()}
        code, err = run_cli(command_args(command, outputs))
    assert code == 0, err
    for path in outputs.values():
        assert (tmp_path / path).read_bytes() != before[path]
        assert (tmp_path / path).stat().st_mode & 0o777 == 0o640


FILE_CASES = [
    pytest.param(command, flag, marks=pytest.mark.torch) if command in NEEDS_TORCH else (command, flag)
    for command, flag in OUTPUT_CASES_PLAIN
    if not is_folder(command, flag)
]


def _foreign(tmp_path: Path) -> dict[str, bytes]:
    """Files an output must not replace: a model's source, notes, JSON of no pipeplan kind, and each pipeplan kind
    (a plan, a PNG, a Perfetto timeline) where another kind is written."""
    write_inputs(tmp_path)
    trace = b'{"displayTimeUnit":"ms","otherData":{},"traceEvents":[]}\n'
    png = b"\x89PNG\r\n\x1a\n" + b"\0" * 16
    return {"source": b"def build():\n    pass\n", "notes": b"my notes\n", "json": b'{"name": "mine"}\n',
            "plan": (tmp_path / "plan.json").read_bytes(), "png": png, "perfetto": trace}  # fmt: skip


@pytest.mark.parametrize(("command", "flag"), FILE_CASES)
def test_a_file_of_another_kind_at_an_output_is_refused(command: str, flag: str, tmp_path: Path) -> None:
    """Every file output of every command, at a file pipeplan did not write of that kind (a source file, notes, a
    JSON or PNG of another kind): refused naming the flag and the way out, the file byte-identical."""
    kind = COMMAND_FILES[declared_name(command)].outputs[flag]
    good = COMMANDS[command][1][flag]
    for name, content in _foreign(tmp_path).items():
        (tmp_path / good).write_bytes(content)
        if kind.holds(tmp_path / good):
            continue  # its own kind (a PNG where a PNG is written)
        assert_refused(tmp_path, command_args(command, {flag: good}), flag, repr(good), "pipeplan replaces only its own files")
        assert (tmp_path / good).read_bytes() == content, name


@pytest.mark.parametrize(("command", "flag"), FILE_CASES)
def test_an_output_without_its_kind_s_ending_is_refused(command: str, flag: str, tmp_path: Path) -> None:
    """`--out x.py` for a JSON file, `--png x.json`: refused naming the ending the kind needs, nothing written."""
    write_inputs(tmp_path)
    kind = COMMAND_FILES[declared_name(command)].outputs[flag]
    wrong = "model.py"
    assert_refused(tmp_path, command_args(command, {flag: wrong}), flag, repr(wrong), f"must end with {kind.suffixes[0]}")
    assert not (tmp_path / wrong).exists()


def test_a_gradients_file_pipeplan_did_not_write_is_refused(tmp_path: Path) -> None:
    """train --save-grads DIR replaces DIR/grads-rank-N.pt only when it is torch.save's zip: a file of the user's
    there is refused before any process starts, named, untouched."""
    write_inputs(tmp_path)
    (tmp_path / "grads").mkdir()
    (tmp_path / "grads" / "grads-rank-1.pt").write_text("mine\n")
    argv = command_args("train --schedule FILE", {"--save-grads": "grads"})
    assert_refused(tmp_path, argv, "--save-grads 'grads': 'grads-rank-1.pt' exists and is not a gradients file")


DISK_FULL = [
    ("plan", "--out"),
    ("compare", "--png"),
    ("simulate --plan", "--timeline"),
    ("simulate --plan", "--png"),
    ("show cluster", "--png"),
    ("adapt", "--png"),
    ("trace replay", "--out"),
]
"""Every output a command writes in its own process (train's, probe's and demo's are written by their workers and
steps, through the same writer: tests/test_atomic.py)."""


@pytest.mark.slow
@pytest.mark.parametrize(("command", "flag"), DISK_FULL)
def test_a_full_disk_is_one_line_naming_the_option_and_leaves_nothing(command: str, flag: str, full_folder: Path) -> None:
    """An output on a full disk: exit 1, one line `NoSpaceError: FLAG 'PATH' not written: no space left on device`,
    no file and no temporary file left there."""
    folder = full_folder.parent
    write_inputs(folder)
    target = f"full/{COMMANDS[command][1][flag]}"
    fill(full_folder)
    with inside(folder):
        code, err = run_cli(command_args(command, {flag: target}))
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 1, err
    assert len(lines) == 1 and lines[0].startswith(f"error: NoSpaceError: {flag} {target!r} not written: no space left on device")
    assert leftovers(full_folder) == []


@pytest.mark.slow
@pytest.mark.torch
def test_train_s_outputs_on_a_full_disk_are_said_after_the_results(full_folder: Path) -> None:
    """train --local 2 with --timeline, --png and --save-grads on a full disk (a filled tmpfs: the ranks are other
    processes): the results printed, each rank's line naming its options and "no space left on device", exit 1, and
    no file or temporary file left."""
    import subprocess
    import sys

    if not os.path.ismount(full_folder):
        pytest.skip("the ranks are other processes: this needs a real full disk (a tmpfs)")
    fill(full_folder)
    argv = ["train", "--local", "2", "--schedule", "1f1b", "--steps", "2", "-b", "8", "-q",
            "--timeline", "full/t.json", "--png", "full/t.png", "--save-grads", "full/g"]  # fmt: skip
    done = subprocess.run([sys.executable, "-c", "from pipeplan.cli import main; main()", *argv], cwd=full_folder.parent,
                          capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "measured:" in done.stdout
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors and all("not written: no space left on device (ENOSPC)" in line for line in errors), done.stderr
    said = " ".join(errors)
    for option in ("--timeline 'full/t.json'", "--png 'full/t.png'", "--save-grads 'full/g': grads-rank-0.pt"):
        assert option in said, done.stderr
    assert [p for p in full_folder.rglob("*") if p.is_file() and p.name != "pad"] == []
