"""Shared by the runtime tests: run `pipeplan train` in a fresh interpreter."""

from __future__ import annotations

import os
import subprocess
import sys

BOOT = "from pipeplan.cli import main; main()"


def run_train(args: list[str], env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run `pipeplan train ARGS` in a fresh interpreter and capture its output."""
    full_env = dict(os.environ, **(env or {}))
    argv = [sys.executable, "-c", BOOT, "train", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=full_env)
