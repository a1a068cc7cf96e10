"""Code never runs from the working folder: a `numpy.py`, `torch.py` or `pipeplan.py` lying there is imported by
neither the launcher nor any worker, on every way a job starts (train and probe --local from the command line, the
API's local jobs, a torchrun-style process), and a module the user names is imported by every worker from the file
the launcher found."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

pytestmark = [pytest.mark.torch, pytest.mark.slow]

SRC = str(Path(__file__).resolve().parents[1] / "src")
SHADOWS = ("numpy", "torch", "pipeplan")
SHADOW = "import os\nopen(os.path.join({folder!r}, 'MARK-{name}-' + str(os.getpid())), 'w').close()\nraise SystemExit(97)\n"
TINY = ["--schedule", "1f1b", "-p", "2", "-m", "2", "-b", "8", "--steps", "1", "--opt", "hidden=8", "--opt", "blocks=1",
        "--no-predict"]  # fmt: skip


def _shadowed(folder: Path, names: tuple[str, ...] = SHADOWS) -> Path:
    """A working folder where each module of `names` marks a file when imported (and exits 97)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / f"{name}.py").write_text(SHADOW.format(folder=str(folder), name=name))
    return folder


def _marks(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("MARK-"))


def _script(tmp_path: Path) -> list[str]:
    """The installed `pipeplan` script's form: a file in a folder of its own that calls the CLI."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "pipeplan"
    script.write_text("import sys\nfrom pipeplan.cli import main\nsys.exit(main())\n")
    return [sys.executable, str(script)]


def _run(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PYTHONPATH": SRC, **(env or {})}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        if env is None or key not in env:
            full.pop(key, None)
    return subprocess.run(argv, cwd=cwd, env=full, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("form", ["script", "module"])
def test_train_local_imports_nothing_from_the_working_folder(form: str, tmp_path: Path) -> None:
    """`pipeplan train --local 2` (the installed script, and `python -m pipeplan`) beside a numpy.py and a torch.py
    (and, for the script, a pipeplan.py: `python -m` itself would run that one) trains, and nothing marks a file."""
    names = SHADOWS if form == "script" else ("numpy", "torch")
    here = _shadowed(tmp_path / "work", names)
    head = _script(tmp_path) if form == "script" else [sys.executable, "-m", "pipeplan"]
    done = _run([*head, "train", "--local", "2", *TINY], here)
    assert done.returncode == 0, done.stderr
    assert _marks(here) == []


def test_probe_local_imports_nothing_from_the_working_folder(tmp_path: Path) -> None:
    """`pipeplan probe --local 2` beside the shadowing modules writes its cluster, and nothing marks a file."""
    here = _shadowed(tmp_path / "work")
    done = _run([*_script(tmp_path), "probe", "--local", "2", "-o", "c.json", "--rounds", "1"], here)
    assert done.returncode == 0, done.stderr
    assert (here / "c.json").is_file()
    assert _marks(here) == []


def test_api_local_jobs_import_nothing_from_the_working_folder(tmp_path: Path) -> None:
    """probe_local (a local job: local_jobs' workers) from a script run in the shadowed folder: nothing marks a file."""
    here = _shadowed(tmp_path / "work")
    script = tmp_path / "job.py"
    script.write_text("from pipeplan.api import probe_local\nprint(len(probe_local(2, rounds=1).devices))\n")
    done = _run([sys.executable, str(script)], here)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "2"
    assert _marks(here) == []


def test_a_torchrun_style_process_imports_nothing_from_the_working_folder(tmp_path: Path) -> None:
    """`python -m pipeplan train` as torchrun starts it (RANK, WORLD_SIZE, MASTER_* set; here a world of 1) beside
    a numpy.py and a torch.py: it trains, and nothing marks a file."""
    here = _shadowed(tmp_path / "work", ("numpy", "torch"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port)}  # fmt: skip
    argv = [sys.executable, "-m", "pipeplan", "train", *TINY]
    argv[argv.index("-p") + 1] = "1"
    done = _run(argv, here, env)
    assert done.returncode == 0, done.stderr
    assert _marks(here) == []


USER_MODEL = """import os
from torch import nn

with open(os.path.join({folder!r}, "LOADED-" + str(os.getpid())), "w") as out:
    out.write(os.path.abspath(__file__))


def build(in_features: int = 64) -> nn.Sequential:
    return nn.Sequential(nn.Linear(in_features, 16), nn.ReLU(), nn.Linear(16, 10))
"""


def test_a_module_named_on_the_command_line_is_imported_by_every_worker_from_the_launchers_file(tmp_path: Path) -> None:
    """`train --local 2 --module mymodel:build` run beside mymodel.py (and a numpy.py): the launcher and both workers
    import that very file (the launcher found it in the working folder, last on its path), and no shadow is imported."""
    here = _shadowed(tmp_path / "work", ("numpy", "torch", "pipeplan"))
    (here / "mymodel.py").write_text(USER_MODEL.format(folder=str(here)))
    argv = [*_script(tmp_path), "train", "--local", "2", *TINY[:-5], "--module", "mymodel:build", "--dataset", "digits",
            "--no-predict"]  # fmt: skip
    done = _run(argv, here)
    assert done.returncode == 0, done.stderr
    loaded = [p.read_text() for p in here.iterdir() if p.name.startswith("LOADED-")]
    # the launcher (it checks --module's factory before any start) and both workers: one file
    assert loaded == [str(here / "mymodel.py")] * 3
    assert _marks(here) == []


def test_worker_path_is_the_launchers_without_the_working_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """worker_path: the launcher's sys.path in order, '' left out, relative folders made absolute, no repeats."""
    from pipeplan.runtime.training.launch import worker_path

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", ["", "rel", "/abs/one", str(tmp_path / "rel"), "/abs/one"])
    assert worker_path() == [str(tmp_path / "rel"), "/abs/one"]
