"""A profile or plan never chooses code to run: whatever its `source` names (module, options, dataset, dtype), no
command and no API call imports it unless the user names that module; each refuses it in one line first."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeplan.core.errors import TrainConfigError
from pipeplan.core.model_source import BUILTIN_MODELS, DATASET_NAMES, DTYPE_NAMES, USER_DATA, model_to_build
from pipeplan.core.plan import Plan, Stage
from pipeplan.core.profile import LayerProfile, ModelProfile, ProfileSource
from pipeplan.io.plan_json import write_plan
from pipeplan.io.profile_json import write_profile_json

MARKER_CODE = """import os
open(os.path.join({folder!r}, "IMPORTED-" + __name__), "w").close()


def build(**options):
    raise SystemExit("the hostile factory ran")


system = build
"""


def _source(
    module: str = "mlp", options: dict[str, str] | None = None, dataset: str = "auto", dtype: str = "float32"
) -> ProfileSource:
    return ProfileSource(module, tuple(sorted((options or {}).items())), dataset, dtype)


def _profile(source: ProfileSource) -> ModelProfile:
    layers = tuple(LayerProfile(f"l{i}", 1.0, 2.0, 1000.0, 1000.0) for i in range(4))
    return ModelProfile("tiny", 2, layers, source=source)


def test_a_builtin_source_is_built_without_the_user_naming_it() -> None:
    """A built-in name is no code: it is the model to build, with or without the same name given."""
    for name in BUILTIN_MODELS:
        assert model_to_build(_source(name), None, "p.json", "--module") == name
        assert model_to_build(_source(name), name, "p.json", "--module") == name
    assert model_to_build(None, None, "p.json", "--module") is None
    assert model_to_build(None, "my:build", "p.json", "--module") == "my:build"


def test_recorded_code_is_refused_naming_the_file_the_module_and_the_flag() -> None:
    """A pkg.module:factory the user did not name: one message with the profile, the module and `--module X`."""
    with pytest.raises(TrainConfigError) as caught:
        model_to_build(_source("os:system", {"command": "touch x"}), None, "evil.json", "--module")
    assert str(caught.value) == (
        "profile evil.json records its model as 'os:system', code that a profile never chooses to run: if you trust "
        "that module, name it yourself with --module os:system"
    )
    with pytest.raises(TrainConfigError, match=r"name it yourself with module='os:system'$"):
        model_to_build(_source("os:system"), None, "'evil.json'", "module=")


def test_a_user_module_other_than_the_recorded_one_is_refused_naming_both() -> None:
    """--module a:b on a profile of c:d (or of a built-in): refused, naming both; the same module is accepted."""
    with pytest.raises(TrainConfigError, match=r"^--module a:b is not the model profile p.json was measured on \('c:d'\)"):
        model_to_build(_source("c:d"), "a:b", "p.json", "--module")
    with pytest.raises(TrainConfigError, match=r"--module transformer is not the model .* \('mlp'\)"):
        model_to_build(_source("mlp"), "transformer", "p.json", "--module")
    assert model_to_build(_source("c:d"), "c:d", "p.json", "--module") == "c:d"


def test_a_dataset_or_dtype_that_is_no_known_name_is_refused() -> None:
    with pytest.raises(TrainConfigError, match=r"records its model's dataset as 'x:y', not one of auto, digits"):
        model_to_build(_source(dataset="x:y"), None, "p.json", "--module")
    with pytest.raises(TrainConfigError, match=r"records its model's dtype as 'float16', not one of float32, float64"):
        model_to_build(_source(dtype="float16"), None, "p.json", "--module")


@pytest.mark.torch
def test_the_torch_free_name_lists_are_the_models_own() -> None:
    pytest.importorskip("torch")
    from pipeplan.models.build import DTYPES
    from pipeplan.models.zoo.builtin import BUILTIN_SPECS
    from pipeplan.models.zoo.datasets import DATASETS

    assert tuple(BUILTIN_SPECS) == BUILTIN_MODELS
    assert ("auto", *DATASETS, USER_DATA) == DATASET_NAMES
    assert tuple(DTYPES) == DTYPE_NAMES


@pytest.fixture
def marker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Path]:
    """A module on sys.path, named uniquely, that marks a file in a folder of its own when it is imported."""
    name = f"hostile_{uuid.uuid4().hex[:12]}"
    folder = tmp_path / "importable"
    folder.mkdir()
    (folder / f"{name}.py").write_text(MARKER_CODE.format(folder=str(tmp_path)))
    (folder / name).mkdir()
    (folder / name / "__init__.py").write_text(MARKER_CODE.format(folder=str(tmp_path)))
    monkeypatch.syspath_prepend(str(folder))
    yield name, tmp_path
    assert not any(p.name.startswith("IMPORTED-") for p in tmp_path.iterdir())
    assert not any(key == name or key.startswith(name + ".") for key in sys.modules)


def _code(name: str) -> st.SearchStrategy[str]:
    """Strings that name the hostile module as code: a factory, a sub-module, the bare module, with spaces."""
    return st.sampled_from([f"{name}:build", f"{name}:system", f"{name}.sub:build", name, f" {name}:build ", f"{name}:"])


def _hostile(name: str) -> st.SearchStrategy[ProfileSource]:
    """Sources where the module, the dataset or the dtype names the hostile module (options too, freely)."""
    code = _code(name)
    keys = st.sampled_from(["command", "module", "factory", "hidden", "path"])
    options = st.dictionaries(keys, st.one_of(code, st.text("abc:._", min_size=1, max_size=6)), max_size=3)
    fields = st.fixed_dictionaries(
        {"module": st.one_of(code, st.sampled_from(BUILTIN_MODELS)), "options": options,
         "dataset": st.one_of(st.sampled_from(DATASET_NAMES), code), "dtype": st.one_of(st.sampled_from(DTYPE_NAMES), code)}
    )  # fmt: skip
    hostile = fields.filter(
        lambda f: f["module"] not in BUILTIN_MODELS or f["dataset"] not in DATASET_NAMES or f["dtype"] not in DTYPE_NAMES
    )
    return hostile.map(lambda f: _source(f["module"], f["options"], f["dataset"], f["dtype"]))


@pytest.mark.torch
@pytest.mark.slow
def test_a_hostile_source_is_never_imported_by_any_command_or_api_call(
    marker: tuple[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Over sources whose module, dataset or dtype names a module that marks a file when imported (options naming it
    too), with no --module or another one: probe --local, train --plan --local (a plan naming the profile),
    probe_local, train_local, the plan's model (api.train.train_setup) and the probe's calibration model all refuse it before
    any process starts (exit 2, one line naming the profile), and nothing is ever imported (the fixture's check)."""
    torch = pytest.importorskip("torch")
    from cli_runner import run
    from pipeplan import api
    from pipeplan.api.train.train_inputs import read_profile
    from pipeplan.api.train.train_setup import model_of_profile
    from pipeplan.runtime.measurement.calibrate import build_profiled_model

    name, folder = marker
    work = folder / "work"
    work.mkdir()

    @settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(source=_hostile(name), user=st.sampled_from([None, "usermodule:build"]))
    def check(source: ProfileSource, user: str | None) -> None:
        path = work / "evil.json"
        write_profile_json(_profile(source), path)
        plan = Plan((Stage(0, 1, (0,)), Stage(2, 3, (1,))), 1, 4, 2, "1f1b")
        write_plan(plan, work / "plan.json", str(path), "v100-8x2-25g")
        flags = [] if user is None else ["--module", user]
        calls = [
            lambda: model_to_build(source, user, str(path), "--module"),
            lambda: model_of_profile(read_profile(str(path)), user, {}, None, False),
            lambda: build_profiled_model(_profile(source), torch.device("cpu"), user),
            lambda: api.probe_local(2, str(path), rounds=1, module=user),
            lambda: api.train_local(plan, str(path), "v100-8x2-25g", steps=1, module=user),
        ]
        for call in calls:
            with pytest.raises(TrainConfigError):
                call()
        for args in (["probe", "--local", "2", "--profile", str(path), "-o", str(work / "c.json")],
                     ["train", "--local", "2", "--plan", str(work / "plan.json"), "--steps", "1"]):  # fmt: skip
            code, _, err = run(monkeypatch, capsys, *args, *flags)
            assert code == 2, err
            assert err.count("\n") == 1 and err.startswith("error: TrainConfigError: ") and str(path) in err, err
        assert not (work / "c.json").exists()

    check()


@pytest.mark.torch
def test_a_builtin_source_with_hostile_options_imports_nothing(marker: tuple[str, Path]) -> None:
    """A built-in recorded with options that name the hostile module: the options are data, refused by the factory."""
    torch = pytest.importorskip("torch")
    from pipeplan.core.errors import PipeplanError
    from pipeplan.runtime.measurement.calibrate import build_profiled_model

    name, _ = marker
    for options in ({"hidden": f"{name}:build"}, {"command": f"{name}:build"}, {"blocks": name}):
        with pytest.raises(PipeplanError):
            build_profiled_model(_profile(_source("mlp", options)), torch.device("cpu"))
