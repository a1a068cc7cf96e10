"""Tests of api.arguments: every public API function refuses every bad argument by name before any work, and the
rules refuse exactly the values outside them."""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeplan import api
from pipeplan.api.arguments import Choice, Integer, Number, Options, Output, Text, check
from pipeplan.core.errors import OutputError, PipeplanError, PlanError, ProfileError
from pipeplan.core.profile import ProfileSource

PROFILE, CLUSTER = "pipedream/alexnet", "v100-8x1"

BAD_VALUES: list[tuple[str, object]] = [
    ("nan", math.nan), ("inf", math.inf), ("-inf", -math.inf), ("minus-one", -1), ("object", object()),
    ("true", True), ("empty", ""), ("blank", "   "),
]  # fmt: skip
"""Values no argument of the API takes (True aside for a True/False argument)."""

WORK = [
    ("pipeplan.planner.planners", "run_planner"),
    ("pipeplan.planner.compare", "compare"),
    ("pipeplan.sim.plan_sim", "simulate_plan"),
    ("pipeplan.io.plan_json", "write_plan"),
    ("pipeplan.io.profile_json", "write_profile_json"),
    ("pipeplan.presets.resolve", "load_profile"),
    ("pipeplan.presets.resolve", "load_cluster"),
    ("pipeplan.profiler.session", "profile_spec"),
    ("pipeplan.runtime.execution.in_process", "split_layers"),
    ("pipeplan.runtime.execution.in_process", "InProcessPipeline"),
    ("pipeplan.runtime.execution.distributed_pipeline", "start_pipeline"),
    ("pipeplan.presets.resolve", "load_plan"),
    ("pipeplan.runtime.training.local_jobs", "job_files"),
    ("pipeplan.runtime.training.local_jobs", "run_local_job"),
]
"""What each API function does once its arguments are checked: reading files, planning, simulating, writing,
measuring, starting processes. The tests replace each with one that fails the test if called."""


BIND_WORK = (
    "pipeplan.runtime.training.local_jobs",
    "pipeplan.runtime.measurement.prediction",
    "pipeplan.runtime.execution.job",
    "pipeplan.planner.simulated",
    "pipeplan.planner.search.trace_aware",
    "pipeplan.planner.search.dag_search",
    "pipeplan.planner.search.scoring",
)
"""Modules that bind a WORK function by `from ... import` at their top (grep: '^from pipeplan.* import')."""


class WorkStarted(Exception):
    """Raised by a replaced work function: the call got past its argument checks."""


@pytest.fixture(scope="module")
def values() -> dict[str, Any]:
    """Good arguments: a profile and cluster as values (so the loaders need not run), a plan of them, a request."""
    pytest.importorskip("torch")
    from torch import nn

    profile = dataclasses.replace(api.load_profile(PROFILE), source=ProfileSource("mlp", (), "digits", "float32"))
    cluster = api.load_cluster(CLUSTER)
    plan = api.plan(profile, cluster, 64).plan
    layers = [nn.Linear(2, 2) for _ in range(profile.num_layers)]
    return {"profile": profile, "cluster": cluster, "plan": plan, "request": api.plan_request(profile, cluster, 64),
            "model": layers, "chain": nn.Sequential(*layers)}  # fmt: skip


