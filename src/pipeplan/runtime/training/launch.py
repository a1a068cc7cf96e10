"""`--local N`: start N processes on this machine over loopback, as torchrun would, with a watchdog.

Note:
    The launcher hosts the rendezvous store itself on 127.0.0.1 and a port
    the kernel picks (port 0), so no port is guessed and no other address is
    used; the workers connect to it as torchrun's workers connect to their
    agent's store (TORCHELASTIC_USE_AGENT_STORE). When a worker exits
    non-zero, the others get `grace_s` seconds to notice and report, then
    they are terminated: the job never hangs on a dead rank. SIGTERM, SIGINT
    or SIGHUP to the launcher stops every worker (SIGTERM, then SIGKILL after
    3 s) before it exits with 128 + the signal's number. A launcher that
    cannot clean up (SIGKILL, a crash) leaves no orphans either: each worker
    started by `WORKER_BOOT`-like code calls `watch_launcher`, which asks the
    kernel for SIGTERM when the launcher dies (Linux's parent-death signal)
    and watches the parent pid from a thread (everywhere else).

    Every worker is this interpreter running `python -P -c PRELUDE + code`:
    the prelude puts the launcher's own import path in place before anything
    is imported (`worker_path`: never the working folder, where a stray
    `numpy.py` or `pipeplan.py` would otherwise be imported first by every
    worker), and leaves SIGINT and SIGHUP to the launcher, which stops the
    workers itself (one line, no worker tracebacks; the launcher ignores
    them while it starts the workers, so they start ignored). A signal the launcher
    found ignored when it started (`nohup` ignores SIGHUP) stays ignored, in
    the launcher and its workers. The workers' stderr passes through the
    launcher (worker_output): live, each error said by several ranks once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import timedelta

from pipeplan.runtime.rank_errors import TrainConfigError
from pipeplan.runtime.training.worker_output import StderrRelay

LOOPBACK = "127.0.0.1"
LAUNCHER_PID = "PIPEPLAN_LAUNCHER_PID"
"""The environment variable that tells a worker the pid of the --local launcher that started it."""
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP) if hasattr(signal, "SIGHUP") else (signal.SIGTERM,)
"""Signals the launcher turns into a clean stop of every worker (SIGINT arrives as KeyboardInterrupt)."""
LEFT_TO_LAUNCHER = ("SIGINT", "SIGHUP")
"""Signals a worker ignores: a terminal sends them to the whole process group, and the launcher stops every worker
itself (SIGTERM), so a Ctrl-C gives one line instead of a traceback from every rank."""
WORKER_PATH = "PIPEPLAN_WORKER_PATH"
"""The environment variable holding the import path a worker runs with (the launcher's; os.pathsep between)."""
PRELUDE = (
    f"import os, sys; sys.path[:] = os.environ[{WORKER_PATH!r}].split(os.pathsep); import signal; "
    f"[signal.signal(getattr(signal, s), signal.SIG_IGN) for s in {LEFT_TO_LAUNCHER!r} if hasattr(signal, s)]; "
)
"""What every worker runs first: os and sys are loaded before any code runs, so the path is set before the first
import that searches it."""
JOB_KEY = "pipeplan/job"
"""The rendezvous store's key under which launch_local leaves the job its workers read (`read_job`)."""
PR_SET_PDEATHSIG = 1
"""prctl(2) option: the signal this process receives when its parent dies."""
WATCH_INTERVAL_S = 0.5


def worker_env(rank: int, world_size: int, port: int, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of local worker `rank`: torchrun's variables, loopback address, one thread unless set."""
    env = dict(os.environ if base is None else base)
    env.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
        GROUP_RANK="0",
        MASTER_ADDR=LOOPBACK,
        MASTER_PORT=str(port),
        TORCHELASTIC_USE_AGENT_STORE="True",
    )
    env[LAUNCHER_PID] = str(os.getpid())
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


class _Stopped(Exception):
    """The launcher itself received SIGTERM (raised by its handler so the watch loop unwinds and stops the workers)."""


def _raise_stopped(signum: int, frame: object) -> None:
    raise _Stopped(signum)


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def worker_path() -> list[str]:
    """The import path of the workers: this process's sys.path now, each folder made absolute, without `''` (the
    working folder, which `python -c` and a REPL search first: the workers never search it)."""
    path: list[str] = []
    for entry in sys.path:
        if entry and os.path.abspath(entry) not in path:
            path.append(os.path.abspath(entry))
    return path


def run_file(path: str) -> str:
    """Worker code that runs the Python file `path` as its `__main__` (sys.argv[1:] are the worker's args)."""
    return f"import runpy; runpy.run_path({os.path.abspath(path)!r}, run_name='__main__')"


def launch_local(
    nprocs: int,
    code: str,
    args: Sequence[str] = (),
    *,
    env: Mapping[str, str] | None = None,
    grace_s: float = 10.0,
    timeout_s: float | None = None,
    cwd: str | None = None,
    on_poll: Callable[[], None] | None = None,
    modules: Sequence[str | tuple[str, Mapping[str, object]]] = (),
    job: bytes | None = None,
) -> int:
    """Run Python `code` with `args` as `nprocs` local workers; return 0 when all succeed, else the first failure's
    code (non-zero), or 128 + a signal's number when the launcher was stopped by it.

    Args:
        nprocs: number of processes (ranks 0..nprocs-1).
        code: what each worker runs (`python -c code args...`, after PRELUDE: the launcher's import path).
        args: the worker's sys.argv[1:] (the same for every rank).
        env: base environment (default: this process's).
        grace_s: after the first failure, how long the others may take to exit on their own.
        timeout_s: kill everything after this many seconds (None: no limit); returns 124.
        on_poll: called about every 50 ms while the workers run (progress), in this thread.
        modules: the MODULE_SPECs the workers will build, found here first (models.specs.module_origin) so that
            the path the workers are given leads them to the same files; a (spec, options) pair also has its
            factory called here once (models.user_code.check_factory), so that a factory that raises or returns no
            model is refused in one line before any worker starts.
        job: bytes every worker reads with `read_job`, held in the rendezvous store (not in the environment, whose
            strings Linux caps at 128 KiB each: a job carrying a 1,251-layer profile is 413 KB; nor in a file).

    Raises:
        TrainConfigError: nprocs below 1.
        ProfileError: a module of `modules` that cannot be found, or whose factory fails.
    """
    if nprocs < 1:
        raise TrainConfigError(f"--local must be >= 1, got {nprocs}")
    from torch.distributed import TCPStore

    from pipeplan.models.specs import module_origin
    from pipeplan.models.user_code import check_factory

    for item in modules:
        spec, options = (item, None) if isinstance(item, str) else item
        module_origin(spec)
        if options is not None:
            check_factory(spec, options)

    argv = [sys.executable, "-P", "-c", PRELUDE + code, *args]
    base = {**(os.environ if env is None else env), WORKER_PATH: os.pathsep.join(worker_path())}
    store = TCPStore(LOOPBACK, 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=300))
    if job is not None:
        store.set(JOB_KEY, job)
    main_thread = threading.current_thread() is threading.main_thread()  # only there may a handler be set
    previous = {signum: signal.getsignal(signum) for signum in (*STOP_SIGNALS, signal.SIGINT)} if main_thread else {}
    procs: list[subprocess.Popen[bytes]] = []
    relay = StderrRelay()
    try:
        for signum in STOP_SIGNALS if main_thread else ():
            if previous[signum] is not signal.SIG_IGN:  # ignored (nohup): left ignored, and so inherited by the workers
                signal.signal(signum, _raise_stopped)
        with _ignored_while_spawning(previous):
            for r in range(nprocs):
                proc = subprocess.Popen(argv, env=worker_env(r, nprocs, store.port, base), cwd=cwd, stderr=subprocess.PIPE)
                procs.append(proc)
                assert proc.stderr is not None
                relay.follow(proc.stderr, r)
        return _watch(procs, relay, grace_s, timeout_s, on_poll)
    except (KeyboardInterrupt, _Stopped) as exc:
        signum = exc.args[0] if isinstance(exc, _Stopped) else signal.SIGINT
        name = signal.Signals(signum).name
        relay.write(f"pipeplan: {name} received; stopping every rank")
        for stop in previous:  # a second signal must not cut the clean-up short
            signal.signal(stop, signal.SIG_IGN)
        _stop(procs)
        return 128 + int(signum)
    finally:
        relay.finish()
        for stop, handler in previous.items():
            if handler is not None:  # None: a handler set outside Python, which cannot be put back
                signal.signal(stop, handler)
        del store


