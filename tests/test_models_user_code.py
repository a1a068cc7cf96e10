"""A user's model code: a module run from another folder is named with the folder that holds it and PYTHONPATH, and a
factory that raises or returns no model is one line, exit 2, before any rank starts (profile, train --local 2,
probe --local 2, profile_model, train_local)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")

import torch
from torch import nn

from pipeplan.core.errors import ProfileError
from pipeplan.models.specs import resolve_module_spec
from pipeplan.models.user_code import call_factory, check_factory, find_module_folder, missing_module

pytestmark = pytest.mark.torch

SRC = str(Path(__file__).resolve().parents[1] / "src")
MODELS = '''
import os
import torch
from torch import nn


class Tiny(nn.Module):
    """Two linear layers; its own samples and loss."""

    def __init__(self):
        super().__init__()
        self.first, self.second = nn.Linear(4, 8), nn.Linear(8, 4)

    def forward(self, x):
        return self.second(self.first(x))

    def pipeline_layers(self):
        return [("first", self.first), ("second", self.second)]

    def sample_input(self, b):
        return torch.randn(b, 4, generator=torch.Generator().manual_seed(0))

    def sample_target(self, b):
        return torch.randn(b, 4, generator=torch.Generator().manual_seed(1))

    def loss_fn(self, out, target):
        return ((out - target) ** 2).mean()


def tiny():
    if os.environ.get("BROKEN") == "none":
        return None
    if os.environ.get("BROKEN") == "raise":
        raise OSError("no weights at /nowhere/w.pt")
    return Tiny()


def gives_none():
    return None


def gives_tensor():
    return torch.zeros(3)


def gives_text():
    return "a model"


def raises(width: int = 4):
    raise RuntimeError(f"cannot load weights for width {width}\\nsecond line")


def huge():
    return nn.Linear(200_000, 200_000)  # 160 GB of weights in float32: only the meta device can hold it


def needs_width(width):
    return None  # never called by check_factory: the build supplies what has no default


def reads_values():
    layer = nn.Linear(2, 2)
    if float(torch.ones(1).sum().item()) != 1.0:  # reading a value: impossible on the meta device
        raise AssertionError
    return nn.Sequential(layer)
'''
BROKEN_IMPORT = "raise KeyError('MODEL_HOME is not set')\n"


def _line_of(text: str) -> int:
    """The line of MODELS (as written to its file) that holds `text`."""
    return next(i for i, line in enumerate(textwrap.dedent(MODELS).splitlines(), 1) if text in line)


def _models(folder: Path, name: str = "user_models_h32") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.py").write_text(textwrap.dedent(MODELS))
    return folder


@pytest.fixture
def models_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The module above on this process's path (dropped from sys.modules afterwards)."""
    folder = _models(tmp_path / "lib")
    monkeypatch.syspath_prepend(str(folder))
    yield folder
    sys.modules.pop("user_models_h32", None)


def _cli(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1", **(env or {})}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "BROKEN"):
        if env is None or key not in env:
            full.pop(key, None)
    return subprocess.run([sys.executable, "-m", "pipeplan", *args], cwd=cwd, env=full, capture_output=True, text=True,
                          timeout=300)  # fmt: skip


def _refused_once(done: subprocess.CompletedProcess[str], *parts: str) -> str:
    """The run exited 2 with exactly one stderr line, holding each of `parts`, and no worker started (no line of the
    launcher about a rank, no rank named)."""
    lines = done.stderr.splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    for part in parts:
        assert part in lines[0], lines[0]
    assert "rank" not in lines[0] and "Traceback" not in done.stderr
    return lines[0]


# ---- the module-import hint


def test_a_missing_module_names_the_folder_below_that_holds_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run from a folder above the module's: the line names the module, the working folder searched, the file found
    and both ways out."""
    folder = _models(tmp_path / "project" / "models", "h32_below")
    monkeypatch.chdir(tmp_path)
    line = missing_module("h32_below:build", "h32_below")
    assert line == (
        f"MODULE_SPEC 'h32_below:build': cannot import module 'h32_below': not found on the import path nor in the "
        f"working folder {tmp_path}; found {folder / 'h32_below.py'}: run from {folder}, or set PYTHONPATH={folder}"
    )


def test_a_missing_module_is_found_above_and_as_a_package(tmp_path: Path) -> None:
    """The folders above the working one are looked at first, and a package folder counts as the module."""
    (tmp_path / "pkg_h32").mkdir()
    (tmp_path / "pkg_h32" / "__init__.py").write_text("")
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    assert find_module_folder("pkg_h32", deep) == tmp_path
    assert find_module_folder("pkg_h32", tmp_path) == tmp_path
    assert find_module_folder("nothing_h32", deep) is None


def test_the_search_stops_at_its_depth_and_skips_hidden_folders(tmp_path: Path) -> None:
    """A module deeper than SEARCH_DEPTH below, or inside a hidden folder or a virtual environment, is not found."""
    too_deep = tmp_path / "1" / "2" / "3" / "4"
    _models(too_deep, "deep_h32")
    _models(tmp_path / ".hidden", "hidden_h32")
    _models(tmp_path / "site-packages", "site_h32")
    assert find_module_folder("deep_h32", tmp_path) is None
    assert find_module_folder("deep_h32", tmp_path / "1") == too_deep
    assert find_module_folder("hidden_h32", tmp_path) is None
    assert find_module_folder("site_h32", tmp_path) is None


def test_a_module_found_nowhere_gives_the_general_way_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing near: the line says to run from the module's folder or to set PYTHONPATH."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ProfileError) as caught:
        resolve_module_spec("nowhere_h32:build")
    assert str(caught.value) == (
        f"MODULE_SPEC 'nowhere_h32:build': cannot import module 'nowhere_h32': not found on the import path nor in the "
        f"working folder {tmp_path}; run from the folder that holds nowhere_h32.py (or the package nowhere_h32/), or "
        "set PYTHONPATH=<that folder>"
    )


def test_a_module_that_raises_while_imported_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The user's module raising at import: its exception's type, first line and place, not a traceback."""
    (tmp_path / "raising_h32.py").write_text(BROKEN_IMPORT)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ProfileError) as caught:
        resolve_module_spec("raising_h32:build")
    assert str(caught.value) == (
        "MODULE_SPEC 'raising_h32:build': importing module 'raising_h32' raised KeyError: 'MODEL_HOME is not set' "
        "(raising_h32.py:1)"
    )


