"""Tests of pipeplan.api: the documented example runs, every public function refuses a bad argument by name, and
the in-process pipeline gives the unpipelined model's losses and gradients."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import pipeplan
from pipeplan import api
from pipeplan.core.errors import ClusterError, PipeplanError, PlanError, ProfileError, TrainConfigError
from pipeplan.core.plan import Plan, Stage

ROOT = Path(__file__).resolve().parents[1]
PROFILE, CLUSTER = "dapple/bert-48", "v100-8x2-25g"


def test_the_package_exports_exactly_the_api() -> None:
    """pipeplan's lazy names are api.__all__, and each resolves to the API's own object."""
    assert sorted(pipeplan._API) == sorted(api.__all__)
    for name in api.__all__:
        assert getattr(pipeplan, name) is getattr(api, name)


def test_import_pipeplan_and_plan_without_torch() -> None:
    """`import pipeplan` and planning import neither torch nor the runtime."""
    code = (
        "import sys, pipeplan; r = pipeplan.plan('pipedream/alexnet', 'v100-8x1', 64); "
        "print(r.plan.schedule, 'torch' in sys.modules, any(m.startswith('pipeplan.runtime') for m in sys.modules))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert out.split()[1:] == ["False", "False"]


def test_plan_simulate_and_compare_agree() -> None:
    """The plan's own simulated time is what simulate gives for it, and compare's pipeplan row is the same plan."""
    result = api.plan(PROFILE, CLUSTER, 256)
    assert api.simulate(result.plan, PROFILE, CLUSTER).iteration_time == result.iteration_time
    comparison = api.compare(PROFILE, CLUSTER, 256, planners=["pipeplan", "balanced"])
    assert [row.planner for row in comparison.rows] == ["pipeplan", "balanced"]
    assert comparison.rows[0].plan == result.plan
    assert comparison.best is comparison.rows[0]


def test_compare_outcome_names_the_profile_and_cluster_as_given() -> None:
    """PlannerComparison.outcome: the same rows, labelled with the names given (compare --json's shape, no bounds)."""
    comparison = api.compare(PROFILE, CLUSTER, 256, planners=["pipeplan", "balanced"])
    obj = comparison.outcome("my-profile.json", "my-cluster").to_json()
    assert [entry["planner"] for entry in obj["results"]] == ["pipeplan", "balanced"]
    assert all((entry["profile"], entry["cluster"]) == ("my-profile.json", "my-cluster") for entry in obj["results"])
    assert comparison.outcome("p", "c").best is comparison.best
    assert all("lower_bound" not in entry for entry in obj["results"])


def test_adapt_plan_runs_every_policy_for_each_iteration() -> None:
    """adapt_plan: a plan object under a trace object; every policy runs `iterations` iterations, and a plan that is
    not a Plan is refused by name before any work."""
    from pipeplan.api.network_traces import markov_trace
    from pipeplan.api.simulation import adapt_plan

    plan = api.plan(PROFILE, CLUSTER, 256, schedule="1f1b").plan
    trace = markov_trace(3, 50.0, 50.0, "0.2,0.5", 2_000.0)
    run = adapt_plan(plan, PROFILE, CLUSTER, trace, 3)
    assert {"1f1b", "adaptive", "best_static", "oracle"} <= set(run.comparison.policies)
    assert all(len(policy.k) == 3 for policy in run.comparison.policies.values())
    assert run.trace is trace and run.pipeline.num_stages == plan.num_ranks
    with pytest.raises(PlanError, match="plan"):
        adapt_plan("plan.json", PROFILE, CLUSTER, trace, 3)  # type: ignore[arg-type]


def test_simulate_refuses_a_plan_that_does_not_fit() -> None:
    """simulate raises PlanDoesNotFit (a PlanError) naming the device, unless check_memory is off."""
    one_stage = Plan((Stage(0, api.load_profile(PROFILE).num_layers - 1, (0,)),), 1, 1, 256, "1f1b")
    with pytest.raises(api.PlanDoesNotFit, match="device 0"):
        api.simulate(one_stage, PROFILE, CLUSTER)
    assert api.simulate(one_stage, PROFILE, CLUSTER, check_memory=False).iteration_time > 0


def _tiny_plan() -> Plan:
    """Two stages of two layers on devices 0 and 1, 4 microbatches of 2 samples, 1F1B."""
    return Plan((Stage(0, 1, (0,)), Stage(2, 3, (1,))), 1, 4, 2, "1f1b")


def _chain(layers: int) -> object:
    """An nn.Sequential of `layers` small linear layers (torch imported here)."""
    from torch import nn

    return nn.Sequential(*(nn.Linear(2, 2) for _ in range(layers)))


def nn_loss() -> Callable[..., object]:
    """torch's cross-entropy (torch imported here)."""
    from torch.nn import functional

    return functional.cross_entropy


BAD: list[tuple[str, Callable[[], object], type[PipeplanError], str]] = [
    ("load_profile", lambda: api.load_profile(42), ProfileError, "profile must be a ModelProfile, a profile file path or "
     "a built-in name, got int 42"),
    ("load_cluster", lambda: api.load_cluster("no-such-cluster"), ClusterError, "unknown cluster 'no-such-cluster'"),
    ("plan_request", lambda: api.plan_request(PROFILE, CLUSTER, 0), PlanError, "global_batch must be an integer >= 1, got 0"),
    ("run_planner", lambda: api.run_planner("nope", api.plan_request(PROFILE, CLUSTER, 64)), PlanError,
     "planner must be one of balanced, dapple, exact, megatron, pipedream, pipeplan, got 'nope'"),
    ("plan", lambda: api.plan(PROFILE, CLUSTER, 256, optimizer_factor=-1.0), PlanError, "optimizer_factor must be a finite "
     "number >= 0 (state bytes per parameter byte), got -1.0"),
    ("compare", lambda: api.compare(PROFILE, CLUSTER, 256, planners=["nope"]), PlanError, "planners ['nope']: unknown "
     "planner 'nope'"),
    ("simulate", lambda: api.simulate(_tiny_plan(), PROFILE, CLUSTER, batch_scaling="fast"), ProfileError,
     "batch_scaling must be one of auto, measured, floor, linear, got 'fast'"),
    ("save_plan", lambda: api.save_plan("plan.json", "x.json", PROFILE, CLUSTER), PlanError,
     "plan must be a Plan (api.plan(...).plan, or presets.resolve.load_plan), got str 'plan.json'"),
    ("save_profile", lambda: api.save_profile(PROFILE, "x.json"), ProfileError, "profile must be a ModelProfile "
     "(profile_model's), got str 'dapple/bert-48'"),
    ("profile_model", lambda: api.profile_model("mlp", 0), ProfileError, "batch_size must be an integer >= 1, got 0"),
    ("stage_modules", lambda: api.stage_modules(42, _tiny_plan()), PlanError, "model must be an nn.Sequential, an "
     "nn.ModuleList or a list of nn.Module layers (the chain the profile measured), got int 42"),
    ("pipeline", lambda: api.pipeline([], _tiny_plan(), 3), PlanError, "loss_fn must be a function (output, target) -> "
     "loss, got int 3"),
    ("load_plan", lambda: api.load_plan("no-such-plan.json"), PlanError, "no-such-plan.json"),
    ("distribute", lambda: api.distribute(_chain(3), _tiny_plan(), nn_loss()), PlanError, "model Sequential has 3 layers "
     "(0-linear, 1-linear, 2-linear) but the plan's stages cover 4"),
    ("probe_local", lambda: api.probe_local(0), TrainConfigError, "nprocs must be an integer >= 1, got 0"),
    ("train_local", lambda: api.train_local(_tiny_plan(), PROFILE, CLUSTER, steps=0), TrainConfigError,
     "steps must be an integer >= 1, got 0"),
]  # fmt: skip


def test_every_public_function_is_driven_with_a_bad_argument() -> None:
    """BAD covers each function of api.__all__ (the classes aside)."""
    functions = {name for name in api.__all__ if name[0].islower()}
    assert {name for name, *_ in BAD} == functions


TORCH_FUNCTIONS = ("profile_model", "stage_modules", "pipeline", "probe_local", "train_local", "distribute")
"""The functions whose checks run with torch imported: their cases carry the torch marker."""


@pytest.mark.parametrize(
    ("name", "call", "error", "message"),
    [pytest.param(*case, id=case[0], marks=[pytest.mark.torch] * (case[0] in TORCH_FUNCTIONS)) for case in BAD],
)
def test_a_bad_argument_is_a_typed_one_line_error(
    name: str, call: Callable[[], object], error: type[PipeplanError], message: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """The error is the CLI's typed error, one line naming the argument and the value; nothing is written."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(error) as caught:
        call()
    text = str(caught.value)
    assert message in text and "\n" not in text
    assert list(tmp_path.iterdir()) == []


@pytest.mark.torch
def test_the_documented_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/api.md's python block runs as it is and writes the files it names."""
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    text = (ROOT / "docs" / "api.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) == 2  # the second is the torchrun script tests/test_api_distributed.py runs
    monkeypatch.chdir(tmp_path)
    exec(compile(blocks[0], "docs/api.md", "exec"), {"__name__": "__main__"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json", "profile.json", "two-cpus.json"]
    from pipeplan.presets.resolve import load_plan

    plan, names = load_plan(str(tmp_path / "plan.json"))
    assert api.simulate(plan, names["profile"], names["cluster"]).iteration_time > 0


@pytest.mark.torch
def test_train_local_refuses_a_dtype_or_precision_its_profile_was_not_measured_in(
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """A profile measured under bf16 autocast: asked for float32 full, or float64, train_local refuses in one line
    naming both numbers and the way out before any process starts; not asked, it trains in the profile's numbers."""
    pytest.importorskip("torch")
    from dataclasses import replace

    from pipeplan.core.profile import ProfileSource
    from pipeplan.presets.resolve import load_profile
    from pipeplan.runtime.training import local_jobs

    started: list[dict[str, object]] = []

    def record(kind: str, nprocs: int, params: dict[str, object], *args: object, **kwargs: object) -> object:
        started.append(params)
        raise RuntimeError("started")

    monkeypatch.setattr(local_jobs, "run_local_job", record)
    profile = replace(load_profile(PROFILE), source=ProfileSource("mlp", dtype="float32", precision="bf16"))
    plan = api.plan(profile, "v100-8x1", 64, schedule="1f1b").plan
    with pytest.raises(ProfileError) as caught:
        api.train_local(plan, profile, "v100-8x1", precision="full")
    text = str(caught.value)
    assert "measured in bf16 autocast over float32, but this run trains in float32" in text and "\n" not in text
    assert "again with --dtype float32" in text
    with pytest.raises(TrainConfigError, match="precision bf16 computes over float32 master weights, got dtype float64"):
        api.train_local(plan, profile, "v100-8x1", dtype="float64")
    assert started == []
    with pytest.raises(RuntimeError, match="started"):
        api.train_local(plan, profile, "v100-8x1")
    config = started[0]["config"]
    assert isinstance(config, dict) and (config["dtype"], config["precision"]) == ("float32", "bf16")
