"""The launcher's environment variables (torchrun's, or --local's), checked before torch.distributed reads them.

Note:
    torch.distributed parses RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT in
    C++: `RANK=abc` ends in a Python traceback, `RANK=5` of `WORLD_SIZE=2` or
    `RANK=-1` in pages of C++ log lines and a wait for peers that never come.
    Every value is checked here first, so a bad one is one line naming the
    variable and its value. Torch-free: the CLI checks the environment before
    it does anything else.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from pipeplan.core.errors import TrainConfigError
from pipeplan.core.limits import DEVICES

REQUIRED = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
"""What torchrun (or --local) sets and torch.distributed's env:// rendezvous needs."""
_COUNT = re.compile(r"[0-9]{1,12}")
_WAY_OUT = "start the job with torchrun or with --local N, which set it"


@dataclass(frozen=True, slots=True)
class LaunchEnv:
    """This process's place in the job, as the launcher said it: rank of world_size, on master_addr:master_port."""

    rank: int
    world_size: int
    master_addr: str
    master_port: int
    local_rank: int | None = None


def check_launch_env(environ: Mapping[str, str] | None = None) -> None:
    """Check the launcher variables that are set (a missing one is `read_launch_env`'s to name).

    Raises:
        TrainConfigError: a value that is not a count, a negative rank, RANK >= WORLD_SIZE, LOCAL_RANK >=
            LOCAL_WORLD_SIZE, WORLD_SIZE 0 or beyond core.limits.DEVICES, a port outside 1..65535, an empty or
            spaced address (naming the variable and its value).
    """
    env = os.environ if environ is None else environ
    counts = {name: _count(env, name) for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")}
    for name in ("WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        value = counts[name]
        if value is not None and value < 1:
            raise TrainConfigError(
                f"environment variable {name}={_shown(env[name])} must be >= 1 (the number of processes); {_WAY_OUT}"
            )
    world = counts["WORLD_SIZE"]
    if world is not None and not DEVICES.allows(world):
        raise TrainConfigError(f"environment variable {DEVICES.message('WORLD_SIZE', world)}; {_WAY_OUT}")
    for rank_name, size_name in (("RANK", "WORLD_SIZE"), ("LOCAL_RANK", "LOCAL_WORLD_SIZE")):
        rank, size = counts[rank_name], counts[size_name]
        if rank is not None and size is not None and rank >= size:
            raise TrainConfigError(
                f"environment variable {rank_name}={_shown(env[rank_name])} is not below {size_name}={_shown(env[size_name])}: "
                f"the ranks of {size} processes are 0..{size - 1}; {_WAY_OUT}"
            )
    if "MASTER_PORT" in env:
        port = env["MASTER_PORT"]
        if not _COUNT.fullmatch(port) or not 1 <= int(port) <= 65535:
            raise TrainConfigError(f"environment variable MASTER_PORT={_shown(port)} must be a port in 1..65535; {_WAY_OUT}")
    if "MASTER_ADDR" in env:
        addr = env["MASTER_ADDR"]
        if not addr or any(c.isspace() for c in addr) or len(addr) > 253:
            raise TrainConfigError(f"environment variable MASTER_ADDR={_shown(addr)} must be a host name or address; {_WAY_OUT}")


def read_launch_env(environ: Mapping[str, str] | None = None) -> LaunchEnv:
    """This process's place in the job, every variable present and checked.

    Raises:
        TrainConfigError: a variable missing (not started by torchrun or --local), or one `check_launch_env` refuses.
    """
    env = os.environ if environ is None else environ
    missing = [name for name in REQUIRED if name not in env]
    if missing:
        raise TrainConfigError(f"pipeplan train must run under torchrun or with --local N (missing {', '.join(missing)})")
    check_launch_env(env)
    local = _count(env, "LOCAL_RANK")
    return LaunchEnv(int(env["RANK"]), int(env["WORLD_SIZE"]), env["MASTER_ADDR"], int(env["MASTER_PORT"]), local)


def _count(env: Mapping[str, str], name: str) -> int | None:
    """The variable as a count (an integer >= 0), None when unset.

    Raises:
        TrainConfigError: set but not an integer >= 0 (a sign, a fraction, letters, spaces, more than 12 digits).
    """
    if name not in env:
        return None
    text = env[name]
    if not _COUNT.fullmatch(text):
        raise TrainConfigError(f"environment variable {name}={_shown(text)} must be an integer >= 0; {_WAY_OUT}")
    return int(text)


def _shown(text: str) -> str:
    """A variable's value as a message quotes it: its first 40 characters."""
    return repr(text) if len(text) <= 40 else f"{text[:40]!r}... ({len(text):,} characters)"
