"""A user's model code: its module imported (a missing one named with the folder that holds it and the way out) and
its factory called (a factory that raises or returns no model said in one line).

Note:
    A MODULE_SPEC `my_models:build` names code on the user's disk. Two things go wrong with it before any pipeplan
    code runs: the module is not found (the user runs from another folder than the one holding my_models.py), or
    the factory fails (it raises, or returns None, a tensor, a string). Either is said in one line naming the spec,
    and for a missing module the folders searched, a folder near the working one that holds the module, and the
    way out (`PYTHONPATH=<folder>` or running from that folder). `check_factory` calls the factory once before any
    process starts (on the meta device: shapes only, nothing allocated), so N processes never each fail alike.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import torch
from torch import nn

from pipeplan.core.errors import PipeplanError, ProfileError
from pipeplan.models.model_spec import ModelSpec

SEARCH_DEPTH = 3
"""How many folders below the working one are looked through for a missing module (and how many above it)."""
SEARCH_FOLDERS = 2000
"""At most this many folders are looked through: the hint must cost nothing noticeable in a large tree."""
SKIPPED = frozenset({"__pycache__", "node_modules", "site-packages", "dist-packages", "venv", "env"})
"""Folders never looked through for a user's module (besides hidden ones)."""


def import_user_module(module_name: str, spec: str) -> object:
    """Import `module_name`; a module missing from the path is looked for in the working folder too (last).

    `python -m pipeplan` drops the working folder from the front of its path (pipeplan/__main__) and the installed
    `pipeplan` script never has it: `pipeplan profile my_model:build` run beside my_model.py still finds it, and a
    `numpy.py` beside it is never imported. The folder goes last on the path, so it never shadows an installed
    package. A --local worker never adds it (may_look_here): it has its launcher's path, with the folder already
    there when the launcher's module_origin found the module in it.

    Raises:
        ProfileError: the module is not found (missing_module's line), or importing it fails (its first line).
    """
    from pipeplan.models.zoo.vision_compat import prepare_torchvision, unavailable_reason

    prepare_torchvision()  # before the user's code, which may import torchvision (or transformers, which does)
    top = module_name.partition(".")[0]
    try:
        try:
            return importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != top or not may_look_here():
                raise
            sys.path.append(os.getcwd())
            return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == top:
            raise ProfileError(missing_module(spec, top)) from None
        why = _first_line(exc)
        if exc.name == "torchvision" and unavailable_reason() is not None:
            why = f"torchvision is installed but cannot be imported beside this torch: {unavailable_reason()}"
        raise ProfileError(f"MODULE_SPEC {spec!r}: cannot import module {module_name!r} ({why})") from None
    except Exception as exc:  # the user's module raised while it was imported: one line, not a traceback
        raise ProfileError(
            f"MODULE_SPEC {spec!r}: importing module {module_name!r} raised {type(exc).__name__}: {_first_line(exc)}{_where(exc)}"
        ) from None


def missing_module(spec: str, top: str) -> str:
    """The one line for a module found nowhere: the spec, the folders searched, a folder near the working one that
    holds `top` (when one does), and the way out."""
    here = os.getcwd()
    searched = f"on the import path nor in the working folder {here}"
    if sys.flags.safe_path:
        searched = "on the import path (python -P and every --local worker leave the working folder out)"
    found = find_module_folder(top, Path(here))
    if found is not None and str(found) == here:
        way_out = f"found {found / _file_of(top, found)}: set PYTHONPATH={found}"
    elif found is not None:
        way_out = f"found {found / _file_of(top, found)}: run from {found}, or set PYTHONPATH={found}"
    else:
        way_out = f"run from the folder that holds {top}.py (or the package {top}/), or set PYTHONPATH=<that folder>"
    return f"MODULE_SPEC {spec!r}: cannot import module {top!r}: not found {searched}; {way_out}"


def find_module_folder(top: str, start: Path) -> Path | None:
    """The nearest folder to `start` holding `top.py` or a package `top/`: `start` itself, its parents (up to
    SEARCH_DEPTH above), then the folders below it (SEARCH_DEPTH deep, breadth first, SEARCH_FOLDERS at most), else
    None."""
    for parent in [start, *list(start.parents)[:SEARCH_DEPTH]]:
        if _holds(parent, top):
            return parent
    for folder in _folders_below(start):
        if _holds(folder, top):
            return folder
    return None


def may_look_here() -> bool:
    """Whether a module missing from the path may be looked for in the working folder: not when the interpreter was
    told to keep that folder off its path (-P, PYTHONSAFEPATH; every --local worker runs so, with its launcher's
    path), and not when the folder is already searched."""
    here = os.getcwd()
    return not sys.flags.safe_path and here not in sys.path and "" not in sys.path