def _good_calls(values: dict[str, Any], folder: Path) -> dict[str, tuple[Callable[..., object], dict[str, Any]]]:
    """Each public function with arguments it accepts (every one named, so each can be replaced in turn)."""
    p, c = values["profile"], values["cluster"]
    out = str(folder / "out.json")
    return {
        "load_profile": (api.load_profile, {"profile": PROFILE}),
        "load_cluster": (api.load_cluster, {"cluster": CLUSTER}),
        "plan_request": (api.plan_request, {"profile": p, "cluster": c, "global_batch": 64, "microbatch_size": 8,
                                            "schedule": "auto", "batch_scaling": "auto", "optimizer": "adam",
                                            "optimizer_factor": 2.0, "replication": "any", "time_budget_s": 50.0}),
        "run_planner": (api.run_planner, {"planner": "balanced", "request": values["request"], "progress": None}),
        "plan": (api.plan, {"profile": p, "cluster": c, "global_batch": 64, "planner": "pipeplan", "progress": None,
                            "schedule": "1f1b", "optimizer": "sgd", "microbatch_size": 8, "optimizer_factor": 1.0,
                            "batch_scaling": "auto", "replication": "any", "time_budget_s": None}),
        "compare": (api.compare, {"profile": p, "cluster": c, "global_batch": 64, "planners": ["balanced"],
                                  "progress": None, "schedule": "1f1b", "optimizer": "adam", "microbatch_size": 8,
                                  "optimizer_factor": 1.0, "batch_scaling": "auto", "replication": "any",
                                  "time_budget_s": 0}),
        "simulate": (api.simulate, {"plan": values["plan"], "profile": p, "cluster": c, "batch_scaling": "auto",
                                    "optimizer": "adam", "bandwidth_trace": None, "record": False,
                                    "check_memory": True}),
        "save_plan": (api.save_plan, {"plan": values["plan"], "path": out, "profile": PROFILE, "cluster": CLUSTER}),
        "save_profile": (api.save_profile, {"profile": p, "path": out}),
        "profile_model": (api.profile_model, {"module_spec": "mlp", "batch_size": 8, "options": {"hidden": 16},
                                              "dataset": "auto", "batch_sizes": [4, 8], "project_to": "A100",
                                              "dtype": "fp32", "efficiency": 0.5, "runs": 2, "warmup": 1, "threads": 1,
                                              "progress": False, "device": "cpu", "precision": "full"}),
        "stage_modules": (api.stage_modules, {"model": values["model"], "plan": values["plan"]}),
        "pipeline": (api.pipeline, {"model": values["model"], "plan": values["plan"], "loss_fn": lambda o, t: o,
                                    "seed": 5}),
        "load_plan": (api.load_plan, {"path": out}),
        "distribute": (api.distribute, {"model": values["chain"], "plan": values["plan"], "loss_fn": lambda o, t: o,
                                        "profile": None, "backend": "gloo", "timeout_s": 30.0, "seed": 3}),
        "probe_local": (api.probe_local, {"nprocs": 1, "profile": None, "steps": 4, "rounds": 2, "optimizer": "sgd",
                                          "name": "here", "out": out, "timeout_s": 5.0, "on_progress": None}),
        "train_local": (api.train_local, {"plan": values["plan"], "profile": p, "cluster": c, "steps": 2, "lr": 0.1,
                                          "optimizer": "adam", "seed": 3, "batch_scaling": "auto", "warmup_steps": 1,
                                          "timeout_s": 30.0, "on_progress": None, "dtype": "float32",
                                          "precision": "full"}),
    }  # fmt: skip


