"""The local launcher names the rank that caused a failure, even when its peers exit in the same instant; killing
the launcher in any way leaves no worker alive; a full disk at the end of a run loses no result."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

from pipeplan.runtime.training.launch import launch_local

pytestmark = pytest.mark.torch  # every test here needs torch (make test-fast leaves them out)

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


def _reap(session: subprocess.Popen[str]) -> None:
    """Kill the session a test started (its launcher and workers), should anything be left, and wait for it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(session.pid, signal.SIGKILL)
    if session.returncode is None:
        session.communicate(timeout=30)


@pytest.mark.slow
def test_a_killed_rank_is_named_as_the_cause_when_its_peer_exits_at_once(tmp_path, capfd) -> None:  # type: ignore[no-untyped-def]
    code = launch_local(2, WORKER, [str(tmp_path / "flag")], grace_s=5.0)
    err = capfd.readouterr().err
    assert "rank 1 was killed by SIGKILL" in err
    assert code == 128 + 9


@pytest.mark.slow
def test_a_hung_rank_is_stopped_and_listed(tmp_path, capfd) -> None:  # type: ignore[no-untyped-def]
    hang = "import os, sys, time\nif os.environ['RANK'] == '1':\n    time.sleep(60)\nsys.exit(3)\n"
    code = launch_local(2, hang, grace_s=0.5)
    err = capfd.readouterr().err
    assert "rank 0 exited with code 3; stopping the other ranks" in err
    assert "stopped ranks 1 after the failure" in err
    assert code == 3


@pytest.mark.slow
def test_all_ranks_succeeding_returns_zero(capfd) -> None:  # type: ignore[no-untyped-def]
    assert launch_local(2, "pass") == 0
    assert "pipeplan:" not in capfd.readouterr().err


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie (one that is reaped between the open and the read is gone too)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def _default_sigint() -> None:
    """In the child before exec: SIGINT back to its default disposition."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _children(pid: int) -> list[int]:
    """The live processes whose parent is `pid` (read from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry.name))
    return found


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the workers through /proc")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGKILL])
def test_killing_the_launcher_in_any_way_leaves_no_worker_alive(signum: int) -> None:
    """`train --local 2` killed mid-run by SIGTERM, SIGINT, SIGHUP (stopped by the launcher) or SIGKILL (the workers
    notice their launcher is gone): no worker is alive 10 s later."""
    from runtime_cli import BOOT

    argv = [sys.executable, "-c", BOOT, "train", "--local", "2", "--schedule", "1f1b", "-p", "2", "-m", "2", "-b", "8",
            "--steps", "1000000", "--opt", "hidden=8", "--opt", "blocks=1", "--no-predict"]  # fmt: skip
    # SIGINT at its default in the launcher, as in a terminal: a suite started in the background (`make test &`,
    # nohup) passes SIGINT down ignored, and Python then raises no KeyboardInterrupt.
    launcher = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                                preexec_fn=_default_sigint)  # fmt: skip
    try:
        assert launcher.stdout is not None
        line = launcher.stdout.readline()  # rank 0's first step: the workers are training
        assert line.startswith("step "), (line, launcher.stderr.read() if launcher.poll() is not None else "")
        workers = _children(launcher.pid)
        assert len(workers) == 2
        launcher.send_signal(signum)
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [pid for pid in workers if _alive(pid)], signal.Signals(signum).name
        _, err = launcher.communicate(timeout=30)
        if signum != signal.SIGKILL:  # the launcher stopped them itself, saying so, and exits 128 + n
            assert launcher.returncode == 128 + signum
            assert f"{signal.Signals(signum).name} received; stopping every rank" in err
    finally:
        _reap(launcher)


ORPHAN = """
import os, subprocess, sys, time
child = '''
import sys, time
sys.platform = "unknown"  # no parent-death signal: only the watchdog thread is left to notice
from pipeplan.runtime.training.launch import watch_launcher
watch_launcher()
print("watching", flush=True)
time.sleep(60)
'''
env = dict(os.environ, PIPEPLAN_LAUNCHER_PID=str(os.getpid()))
worker = subprocess.Popen([sys.executable, "-c", child], env=env, stdout=subprocess.PIPE, text=True)
worker.stdout.readline()
print(worker.pid, flush=True)
time.sleep(60)
"""