def read_job() -> bytes:
    """In a worker of launch_local: the `job` its launcher left in the rendezvous store (MASTER_ADDR/MASTER_PORT,
    which transport.launch_env has checked)."""
    from torch.distributed import TCPStore

    client = TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                      timeout=timedelta(seconds=60))  # fmt: skip
    return client.get(JOB_KEY)


@contextlib.contextmanager
def _ignored_while_spawning(previous: dict[signal.Signals, object]) -> Iterator[None]:
    """SIGINT and SIGHUP ignored in this process while it starts workers, which so start with them ignored (an
    ignored signal stays ignored across exec; PRELUDE would leave a moment before it runs), then as they were.
    Only where `previous` holds them (the main thread): elsewhere PRELUDE alone ignores them."""
    held = {}
    for name in LEFT_TO_LAUNCHER:
        signum = getattr(signal, name, None)
        if signum in previous and previous[signum] is not None:
            held[signum] = signal.signal(signum, signal.SIG_IGN)
    try:
        yield
    finally:
        for signum, handler in held.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]


def _watch(
    procs: list[subprocess.Popen[bytes]],
    relay: StderrRelay,
    grace_s: float,
    timeout_s: float | None,
    on_poll: Callable[[], None] | None,
) -> int:
    """Poll the workers until all exit or a failure's grace runs out; the job's exit code (see launch_local)."""
    started = time.monotonic()
    failed: tuple[int, int] | None = None
    reported: set[tuple[int, int]] = set()
    signalled: set[int] = set()
    deadline: float | None = None
    while True:
        codes = [p.poll() for p in procs]
        # A rank killed by a signal is the cause when its peers fail in the same poll round (they only noticed it).
        for rank, code in sorted(_failures(codes), key=lambda rc: (rc[1] > 0, rc[0])):
            if (rank, code) in reported:
                continue
            reported.add((rank, code))
            relay.drain(rank)  # its last lines (its reason) before the launcher's line about it
            if failed is None:
                failed = (rank, code)
                deadline = time.monotonic() + grace_s
                relay.write(f"pipeplan: rank {rank} {_describe_exit(code)}; stopping the other ranks")
            elif code < 0:
                relay.write(f"pipeplan: rank {rank} {_describe_exit(code)}")
        if all(c is not None for c in codes):
            break
        now = time.monotonic()
        if timeout_s is not None and now - started > timeout_s and failed is None:
            failed = (-1, 124)
            deadline = now
            relay.write(f"pipeplan: the job ran past {timeout_s:g} s; stopping every rank")
        if deadline is not None and now >= deadline:
            signalled = _stop(procs)
            break
        if on_poll is not None:
            on_poll()
        time.sleep(0.05)
    codes = [p.wait() for p in procs]
    relay.finish()
    if failed is None:
        bad = [(r, c) for r, c in enumerate(codes) if c != 0]
        failed = bad[0] if bad else None
    if failed is None:
        return 0
    for rank, code in _failures(codes):
        if code < 0 and rank not in signalled and (rank, code) not in reported:
            relay.write(f"pipeplan: rank {rank} {_describe_exit(code)}")
    stopped = sorted(signalled)
    if stopped:
        relay.write(f"pipeplan: stopped ranks {', '.join(map(str, stopped))} after the failure")
    code = failed[1]
    return code if code > 0 else 128 - code