def call_factory(spec: str, factory: Callable[..., object], options: Mapping[str, object]) -> nn.Module | ModelSpec:
    """Call a user's factory with `options`; what it returns, checked to be a model.

    Raises:
        ProfileError: the factory raised (its exception's type and first line, and where in the user's code), or
            returned something other than an nn.Module or a ModelSpec (naming its type). A PipeplanError the
            factory raises passes as it is.
    """
    try:
        result = factory(**options)
    except PipeplanError:
        raise
    except Exception as exc:
        raise ProfileError(
            f"MODULE_SPEC {spec!r}: the factory raised {type(exc).__name__}: {_first_line(exc)}{_where(exc)}; fix the "
            "factory, or check the options given to it"
        ) from None
    if not isinstance(result, nn.Module | ModelSpec):
        shown = "None" if result is None else f"a {type(result).__name__}"
        raise ProfileError(
            f"MODULE_SPEC {spec!r}: the factory returned {shown}, not a model: it must return the model (an "
            "nn.Module, e.g. an nn.Sequential) or a ModelSpec"
        )
    return result


def check_factory(spec: str, options: Mapping[str, object]) -> None:
    """Call the factory of a `package.module:factory` spec once, before any process starts, and refuse it when it
    raises or returns no model (call_factory); a built-in name is pipeplan's own and is not called.

    The call runs on the meta device (shapes only: a large model costs no memory), with torch's random state left
    as it was. A factory that raises there is called once more on the CPU, so that only what fails for real is
    refused (code that reads a tensor's values cannot run on the meta device). A factory with a parameter that has
    no default and no option (`in_features`, `seed`: the build supplies them) is left to the build.

    Raises:
        ProfileError: as call_factory, or as the import of the spec's module (import_user_module).
    """
    from pipeplan.models.specs import coerce_options, factory_of

    if ":" not in spec.strip():
        return
    factory = factory_of(spec)
    coerced = coerce_options(spec, factory, dict(options))
    if not _binds(factory, coerced):
        return  # a parameter without a default that the build supplies (in_features, seed): checked when built
    with torch.random.fork_rng(devices=[]):
        try:
            with torch.device("meta"):
                call_factory(spec, factory, coerced)
            return
        except ProfileError as on_meta:
            if "the factory raised" not in str(on_meta):
                raise
        call_factory(spec, factory, coerced)


def _binds(factory: Callable[..., object], options: Mapping[str, object]) -> bool:
    """Whether `factory` can be called with `options` alone (every parameter without a default given)."""
    try:
        inspect.signature(factory).bind(**options)
    except TypeError:
        return False
    except ValueError:  # no signature to read (a builtin): call it
        return True
    return True


def _folders_below(start: Path) -> Iterator[Path]:
    """The folders under `start`, breadth first, SEARCH_DEPTH deep and SEARCH_FOLDERS at most, hidden and SKIPPED
    ones left out."""
    level, seen = [start], 0
    for _ in range(SEARCH_DEPTH):
        below: list[Path] = []
        for folder in level:
            try:
                entries = sorted(os.scandir(folder), key=lambda e: e.name)
            except OSError:
                continue
            for entry in entries:
                if entry.name.startswith(".") or entry.name in SKIPPED or not entry.is_dir(follow_symlinks=False):
                    continue
                seen += 1
                if seen > SEARCH_FOLDERS:
                    return
                yield Path(entry.path)
                below.append(Path(entry.path))
        level = below


def _holds(folder: Path, top: str) -> bool:
    """Whether `folder` holds module `top` (a file or a package); False where it cannot be read."""
    try:
        return (folder / f"{top}.py").is_file() or (folder / top / "__init__.py").is_file()
    except OSError:
        return False


def _file_of(top: str, folder: Path) -> str:
    """The name of `top`'s file or package in `folder`."""
    return f"{top}.py" if (folder / f"{top}.py").is_file() else f"{top}/"


def _first_line(exc: BaseException) -> str:
    """An exception's message in one line (its type's name when it has none)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _where(exc: BaseException) -> str:
    """` (file.py:LINE)`: the deepest frame of the traceback in the user's code (not pipeplan's, not an installed
    package's, not Python's own), where it raised; empty when there is none."""
    tb = exc.__traceback__
    where = ""
    others = (str(Path(__file__).resolve().parents[1]), sys.base_prefix, sys.prefix, "<")
    while tb is not None:
        path = tb.tb_frame.f_code.co_filename
        if not path.startswith(others) and "-packages" + os.sep not in path:
            where = f" ({os.path.basename(path)}:{tb.tb_lineno})"
        tb = tb.tb_next
    return where