@pytest.mark.slow
def test_a_worker_whose_launcher_is_gone_exits_by_its_watchdog_alone() -> None:
    """Without the parent-death signal (other systems), the worker's watchdog thread notices a SIGKILLed launcher
    within a second or two and exits, saying why."""
    launcher = subprocess.Popen([sys.executable, "-c", ORPHAN], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert launcher.stdout is not None
        worker = int(launcher.stdout.readline())
        launcher.kill()
        launcher.wait(timeout=10)
        deadline = time.monotonic() + 10
        while _alive(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(worker)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(launcher.pid, signal.SIGKILL)
        launcher.communicate(timeout=30)


@pytest.mark.slow
def test_a_full_disk_at_the_end_of_train_keeps_the_results_and_says_one_line(tmp_path: Path) -> None:
    """Writing the trace fails (a file-size limit: the kernel refuses as on a full disk): the JSON results are still
    printed, rank 0 says in one line what was not written, no peer prints a traceback, no temporary file is left."""
    import json
    import resource

    from runtime_cli import BOOT

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (512, 512))

    trace = tmp_path / "t.json"
    argv = [sys.executable, "-c", BOOT, "train", "--local", "2", "--schedule", "1f1b", "-p", "2", "-m", "2", "-b", "8",
            "--steps", "2", "--opt", "hidden=8", "--opt", "blocks=1", "--no-predict", "--json",
            "--timeline", str(trace)]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, preexec_fn=small_files)
    assert done.returncode == 1, done.stderr
    assert len(json.loads(done.stdout)["losses"]) == 2
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: OutputError: rank 0: --timeline {str(trace)!r} not written: no space left on device (EFBIG: file too large)"
    ], done.stderr
    assert "Traceback" not in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def _launcher(code: str, preexec: object = None) -> subprocess.Popen[str]:
    """A launcher of 2 workers running `code`, in a session of its own (as a terminal's job), its output piped."""
    boot = f"import sys\nfrom pipeplan.runtime.training.launch import launch_local\nsys.exit(launch_local(2, {code!r}))\n"
    return subprocess.Popen([sys.executable, "-c", boot], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=preexec)  # type: ignore[arg-type]  # fmt: skip


UP = """import os, time
os.write(1, f"up {os.getpid()}\\n".encode())
try:
    while True:
        time.sleep(0.05)
except KeyboardInterrupt:
    os.write(2, b"Traceback (most recent call last): KeyboardInterrupt in a worker\\n")
    raise
"""
"""Worker code: say its pid, then wait in Python code (where a SIGINT becomes KeyboardInterrupt and a traceback:
written at once here, before the launcher's SIGTERM can cut it short)."""


