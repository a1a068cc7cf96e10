"""An error that every process of a job meets alike, said once: by rank 0, or by the first rank that met it alone.

Note:
    Every process of a job reads the same command line and runs the same checks, so a bad flag, a missing module or
    a model that cannot be built is found by each of them, and under torchrun each printed the same line (torchrun
    passes every worker's stderr on). The --local launcher's relay (worker_output) already drops repeats it sees,
    but torchrun has no such relay. So each process asks the job's store (the one torchrun's agent and the --local
    launcher host before any process group forms, TORCHELASTIC_USE_AGENT_STORE; else the group's own) before it
    prints: rank 0 records the line (its rank left out, worker_output.error_key) and prints it; any other rank
    waits up to WAIT_S for rank 0 to record a line, and stays quiet if it is the same. A line rank 0 does not say
    is printed by the first other rank that said it (naming its rank, as every worker's error does): at once when
    rank 0 has said another, else after WAIT_S (torchrun stops every worker soon after one exits, so a rank must
    not wait long once rank 0 has failed otherwise). Without a store to ask (one process, a store that cannot be
    reached) every process prints its own line, as before.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import time
from datetime import timedelta
from typing import Any

from pipeplan.runtime.training.worker_output import error_key

WAIT_S = 3.0
"""How long a rank other than 0 waits for rank 0 to say the same error (the ranks of a job meet a shared error
within moments of each other: the same checks on the same inputs)."""
POLL_S = 0.05
KEY = "pipeplan/error"
"""The store's key prefix (beside torch's own keys: never one of them)."""


def say_error(line: str) -> None:
    """Print the `error:` line `line` on stderr, unless another process of this job says the same (module note)."""
    if speaks(line):
        with contextlib.suppress(OSError, ValueError):  # stderr gone: nothing to say it on
            print(line.rstrip("\n"), file=sys.stderr, flush=True)


def speaks(line: str) -> bool:
    """Whether this process prints `line`: always in a job of one process or without a store, else rank 0, or the
    first other rank that said a line rank 0 does not say within WAIT_S."""
    rank, world = _int_env("RANK"), _int_env("WORLD_SIZE")
    if rank is None or world is None or world < 2:
        return True
    store = _store()
    if store is None:
        return True
    digest = hashlib.sha256((error_key(line) or line).encode()).hexdigest()[:20]
    job = f"{os.environ.get('TORCHELASTIC_RUN_ID', '')}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    said_by_0, said_by_others = f"{KEY}/{job}/rank0", f"{KEY}/{job}/{digest}/others"
    try:
        if rank == 0:
            store.set(said_by_0, digest)
            return True
        first = store.add(said_by_others, 1) == 1
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            if store.check([said_by_0]):  # rank 0 has failed: quiet when with this line, at once when with another
                return bytes(store.get(said_by_0)).decode() != digest and first
            time.sleep(POLL_S)
        return first
    except Exception:  # the store's host has gone (rank 0 hosted it and failed first): say it here
        return True


def _store() -> Any:
    """The job's store: the launcher's (torchrun's agent or the --local launcher), reachable before any process group
    forms, else the process group's own; None when neither can be reached."""
    try:
        if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
            from torch.distributed import TCPStore

            host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
            return TCPStore(host, port, is_master=False, timeout=timedelta(seconds=WAIT_S), wait_for_workers=False)
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            from torch.distributed.distributed_c10d import _get_default_store

            store = _get_default_store()
            store.set_timeout(timedelta(seconds=WAIT_S))
            return store
    except Exception:  # no launcher's store and no group: every process says its own line
        return None
    return None


def _int_env(name: str) -> int | None:
    """An environment variable as a non-negative integer, None when unset or not one."""
    text = os.environ.get(name, "")
    return int(text) if text.isdigit() else None
