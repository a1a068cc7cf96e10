"""A refusal every rank meets is said once: rank 0 says it, another rank only a line rank 0 does not say (naming its
rank); under torchrun before the process group forms and after, and without a store every process says its own."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from datetime import timedelta
from pathlib import Path

import pytest

pytest.importorskip("torch")

from torch.distributed import TCPStore

from pipeplan.runtime.training import error_once
from pipeplan.runtime.training.error_once import speaks

pytestmark = pytest.mark.torch

SRC = str(Path(__file__).resolve().parents[1] / "src")
SHARED = "error: TrainConfigError: rank {rank}: --steps must be >= 1, got 0"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> TCPStore:
    """A launcher's store on 127.0.0.1, and this process made a rank of a 3-process job that uses it."""
    host = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(host.port))
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setattr(error_once, "WAIT_S", 0.3)
    return host


def _as_rank(monkeypatch: pytest.MonkeyPatch, rank: int) -> None:
    monkeypatch.setenv("RANK", str(rank))


def test_rank_0_says_a_shared_line_and_the_others_stay_quiet(store: TCPStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 0 speaks; ranks 1 and 2, whose lines differ from rank 0's only in the rank, do not."""
    _as_rank(monkeypatch, 0)
    assert speaks(SHARED.format(rank=0))
    for rank in (1, 2):
        _as_rank(monkeypatch, rank)
        assert not speaks(SHARED.format(rank=rank))


def test_a_line_rank_0_does_not_say_is_said_by_the_first_rank_that_has_it(
    store: TCPStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A line of ranks 1 and 2 alone: rank 1 (the first to ask) says it after the wait, rank 2 does not; a line of
    rank 2 alone is said by rank 2."""
    line = "error: RuntimeFault: rank {rank}: cannot reach peer 0"
    _as_rank(monkeypatch, 1)
    assert speaks(line.format(rank=1))
    _as_rank(monkeypatch, 2)
    assert not speaks(line.format(rank=2))
    assert speaks("error: ProfileError: rank 2: cuda:2 is not a device here")


def test_once_rank_0_said_another_line_a_rank_speaks_without_waiting(store: TCPStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 0 failed with one line; rank 1's other line is said at once (not one poll of the wait: torchrun stops
    the workers soon after rank 0 exits), rank 2's copy of rank 1's line is not, nor its copy of rank 0's."""
    polls: list[float] = []
    monkeypatch.setattr(error_once, "WAIT_S", 60.0)
    monkeypatch.setattr(error_once.time, "sleep", polls.append)
    _as_rank(monkeypatch, 0)
    assert speaks(SHARED.format(rank=0))
    _as_rank(monkeypatch, 1)
    assert speaks("error: RuntimeFault: rank 1: peer 0 closed the connection")
    _as_rank(monkeypatch, 2)
    assert not speaks("error: RuntimeFault: rank 2: peer 0 closed the connection")
    assert not speaks(SHARED.format(rank=2))
    assert polls == []


def test_every_process_speaks_without_a_job_or_a_store(monkeypatch: pytest.MonkeyPatch) -> None:
    """One process, a world of 1, no launcher's store and no group: each process says its own line."""
    for key in ("RANK", "WORLD_SIZE", "TORCHELASTIC_USE_AGENT_STORE"):
        monkeypatch.delenv(key, raising=False)
    assert speaks(SHARED.format(rank=0))
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert speaks(SHARED.format(rank=1))
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert speaks(SHARED.format(rank=1))  # no store to ask (ranks started by hand, before the group)


def _torchrun(args: list[str], cwd: Path, nprocs: int = 3) -> subprocess.CompletedProcess[str]:
    """`torchrun --nproc-per-node N ARGS` on 127.0.0.1 (one node, a port chosen now)."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(nprocs),
            "--master-addr", "127.0.0.1", "--master-port", str(free_port()), *args]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=240)


def _errors(done: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in done.stderr.splitlines() if line.startswith("error:")]


@pytest.mark.slow
def test_a_flag_refusal_under_torchrun_is_said_once_before_the_group_forms(tmp_path: Path) -> None:
    """`torchrun --nproc-per-node 3 -m pipeplan train --steps 0`: each process refuses the flag before it joins the
    group, and the user reads the line once."""
    done = _torchrun(["-m", "pipeplan", "train", "--schedule", "gpipe", "-p", "3", "--steps", "0"], tmp_path)
    assert _errors(done) == ["error: TrainConfigError: --steps must be >= 1, got 0"], done.stderr
    assert "exitcode  : 2" in done.stderr


SCRIPT = """
import os
import torch.distributed as dist
from pipeplan.runtime.training.error_once import say_error

dist.init_process_group("gloo")
rank = dist.get_rank()
say_error(f"error: TrainConfigError: rank {rank}: the dataset has no held-out split")
if rank == 2:
    say_error("error: ProfileError: rank 2: only this rank's file is missing")
dist.barrier()
dist.destroy_process_group()
"""


def _by_hand(script: Path, nprocs: int = 3) -> subprocess.CompletedProcess[str]:
    """The script as rank r of N started by hand (torchrun's variables, no launcher's store: the group's own), its
    processes' stderr joined."""
    port, procs = str(free_port()), []
    for rank in range(nprocs):
        env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHELASTIC")}
        env.update(RANK=str(rank), WORLD_SIZE=str(nprocs), MASTER_ADDR="127.0.0.1", MASTER_PORT=port, PYTHONPATH=SRC,
                   OMP_NUM_THREADS="1")  # fmt: skip
        procs.append(subprocess.Popen([sys.executable, str(script)], env=env, stderr=subprocess.PIPE, text=True))
    try:
        errs = [p.communicate(timeout=240)[1] for p in procs]
    finally:
        for p in procs:
            p.kill()
    code = max(p.returncode for p in procs)
    return subprocess.CompletedProcess([str(script)], code, "", "".join(errs))


@pytest.mark.slow
@pytest.mark.parametrize("started", ["torchrun", "by hand"])
def test_errors_after_the_group_forms_are_said_once_and_a_rank_s_own_names_it(tmp_path: Path, started: str) -> None:
    """Three processes in a gloo group (under torchrun: its agent's store; started by hand: the group's): the line
    all three say is printed once, by rank 0; the line of rank 2 alone is printed once, naming rank 2."""
    script = tmp_path / "say.py"
    script.write_text(textwrap.dedent(SCRIPT))
    done = _torchrun([str(script)], tmp_path) if started == "torchrun" else _by_hand(script)
    assert done.returncode == 0, done.stderr
    assert sorted(_errors(done)) == [
        "error: ProfileError: rank 2: only this rank's file is missing",
        "error: TrainConfigError: rank 0: the dataset has no held-out split",
    ], done.stderr


WORKERS_ONLY = """
import os
from torch import nn


def build(in_features: int = 64):
    if os.environ.get("RANK"):  # the launcher (no RANK) builds it; every worker fails alike
        raise RuntimeError("weights are on the launcher's disk only")
    return nn.Sequential(nn.Linear(in_features, 8), nn.ReLU(), nn.Linear(8, 8))
"""


@pytest.mark.slow
@pytest.mark.parametrize("command", ["train", "probe"])
def test_a_failure_every_local_rank_meets_is_said_once(tmp_path: Path, command: str) -> None:
    """train --local 3 and probe --local 3 whose three workers each fail to build the model: one `error:` line (rank
    0's), then the launcher's line about rank 0; exit 2."""
    (tmp_path / "workers_only_h32.py").write_text(WORKERS_ONLY)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.update(PYTHONPATH=SRC, OMP_NUM_THREADS="1")

    def pipeplan(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "pipeplan", *args], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=300)  # fmt: skip

    spec = "workers_only_h32:build"
    if command == "train":
        done = pipeplan("train", "--schedule", "gpipe", "-p", "3", "-m", "3", "-b", "9", "--module", spec, "--steps", "1",
                        "--local", "3", "--timeout", "60")  # fmt: skip
    else:
        made = pipeplan("profile", spec, "-b", "2", "--runs", "1", "--warmup", "0", "-o", "p.json")
        assert made.returncode == 0, made.stderr
        done = pipeplan("probe", "--local", "3", "--profile", "p.json", "--module", spec, "-o", "c.json", "--rounds", "1")
    assert done.returncode == 2, done.stderr
    errors = _errors(done)
    assert len(errors) == 1 and "the factory raised RuntimeError: weights are on the launcher's disk only" in errors[0]
    assert "rank 0: " in errors[0], done.stderr
