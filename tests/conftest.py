"""Shared test settings: hypothesis profiles sized for a 2-core CI machine, the one-thread fixture of timing tests and
one_process (a process group of this process alone)."""

import os
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "default", deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
settings.register_profile("thorough", deadline=None, max_examples=500, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """Timing tests share 2 cores with other jobs: one torch thread keeps them stable (torch imported only here)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def one_process() -> Iterator[None]:
    """A process group of this process alone (an in-memory store: no port): pipeplan.distribute on one rank."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def importable(folder: Path, monkeypatch: pytest.MonkeyPatch, name: str, source: str) -> Path:
    """A user module `name` (dedented `source`) written to `folder` and importable from there for one test: the
    folder first on the path, no bytecode written, any earlier import of it forgotten."""
    (folder / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    monkeypatch.delitem(sys.modules, name, raising=False)
    return folder