def _ignored(pid: int) -> int:
    """The mask of signals process `pid` ignores (SigIgn in /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return int(line.split()[1], 16)
    raise AssertionError(f"no SigIgn in /proc/{pid}/status")


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads the signal masks from /proc")
def test_a_sighup_ignored_when_the_launcher_starts_stays_ignored_by_it_and_its_workers() -> None:
    """Under nohup (SIGHUP ignored before the launcher starts), a hang-up sent to the whole job stops nothing: the
    launcher and both workers still ignore SIGHUP and run on; SIGTERM then stops the job as usual."""

    def ignore_hup() -> None:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    launcher = _launcher(UP, ignore_hup)
    try:
        assert launcher.stdout is not None
        workers = [int(launcher.stdout.readline().split()[1]) for _ in range(2)]
        hup = 1 << (signal.SIGHUP - 1)
        assert all(_ignored(pid) & hup for pid in [launcher.pid, *workers])
        os.killpg(launcher.pid, signal.SIGHUP)
        time.sleep(1.0)
        assert launcher.poll() is None and all(_alive(pid) for pid in workers)
        launcher.send_signal(signal.SIGTERM)
        _, err = launcher.communicate(timeout=30)
        assert launcher.returncode == 128 + signal.SIGTERM
        assert err == "pipeplan: SIGTERM received; stopping every rank\n"
    finally:
        _reap(launcher)


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGHUP])
def test_a_ctrl_c_or_hang_up_to_the_whole_job_prints_one_line_and_no_traceback(signum: int) -> None:
    """SIGINT (Ctrl-C) or SIGHUP sent to every process of the job, as a terminal sends it: the workers leave it
    to the launcher, which says so in one line, stops them, and exits 128 + n; no worker prints a traceback."""
    launcher = _launcher(UP, _default_sigint)
    try:
        assert launcher.stdout is not None
        workers = [int(launcher.stdout.readline().split()[1]) for _ in range(2)]
        assert all(_ignored(pid) & (1 << (signum - 1)) for pid in workers)  # left to the launcher
        for pid in workers:  # the whole job, the workers first (a terminal's order is not defined)
            os.kill(pid, signum)
        time.sleep(0.5)
        os.kill(launcher.pid, signum)
        _, err = launcher.communicate(timeout=30)
        assert err == f"pipeplan: {signal.Signals(signum).name} received; stopping every rank\n"
        assert launcher.returncode == 128 + signum
    finally:
        _reap(launcher)


@pytest.mark.slow
def test_an_error_every_rank_finds_is_printed_once_and_other_lines_pass_live(capfd) -> None:  # type: ignore[no-untyped-def]
    """Both ranks print the same `error:` line (with their rank) and a line of their own: the error reaches stderr
    once (the first rank's), both other lines pass, and the launcher's one line about the failure follows the lines of
    the rank it names (the other rank's may still be on their way: it exits when it is stopped, or on its own)."""
    code = (
        "import os, sys\nrank = os.environ['RANK']\nprint(f'note from rank {rank}', file=sys.stderr, flush=True)\n"
        "print(f'error: TrainConfigError: rank {rank}: --opt hidden=abc is not an integer', file=sys.stderr, flush=True)\n"
        "sys.exit(2)\n"
    )
    assert launch_local(2, code, grace_s=5.0) == 2
    lines = capfd.readouterr().err.splitlines()
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].endswith(": --opt hidden=abc is not an integer"), lines
    assert sorted(line for line in lines if line.startswith("note")) == ["note from rank 0", "note from rank 1"]
    launcher = [i for i, line in enumerate(lines) if line.startswith("pipeplan: rank ")]
    assert len(launcher) == 1 and lines[launcher[0]].endswith("exited with code 2; stopping the other ranks"), lines
    failed = lines[launcher[0]].split()[2]
    assert lines.index(f"note from rank {failed}") < launcher[0], lines


API_JOB = """import sys
from pipeplan.api import probe_local
try:
    probe_local(2, rounds=10000, on_progress=lambda done, total: print("polling", flush=True))
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(130)
"""


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the workers through /proc")
def test_a_ctrl_c_during_an_api_local_job_stops_it_in_one_line_and_reaches_the_caller() -> None:
    """probe_local (the launcher in the caller's thread) under SIGINT to every process: one launcher line, no worker
    traceback, and the caller gets KeyboardInterrupt once the workers are stopped."""
    job = subprocess.Popen([sys.executable, "-c", API_JOB], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True, preexec_fn=_default_sigint)  # fmt: skip
    try:
        assert job.stdout is not None
        assert job.stdout.readline() == "polling\n"
        workers = _children(job.pid)
        assert len(workers) == 2
        for pid in workers:
            os.kill(pid, signal.SIGINT)
        time.sleep(0.5)
        os.kill(job.pid, signal.SIGINT)
        out, err = job.communicate(timeout=60)
        assert err == "pipeplan: SIGINT received; stopping every rank\n"
        assert out.splitlines()[-1] == "interrupted" and job.returncode == 130
        assert not [pid for pid in workers if _alive(pid)]
    finally:
        _reap(job)


@pytest.mark.slow
def test_a_job_larger_than_an_environment_variable_reaches_every_worker(tmp_path: Path) -> None:
    """launch_local's `job` (here 400 KB, over Linux's 128 KiB cap on one environment string, which a job carrying
    a 1,251-layer profile exceeds) reaches each worker whole through the rendezvous store (read_job)."""
    job = bytes(range(256)) * 1600
    code = (
        "import hashlib, os, sys\n"
        "from pipeplan.runtime.training.launch import read_job\n"
        "data = read_job()\n"
        "open(os.path.join(sys.argv[1], os.environ['RANK']), 'w').write(f'{len(data)} {hashlib.sha256(data).hexdigest()}')\n"
    )
    assert launch_local(2, code, [str(tmp_path)], job=job, timeout_s=120) == 0
    import hashlib

    want = f"{len(job)} {hashlib.sha256(job).hexdigest()}"
    assert [(tmp_path / str(r)).read_text() for r in range(2)] == [want, want]
