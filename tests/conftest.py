"""Shared test settings: hypothesis profiles sized for a 2-core CI machine, the one-thread fixture of timing tests and
one_process (a process group of this process alone), and the guard of the torch marker: a selection that leaves
torch tests out (`make test-fast`) runs no torch."""

import ast
import importlib.abc
import os
import re
import sys
import textwrap
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "default", deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
settings.register_profile("thorough", deadline=None, max_examples=500, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

TORCH_PACKAGES = ("torch", "transformers")


def _leaves_torch_out(config: pytest.Config) -> bool:
    """Whether the run's `-m` expression deselects every test marked torch (`make test-fast`'s "not torch and ...")."""
    expression = config.getoption("markexpr", "") or ""
    return re.search(r"\bnot torch\b", expression) is not None and re.search(r"\bor\b", expression) is None


def _marked_torch_whole(path: Path) -> bool:
    """Whether the test file's module-level `pytestmark` carries pytest.mark.torch (read, not imported)."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            marks = node.value.elts if isinstance(node.value, ast.List | ast.Tuple) else [node.value]
            return any(ast.unparse(mark) == "pytest.mark.torch" for mark in marks)
    return False


class _TorchRefused(importlib.abc.MetaPathFinder):
    """Under a selection that leaves torch out, importing torch (or transformers) fails the test that does it."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> None:
        if fullname.split(".")[0] in TORCH_PACKAGES:
            raise ImportError(
                f"{fullname} imported under -m 'not torch' (make test-fast runs no torch): mark the test that "
                "imports it @pytest.mark.torch (or the whole file: pytestmark = pytest.mark.torch)"
            )


def pytest_configure(config: pytest.Config) -> None:
    """The guard: with torch tests deselected, no test may import torch (files wholly marked torch are not read)."""
    if _leaves_torch_out(config) and not any(name in sys.modules for name in TORCH_PACKAGES):
        sys.meta_path.insert(0, _TorchRefused())


class _LeftOut(pytest.Module):
    """A test file wholly marked torch, under a selection that leaves torch out: nothing collected, nothing imported."""

    def collect(self) -> list[pytest.Item]:
        return []


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makemodule(module_path: Path, parent: pytest.Collector) -> pytest.Module | None:
    """A test file wholly marked torch is not even imported when torch tests are left out: every test in it would
    be deselected, and importing it would import torch."""
    if _leaves_torch_out(parent.config) and _marked_torch_whole(module_path):
        return _LeftOut.from_parent(parent, path=module_path)
    return None


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