@pytest.fixture
def no_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every work function of WORK raises WorkStarted."""
    import importlib

    def refuse(*args: object, **kwargs: object) -> object:
        raise WorkStarted

    # Every module is imported before any is patched: one imported while another's function is replaced would
    # bind the replacement by its own `from ... import` and keep it after the test (later tests would fail).
    # The modules that import a work function by name at their top are imported first for the same reason.
    for module in BIND_WORK:
        importlib.import_module(module)
    modules = [(importlib.import_module(module), name) for module, name in WORK]
    for module, name in modules:
        monkeypatch.setattr(module, name, refuse)
    from pipeplan.planner.request import PlanRequest

    monkeypatch.setattr(PlanRequest, "__post_init__", refuse)  # a request is built: the class stays for isinstance


def _bad_cases() -> Iterator[tuple[str, str, str, object]]:
    """(function, argument, value's label, value) for every public function and argument, with each bad value."""
    functions = {name: getattr(api, name) for name in api.__all__ if name[0].islower()}
    options = [n for n, p in inspect.signature(api.plan_request).parameters.items() if p.kind is p.KEYWORD_ONLY]
    for name, function in sorted(functions.items()):
        params = inspect.signature(function).parameters
        arguments = [n for n, p in params.items() if p.kind is not p.VAR_KEYWORD]
        if any(p.kind is p.VAR_KEYWORD for p in params.values()):
            arguments += options  # plan's and compare's **options are plan_request's
        for argument in arguments:
            default = params[argument].default if argument in params else None
            for label, value in BAD_VALUES:
                if isinstance(default, bool) and isinstance(value, bool):
                    continue
                yield name, argument, label, value


CASES = list(_bad_cases())


@pytest.mark.torch
@pytest.mark.usefixtures("no_work")
def test_the_good_calls_cover_the_api_and_reach_the_work(
    values: dict[str, Any], tmp_path: Path
) -> None:  # fmt: skip
    """Each public function with its good arguments passes every check and starts its work (so a bad one is the
    only difference in the sweep below), and the sweep names every function."""
    calls = _good_calls(values, tmp_path)
    assert set(calls) == {name for name in api.__all__ if name[0].islower()} == {case[0] for case in CASES}
    for function, kwargs in calls.values():
        with pytest.raises(WorkStarted):
            function(**kwargs)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.torch
@pytest.mark.parametrize(("function", "argument", "label", "value"), CASES, ids=[f"{c[0]}-{c[1]}-{c[2]}" for c in CASES])
@pytest.mark.usefixtures("no_work")
def test_every_bad_argument_is_refused_by_name_before_any_work(
    function: str, argument: str, label: str, value: object, values: dict[str, Any], tmp_path: Path
) -> None:  # fmt: skip
    """A PipeplanError in one line naming the argument, raised before any work function is called; nothing written."""
    call, kwargs = _good_calls(values, tmp_path)[function]
    with pytest.raises(PipeplanError) as caught:
        call(**{**kwargs, argument: value})
    text = str(caught.value)
    assert argument in text and "\n" not in text
    assert list(tmp_path.iterdir()) == []


@pytest.mark.torch
@pytest.mark.usefixtures("no_work")
def test_an_output_path_is_refused_before_the_work(values: dict[str, Any], tmp_path: Path) -> None:
    """save_plan, save_profile and probe_local refuse a path in a missing folder, a folder and a device, naming it."""
    calls = _good_calls(values, tmp_path)
    for function, argument in (("save_plan", "path"), ("save_profile", "path"), ("probe_local", "out")):
        call, kwargs = calls[function]
        for path, why in ((tmp_path / "nodir" / "p.json", "does not exist"), (tmp_path, "not a regular file"),
                          (Path("/dev/null"), "not a regular file")):  # fmt: skip
            with pytest.raises(PipeplanError, match=f"{argument} .{path}.*({why})"):
                call(**{**kwargs, argument: str(path)})
    assert list(tmp_path.iterdir()) == []


@pytest.mark.torch
@pytest.mark.usefixtures("no_work")
def test_a_model_option_is_checked_against_the_factory(tmp_path: Path) -> None:
    """profile_model's options: a dict (not a string), names the factory takes, values of its defaults' types."""
    pytest.importorskip("torch")
    bad = [("hidden=3", "options must be a dict"), ({"hiden": 3}, "has no option 'hiden'"),
           ({"hidden": "abc"}, "option 'hidden' must be a int"), ({1: 2}, "options must be a dict")]  # fmt: skip
    for options, message in bad:
        with pytest.raises(ProfileError, match=message):
            api.profile_model("mlp", 8, options=options)
    with pytest.raises(ProfileError, match=r"^MODULE_SPEC 'nosuch' is neither a built-in"):
        api.profile_model("nosuch", 8)
    with pytest.raises(PipeplanError, match="dataset digits needs a MODULE_SPEC with a in_features option"):
        api.profile_model("transformer", 8, dataset="digits")


@given(st.integers(-(10**6), 10**6), st.integers(-5, 5))
def test_an_integer_rule_takes_exactly_the_ints_from_least(value: int, least: int) -> None:
    """Integer(least) takes an int v exactly when v >= least; bool and float never."""
    rule = Integer(least)
    assert rule.fits(value) == (value >= least)
    assert not rule.fits(float(value)) and not rule.fits(value >= least)


@given(st.floats(allow_nan=True, allow_infinity=True), st.booleans())
def test_a_number_rule_takes_exactly_the_finite_numbers_in_range(value: float, above: bool) -> None:
    """Number(0, above) takes a float exactly when it is finite and >= 0 (> 0 with above)."""
    rule = Number(0.0, above=above, most=10.0)
    assert rule.fits(value) == (math.isfinite(value) and (value > 0 if above else value >= 0) and value <= 10)


def test_a_message_names_the_argument_and_shows_the_value() -> None:
    """The first bad argument is named with the value (its type too when of another kind); None passes optional."""
    with pytest.raises(PlanError, match=r"^steps must be an integer >= 1, got 0$"):
        check(PlanError, {"name": ("x", Text()), "steps": (0, Integer(1)), "k": (-1, Integer(1))})
    with pytest.raises(PlanError, match=r"^mode must be one of a, b, got int 3$|^mode must be one of a, b, got 3$"):
        check(PlanError, {"mode": (3, Choice(("a", "b")))})
    with pytest.raises(PlanError, match=r"options must be a dict .*got str 'hidden=3'"):
        check(PlanError, {"options": ("hidden=3", Options())})
    check(PlanError, {"limit": (None, Integer(1, optional=True)), "out": (None, Output(optional=True))})


def test_an_output_rule_runs_the_output_guard(tmp_path: Path) -> None:
    """A path whose folder is missing is refused as the caller's error, naming the argument (not a temporary file)."""
    with pytest.raises(PlanError, match=r"^path '.*nodir/p.json': folder .* does not exist$"):
        check(PlanError, {"path": (str(tmp_path / "nodir" / "p.json"), Output())})
    with pytest.raises(OutputError):
        check(OutputError, {"path": (str(tmp_path), Output())})


@pytest.mark.torch
@pytest.mark.usefixtures("no_work")
def test_an_unknown_option_of_plan_or_compare_is_named(values: dict[str, Any]) -> None:
    """plan's and compare's **options are plan_request's keywords: another name is a PlanError naming it, not a
    TypeError."""
    for function in (api.plan, api.compare):
        with pytest.raises(PlanError, match=r"^unknown option 'microbatch'; the options are microbatch_size, "):
            function(values["profile"], values["cluster"], 64, microbatch=8)
