"""The local launcher names the rank that caused a failure, even when its peers exit in the same instant; a signal
to the launcher stops every worker."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

from pipeplan.runtime.launch import launch_local

# Rank 1 marks a file and SIGKILLs itself; rank 0 exits 1 as soon as it sees the file, as a peer that noticed a
# broken connection would: both exits usually land in the same poll round of the launcher.
WORKER = """
import os, signal, sys, time
rank = int(os.environ["RANK"])
flag = sys.argv[1]
if rank == 1:
    open(flag, "w").close()
    os.kill(os.getpid(), signal.SIGKILL)
while not os.path.exists(flag):
    time.sleep(0.001)
sys.exit(1)
"""


def test_a_killed_rank_is_named_as_the_cause_when_its_peer_exits_at_once(tmp_path, capfd) -> None:  # type: ignore[no-untyped-def]
    code = launch_local(2, [sys.executable, "-c", WORKER, str(tmp_path / "flag")], grace_s=5.0)
    err = capfd.readouterr().err
    assert "rank 1 was killed by SIGKILL" in err
    assert code == 128 + 9


def test_a_hung_rank_is_stopped_and_listed(tmp_path, capfd) -> None:  # type: ignore[no-untyped-def]
    hang = "import os, sys, time\nif os.environ['RANK'] == '1':\n    time.sleep(60)\nsys.exit(3)\n"
    code = launch_local(2, [sys.executable, "-c", hang], grace_s=0.5)
    err = capfd.readouterr().err
    assert "rank 0 exited with code 3; stopping the other ranks" in err
    assert "stopped ranks 1 after the failure" in err
    assert code == 3


def test_all_ranks_succeeding_returns_zero(capfd) -> None:  # type: ignore[no-untyped-def]
    assert launch_local(2, [sys.executable, "-c", "pass"]) == 0
    assert "pipeplan:" not in capfd.readouterr().err


# The launcher under test runs in its own interpreter so that SIGTERM reaches it, not pytest.
LAUNCHER = """
import sys
from pipeplan.runtime.launch import launch_local
worker = "import os, time\\nopen(os.path.join(%r, os.environ['RANK']), 'w').write(str(os.getpid()))\\ntime.sleep(120)\\n"
sys.exit(launch_local(2, [sys.executable, "-c", worker]))
"""


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_launcher_stops_every_worker(tmp_path: Path, signum: int) -> None:
    """SIGTERM (as a job scheduler sends) or SIGINT to the launcher: both workers are gone when it exits 128 + n."""
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER % str(tmp_path)], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not ((tmp_path / "0").exists() and (tmp_path / "1").exists()) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)  # the pid files are written; give the writes a moment to land
    pids = [int((tmp_path / str(rank)).read_text()) for rank in (0, 1)]
    launcher.send_signal(signum)
    _, err = launcher.communicate(timeout=30)
    assert launcher.returncode == 128 + signum
    assert f"{signal.Signals(signum).name} received; stopping every rank" in err
    assert not any(_alive(pid) for pid in pids)