@pytest.mark.slow
def test_profile_run_from_another_folder_says_where_the_module_is(tmp_path: Path) -> None:
    """`pipeplan profile my_models:tiny` one folder above my_models.py: one line, exit 2, naming the folder and
    PYTHONPATH; run as it says (PYTHONPATH=that folder), the same command profiles the model."""
    folder = _models(tmp_path / "project", "my_models_h32")
    args = ["profile", "my_models_h32:tiny", "-b", "2", "--runs", "1", "--warmup", "0", "-o", str(tmp_path / "p.json")]
    line = _refused_once(_cli(args, tmp_path), "cannot import module 'my_models_h32'", f"PYTHONPATH={folder}",
                         f"run from {folder}")  # fmt: skip
    assert line.startswith("error: ProfileError: MODULE_SPEC 'my_models_h32:tiny'")
    assert not (tmp_path / "p.json").exists()
    done = _cli(args, tmp_path, {"PYTHONPATH": os.pathsep.join((SRC, str(folder)))})
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "p.json").exists()


# ---- a factory that raises or returns no model


@pytest.mark.parametrize(("factory", "shown"), [("gives_none", "None"), ("gives_tensor", "a Tensor"), ("gives_text", "a str")])
@pytest.mark.usefixtures("models_on_path")
def test_a_factory_that_returns_no_model_is_one_line(factory: str, shown: str) -> None:
    """None, a tensor or a string from the factory: one line naming the spec and what came back, and the way out."""
    with pytest.raises(ProfileError) as caught:
        resolve_module_spec(f"user_models_h32:{factory}")
    assert str(caught.value) == (
        f"MODULE_SPEC 'user_models_h32:{factory}': the factory returned {shown}, not a model: it must return the model "
        "(an nn.Module, e.g. an nn.Sequential) or a ModelSpec"
    )


@pytest.mark.usefixtures("models_on_path")
def test_a_factory_that_raises_is_one_line_with_its_type_message_and_place() -> None:
    """The factory's exception: its type, its first line and the line of the user's file that raised."""
    with pytest.raises(ProfileError) as caught:
        resolve_module_spec("user_models_h32:raises", width="7")
    assert str(caught.value) == (
        "MODULE_SPEC 'user_models_h32:raises': the factory raised RuntimeError: cannot load weights for width 7 "
        f"(user_models_h32.py:{_line_of('raise RuntimeError')}); fix the factory, or check the options given to it"
    )
    assert "\n" not in str(caught.value)


def test_call_factory_passes_a_model_and_a_pipeplan_error_through() -> None:
    """A module comes back as it is; a ProfileError the factory raises is not rewrapped."""
    layer = nn.Linear(2, 2)
    assert call_factory("x:y", lambda: layer, {}) is layer

    def refuses() -> nn.Module:
        raise ProfileError("width must be even")

    with pytest.raises(ProfileError, match=r"^width must be even$"):
        call_factory("x:y", refuses, {})


