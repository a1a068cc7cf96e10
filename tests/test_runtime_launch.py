"""The local launcher names the rank that caused a failure, even when its peers exit in the same instant."""

from __future__ import annotations

import sys

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
