"""A character-level language-modelling corpus that every machine has: the Python standard library's own sources.

The files under `sysconfig.get_paths()["stdlib"]` (tests and vendored
packages left out) are read in sorted order; every tenth file goes to the
held-out split, so no text is shared between the splits. Characters are
bytes: ASCII keeps its code, anything else becomes 0 (a vocabulary of 128).
Each sample is `seq_len` characters, its target the same window shifted by
one (the next character at every position).
"""

from __future__ import annotations

import os
import sysconfig
from pathlib import Path

import torch

from pipeplan.core.errors import TrainConfigError

VOCAB = 128
"""Characters are ASCII codes; every other byte is 0."""

SKIP = frozenset({"test", "tests", "idlelib", "site-packages", "lib2to3", "ensurepip", "__pycache__", "turtledemo"})
"""Folders left out: tests, vendored and third-party code, and generated files."""


def source_files(root: str | None = None) -> list[Path]:
    """The standard library's .py files in sorted order (a deterministic list on one Python version)."""
    top = Path(root or sysconfig.get_paths()["stdlib"])
    if not top.is_dir():
        raise TrainConfigError(f"--dataset pysource needs the Python standard library's sources; {str(top)!r} is not a folder")
    found = []
    for folder, dirs, files in os.walk(top):
        dirs[:] = sorted(d for d in dirs if d not in SKIP and not d.startswith("."))
        found.extend(Path(folder) / f for f in sorted(files) if f.endswith(".py"))
    return sorted(found)


def encode(text: bytes) -> torch.Tensor:
    """Bytes as int64 character ids: ASCII as is, others 0."""
    ids = torch.frombuffer(bytearray(text), dtype=torch.uint8).to(torch.int64)
    return torch.where(ids < VOCAB, ids, torch.zeros_like(ids))


def windows(ids: torch.Tensor, seq_len: int, limit: int) -> tuple[torch.Tensor, torch.Tensor]:
    """At most `limit` non-overlapping windows: inputs ids[i : i + seq_len], targets shifted by one."""
    count = min(limit, (len(ids) - 1) // seq_len)
    if count < 1:
        raise TrainConfigError(f"the corpus holds {len(ids)} characters, too few for one window of {seq_len}")
    starts = torch.arange(count) * seq_len
    offsets = torch.arange(seq_len)
    return ids[starts[:, None] + offsets], ids[starts[:, None] + offsets + 1]


def python_corpus(
    seq_len: int = 64, train_windows: int = 8192, test_windows: int = 1024, root: str | None = None
) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """((train inputs, targets), (test inputs, targets)) of the standard library's sources (module docstring)."""
    train, test = bytearray(), bytearray()
    need = {0: (train_windows + 1) * seq_len + 1, 1: (test_windows + 1) * seq_len + 1}
    for i, path in enumerate(source_files(root)):
        part = test if i % 10 == 9 else train
        if len(part) >= need[int(part is test)]:
            if len(train) >= need[0] and len(test) >= need[1]:
                break
            continue
        try:
            part.extend(path.read_bytes())
        except OSError:
            continue
    return windows(encode(bytes(train)), seq_len, train_windows), windows(encode(bytes(test)), seq_len, test_windows)
