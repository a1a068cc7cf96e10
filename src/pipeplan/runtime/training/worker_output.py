"""The local launcher's relay of its workers' stderr: every line passes through live, an error line only once.

Note:
    Every rank of a job checks the same command line and the same files, so a bad value is found by each of them
    and each prints the same `error:` line, differing only in its `rank N: ` part. The launcher reads the workers'
    stderr line by line (one reader thread per worker) and passes on each line as it comes, except an `error:` line
    whose message, its rank left out, was already passed on: the user reads each error once, from the first rank
    that said it. Lines are written whole, under one lock, so the ranks' lines no longer interleave mid-line.
"""

from __future__ import annotations

import re
import sys
import threading
from typing import IO

RANK_PART = re.compile(r"^(error: (?:[A-Za-z_]\w*: )?)rank \d+: ")
"""`error: Kind: rank N: ` (or `error: rank N: `): the rank that said an error, left out when lines are compared."""
JOIN_S = 2.0
"""How long the launcher waits for a reader to pass on the last lines of a worker that has exited (a grandchild
holding the pipe open must not hold the launcher)."""


def error_key(line: str) -> str | None:
    """The line an error is compared by (its rank left out), or None for a line that is not an `error:` line."""
    if not line.startswith("error:"):
        return None
    return RANK_PART.sub(r"\1", line.rstrip("\r\n"))


class StderrRelay:
    """Pass the workers' stderr lines on to this process's stderr, each `error:` message once (see the module note)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._said: set[str] = set()
        self._threads: dict[int, threading.Thread] = {}

    def follow(self, stream: IO[bytes], rank: int) -> None:
        """Start passing on the lines of one worker's stderr pipe (until the worker closes it)."""
        thread = threading.Thread(target=self._relay, args=(stream,), name=f"pipeplan-stderr-{rank}", daemon=True)
        thread.start()
        self._threads[rank] = thread

    def passes(self, line: str) -> bool:
        """Whether `line` is passed on: any line but an `error:` line already said by a rank (then it is recorded)."""
        key = error_key(line)
        if key is None:
            return True
        with self._lock:
            if key in self._said:
                return False
            self._said.add(key)
            return True

    def _relay(self, stream: IO[bytes]) -> None:
        try:
            for raw in iter(stream.readline, b""):
                self.write(raw.decode(errors="replace"))
        except (OSError, ValueError):  # the pipe closed under the reader: nothing more to pass on
            pass
        finally:
            stream.close()

    def write(self, line: str) -> None:
        """Write one line (with its newline) to stderr unless it repeats an error already said."""
        if not self.passes(line):
            return
        with self._lock:
            try:
                sys.stderr.write(line if line.endswith("\n") else line + "\n")
                sys.stderr.flush()
            except (OSError, ValueError):  # the launcher's own stderr is gone: the worker must not block on it
                pass

    def drain(self, rank: int, timeout_s: float = JOIN_S) -> None:
        """Wait (at most `timeout_s`) for the reader of exited worker `rank` to pass on what it wrote last."""
        thread = self._threads.get(rank)
        if thread is not None:
            thread.join(timeout_s)

    def finish(self, timeout_s: float = JOIN_S) -> None:
        """Wait (each at most `timeout_s`) for the readers to pass on what the exited workers wrote last."""
        for rank in self._threads:
            self.drain(rank, timeout_s)
