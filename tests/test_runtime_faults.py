"""Runtime faults: a failing rank stops the job quickly, naming rank and action; a killed run resumes exactly."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("sklearn")

from runtime_cli import run_train

pytestmark = pytest.mark.torch  # every test here needs torch (make test-fast leaves them out)

JOB = ["--local", "2", "--schedule", "1f1b", "-p", "2", "-m", "4", "--opt", "hidden=16", "--opt", "blocks=3",
       "--batch-size", "32", "--lr", "1e-2", "--no-predict", "--seed", "5"]  # fmt: skip


@pytest.mark.slow
def test_killed_run_resumes_with_the_same_losses_as_an_uninterrupted_run(tmp_path: Path) -> None:
    """SIGKILL on rank 1 in iteration 6 stops the job; --resume from the step-4 checkpoint repeats the uninterrupted losses."""
    whole = run_train([*JOB, "--steps", "8", "--json"])
    assert whole.returncode == 0, whole.stderr
    expected = json.loads(whole.stdout)["losses"]

    ckpt = str(tmp_path / "ckpt")
    killed = run_train([*JOB, "--steps", "8", "--checkpoint-dir", ckpt, "--checkpoint-every", "2", "--json"],
                       env={"PIPEPLAN_FAULT": "1:5:1F1:kill"})  # fmt: skip
    assert killed.returncode != 0
    assert "rank 1 was killed by SIGKILL" in killed.stderr
    assert "rank 0 (pipeline rank 0), step 5: at action" in killed.stderr
    assert json.loads((tmp_path / "ckpt" / "latest.json").read_text())["step"] == 4

    resumed = run_train([*JOB, "--steps", "8", "--checkpoint-dir", ckpt, "--resume", "--json"])
    assert resumed.returncode == 0, resumed.stderr
    out = json.loads(resumed.stdout)
    assert out["start_step"] == 4
    assert out["losses"] == expected[4:]


@pytest.mark.slow
def test_a_rank_that_raises_stops_every_rank_naming_rank_and_action() -> None:
    """An exception in rank 0's action 0F2 makes both ranks exit non-zero well within the timeout, each naming its action."""
    start = time.monotonic()
    done = run_train([*JOB, "--steps", "3", "--timeout", "60"], env={"PIPEPLAN_FAULT": "0:1:0F2:raise"})
    elapsed = time.monotonic() - start
    assert done.returncode == 1
    assert "rank 0 (pipeline rank 0), step 1: at action 0F2: InjectedFault" in done.stderr
    assert "rank 1 (pipeline rank 1), step 1: at action 1" in done.stderr
    assert elapsed < 60


@pytest.mark.slow
def test_a_hung_rank_makes_its_peer_time_out_and_the_job_exit() -> None:
    """Rank 1 hangs in iteration 1; rank 0 gives up after --timeout 4 s naming the awaited gradient; rank 1 is stopped."""
    done = run_train([*JOB, "--steps", "2", "--timeout", "4"], env={"PIPEPLAN_FAULT": "1:1:1B0:hang"}, timeout=120)
    assert done.returncode == 1
    assert "rank 0 (pipeline rank 0), step 1: at action 0B0: waiting for grad 1->0 of microbatch 0 from process 1" in done.stderr
    assert "stopped ranks 1 after the failure" in done.stderr