def watch_launcher() -> None:
    """In a worker of `launch_local`: stop this process within seconds of its launcher's death, however it died.

    Linux delivers SIGTERM on the parent's death once asked (prctl
    PR_SET_PDEATHSIG); a daemon thread also polls the parent pid, which
    changes when the parent is gone, on every system. A launcher that died
    before this call is noticed at once. Outside launch_local's workers (no
    PIPEPLAN_LAUNCHER_PID, e.g. under torchrun) nothing is done.
    """
    text = os.environ.get(LAUNCHER_PID)
    if not text or not text.isdigit():
        return
    launcher = int(text)
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):  # without it, the watchdog below still stops the process
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    if os.getppid() != launcher:
        _orphaned(launcher)
    threading.Thread(target=_watch_parent, args=(launcher,), name="pipeplan-launcher-watch", daemon=True).start()


def _watch_parent(launcher: int) -> None:
    """Poll the parent pid; exit the process when it is no longer the launcher's."""
    while os.getppid() == launcher:
        time.sleep(WATCH_INTERVAL_S)
    _orphaned(launcher)


def _orphaned(launcher: int) -> None:
    """Say that the launcher is gone (if stderr still leads somewhere) and exit at once."""
    rank = os.environ.get("RANK", "?")
    with contextlib.suppress(OSError, ValueError):
        print(f"pipeplan: rank {rank}: the launcher (pid {launcher}) is gone; stopping", file=sys.stderr, flush=True)
    os._exit(128 + int(signal.SIGTERM))


def finish_worker(code: int = 0) -> None:
    """End a worker whose part is done: leave the process group with its peers, flush, and exit with `code` at once.

    A worker whose results could not all be written still meets its peers here
    (they are waiting in the same barrier) and then exits non-zero.

    Note:
        Leaving through the interpreter's normal shutdown runs the C++ static
        destructors while gloo's background threads may still be winding
        down; about one run in thirty then ended in `terminate called without
        an active exception` and SIGABRT after a successful job. The group is
        destroyed explicitly and the process exits before those destructors.
    """
    import torch.distributed as dist

    try:
        if dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()
    except Exception as exc:  # a peer that ended without the final barrier: one line, not a traceback
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        rank = os.environ.get("RANK", "0")
        print(f"error: rank {rank}: a peer ended before the job's final barrier ({first})", file=sys.stderr, flush=True)
        code = code or 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _failures(codes: Sequence[int | None]) -> list[tuple[int, int]]:
    """(rank, exit code) of every worker that has exited non-zero."""
    return [(rank, code) for rank, code in enumerate(codes) if code not in (None, 0)]


def _stop(procs: Sequence[subprocess.Popen[bytes]]) -> set[int]:
    """SIGTERM every running worker, then SIGKILL those still alive after 3 s; return the ranks signalled."""
    signalled = {rank for rank, p in enumerate(procs) if p.poll() is None}
    for rank in signalled:
        procs[rank].terminate()
    end = time.monotonic() + 3.0
    while time.monotonic() < end and any(p.poll() is None for p in procs):
        time.sleep(0.05)
    for p in procs:
        if p.poll() is None:
            p.kill()
    return signalled