@pytest.mark.usefixtures("models_on_path")
def test_check_factory_builds_on_the_meta_device_and_retries_for_real() -> None:
    """A 160 GB model is checked without memory (meta device); a factory that reads a value (fails on meta) passes
    on its real call; torch's random state is left as it was; a built-in is not called, nor a factory missing a
    parameter the build supplies."""
    state = torch.random.get_rng_state()
    check_factory("user_models_h32:huge", {})
    check_factory("user_models_h32:reads_values", {})
    assert torch.equal(torch.random.get_rng_state(), state)
    check_factory("mlp", {"hidden": "bogus"})  # pipeplan's own: never called here (its options are checked elsewhere)
    check_factory("user_models_h32:needs_width", {})
    with pytest.raises(ProfileError, match="the factory returned None"):
        check_factory("user_models_h32:needs_width", {"width": "3"})
    with pytest.raises(ProfileError, match="the factory returned None"):
        check_factory("user_models_h32:gives_none", {})
    with pytest.raises(ProfileError, match=r"the factory raised RuntimeError: cannot load weights for width 3 "):
        check_factory("user_models_h32:raises", {"width": "3"})


@pytest.mark.usefixtures("models_on_path")
def test_check_factory_refuses_what_fails_for_real_after_meta(monkeypatch: pytest.MonkeyPatch) -> None:
    """A factory that raises on the meta device and for real is refused with the real call's error."""
    calls: list[str] = []

    def factory() -> nn.Module:
        calls.append(torch.empty(0).device.type)
        raise ValueError(f"failed on {calls[-1]}")

    import importlib

    monkeypatch.setattr(importlib.import_module("user_models_h32"), "twice", factory, raising=False)
    with pytest.raises(ProfileError, match=r"the factory raised ValueError: failed on cpu"):
        check_factory("user_models_h32:twice", {})
    assert calls == ["meta", "cpu"]


@pytest.mark.usefixtures("models_on_path")
def test_profile_model_refuses_a_factory_that_returns_no_model() -> None:
    """The API: profile_model raises the one-line ProfileError before measuring anything."""
    from pipeplan.api import profile_model

    with pytest.raises(ProfileError, match=r"^MODULE_SPEC 'user_models_h32:gives_tensor': the factory returned a Tensor"):
        profile_model("user_models_h32:gives_tensor", 2, runs=1, warmup=0)
    with pytest.raises(ProfileError, match=r"the factory raised RuntimeError: cannot load weights for width 4 "):
        profile_model("user_models_h32:raises", 2, runs=1, warmup=0)


@pytest.mark.slow
@pytest.mark.parametrize("broken", ["none", "raise"])
def test_profile_train_and_probe_local_refuse_a_bad_factory_before_any_rank(tmp_path: Path, broken: str) -> None:
    """profile, train --local 2 and probe --local 2 of a factory that returns None or raises: one line each, exit 2,
    from the launcher (no rank started), nothing written."""
    folder = _models(tmp_path, "my_models_h32")
    profile = ["profile", "my_models_h32:tiny", "-b", "2", "--runs", "1", "--warmup", "0", "-o", "p.json"]
    assert _cli(profile, folder).returncode == 0
    said = "the factory returned None" if broken == "none" else "the factory raised OSError: no weights at /nowhere/w.pt"
    env = {"BROKEN": broken}
    _refused_once(_cli([*profile[:-1], "q.json"], folder, env), said)
    train = ["train", "--schedule", "gpipe", "--module", "my_models_h32:tiny", "--local", "2", "--steps", "1", "-b", "4"]
    _refused_once(_cli(train, folder, env), said, "MODULE_SPEC 'my_models_h32:tiny'")
    probe = ["probe", "--local", "2", "--profile", "p.json", "--module", "my_models_h32:tiny", "-o", "c.json"]
    _refused_once(_cli(probe, folder, env), said)
    assert sorted(p.name for p in folder.iterdir() if not p.name.startswith("__")) == ["my_models_h32.py", "p.json"]


@pytest.mark.slow
def test_train_local_refuses_a_bad_factory_before_any_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """The API: train_local of a profile whose factory now returns None raises the one-line ProfileError from the
    launcher; no worker starts (nothing on stderr)."""
    from pipeplan.api import profile_model, train_local
    from pipeplan.core.hardware.cluster import Cluster, Device
    from pipeplan.core.plan import Plan, Stage

    folder = _models(tmp_path, "api_models_h32")
    monkeypatch.syspath_prepend(str(folder))
    try:
        measured = profile_model("api_models_h32:tiny", 4, runs=1, warmup=0)
        chosen = Plan((Stage(0, 0, (0,)), Stage(1, 1, (1,))), 1, 2, 2, "1f1b")
        link = ((0.0, 1e9), (1e9, 0.0))
        cluster = Cluster("two", (Device(0, "cpu", 1e10), Device(1, "cpu", 1e10)), link, ((0.0, 1e-2), (1e-2, 0.0)))
        monkeypatch.setenv("BROKEN", "none")
        capfd.readouterr()
        with pytest.raises(ProfileError, match=r"^MODULE_SPEC 'api_models_h32:tiny': the factory returned None"):
            train_local(chosen, measured, cluster, steps=1, module="api_models_h32:tiny")
        assert capfd.readouterr().err == ""
    finally:
        sys.modules.pop("api_models_h32", None)
