"""Tests of cli/simulate_plan_file.py: `simulate --plan`, a plan file with its profile and cluster, as the library prices it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_runner import run, simulate_json
from models import default_model, linear_model
from pipeplan.core.plan import Plan, Stage
from pipeplan.core.profile import LayerProfile, ModelProfile, SharedGroup
from pipeplan.io.bandwidth_trace_json import read_bandwidth_trace
from pipeplan.io.plan_json import write_plan
from pipeplan.io.profile_json import write_profile_json
from pipeplan.presets.resolve import load_cluster, load_profile
from pipeplan.sim.cost.plan_costs import plan_costs
from pipeplan.sim.plan_sim import simulate_plan


def write_vgg_plan(path: Path) -> Plan:
    """A 4-stage 1f1b plan of pipedream/vgg16 on v100-8x1 with even layer cuts."""
    layers = load_profile("pipedream/vgg16").num_layers
    cuts = [0, layers // 4, layers // 2, 3 * layers // 4, layers]
    plan = Plan(tuple(Stage(cuts[i], cuts[i + 1] - 1, (i,)) for i in range(4)), 1, 8, 32, "1f1b")
    write_plan(plan, path, "pipedream/vgg16", "v100-8x1")
    return plan


def test_plan_mode_equals_simulate_plan(tmp_path: Path) -> None:
    """simulate --plan prints simulate_plan's result; --profile/--cluster default to the names in the file."""
    path = tmp_path / "plan.json"
    plan = write_vgg_plan(path)
    profile, cluster = load_profile("pipedream/vgg16"), load_cluster("v100-8x1")
    expected = json.loads(json.dumps(simulate_plan(plan, default_model(profile, cluster)).to_json()))
    assert simulate_json("--plan", str(path), "--profile", "pipedream/vgg16", "--cluster", "v100-8x1") == expected
    assert simulate_json("--plan", str(path)) == expected
    linear = json.loads(json.dumps(simulate_plan(plan, linear_model(profile, cluster)).to_json()))
    assert simulate_json("--plan", str(path), "--batch-scaling", "linear") == linear
    assert linear["iteration_time"] < expected["iteration_time"]  # the floor adds the fixed costs a plain b/P drops


def test_a_plan_that_does_not_fit_is_an_error_unless_memory_is_ignored(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """vgg16 on devices of 0.5 GiB: exit 2 naming the plan, device, need and excess; --ignore-memory simulates it."""
    from pipeplan.io.cluster_json import cluster_to_json

    path = tmp_path / "plan.json"
    write_vgg_plan(path)
    small = cluster_to_json(load_cluster("v100-8x1"))
    for device in small["devices"]:
        device["memory_gb"] = 0.5
    (tmp_path / "small.json").write_text(json.dumps(small))
    code, _, err = run(monkeypatch, capsys, "simulate", "--plan", str(path), "--cluster", str(tmp_path / "small.json"))
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"plan {path} does not fit: stage " in err and "GiB too much" in err and "--ignore-memory" in err
    code, _, err = run(monkeypatch, capsys, "simulate", "--plan", str(path), "--cluster", str(tmp_path / "small.json"),
                         "--ignore-memory", "--json")  # fmt: skip
    assert code == 0, err


def write_dag_plan(path: Path) -> Plan:
    """A 2-stage plan of pipedream/resnet50 on v100-8x1 cut at an antichain (two neighbours of the default order
    swapped at the cut), written to `path`."""
    from pipeplan.core.dag import inputs_of

    profile = load_profile("pipedream/resnet50")
    inputs, n = inputs_of(profile), profile.num_layers
    p = next(q for q in range(n // 5, n - 1) if q not in inputs[q + 1])
    order = list(range(n))
    order[p], order[p + 1] = order[p + 1], order[p]
    plan = Plan((Stage(0, p, (0,)), Stage(p + 1, n - 1, (1,))), 1, 4, 32, "1f1b", layer_order=tuple(order))
    write_plan(plan, path, "pipedream/resnet50", "v100-8x1", profile=profile)
    return plan


def test_a_dag_plan_file_simulates_like_the_library(tmp_path: Path) -> None:
    """simulate --plan on a plan whose stages name their layers prints simulate_plan's result for that plan."""
    path = tmp_path / "dag.json"
    plan = write_dag_plan(path)
    model = default_model(load_profile("pipedream/resnet50"), load_cluster("v100-8x1"))
    assert simulate_json("--plan", str(path)) == json.loads(json.dumps(simulate_plan(plan, model).to_json()))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("overlap", "stages 0 and 1 both hold layer"),
        ("missing", "no stage holds layer"),
        ("open", "but its input layer"),
    ],
)
def test_a_bad_dag_plan_exits_2_naming_the_stage_and_the_layer(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path, change: str, message: str
) -> None:
    """Stages that overlap, miss a layer, or hold a layer whose input is in a later stage exit 2 with one line naming
    the stage and the layer."""
    path = tmp_path / "dag.json"
    write_dag_plan(path)
    obj = json.loads(path.read_text())
    first, second = obj["stages"][0]["layers"], obj["stages"][1]["layers"]
    if change == "overlap":
        second.append(first[-1])
    elif change == "missing":
        second.pop()
    else:
        first.append(second.pop())  # the model's last layer, whose inputs stay in stage 1
    path.write_text(json.dumps(obj))
    code, _, err = run(monkeypatch, capsys, "simulate", "--plan", str(path))
    assert code == 2
    assert len(err.strip().splitlines()) == 1, err
    assert message in err and "dag.json" in err and "stage" in err and "node" in err


def test_a_plan_splitting_a_tied_pair_reports_its_exchange(tmp_path: Path) -> None:
    """`simulate --plan --json` of a 2-stage plan of a profile whose first and last layers share a 400 MB weight:
    `shared_exchanges` names it, its stages and the priced all-reduce; the one-stage plan has none."""
    layers = tuple(LayerProfile(f"l{i}", 5.0, 10.0, 1e6, p) for i, p in enumerate((4e8, 1e8, 4e8)))
    profile = ModelProfile("tied", 8, layers, "V100", shared_params=(SharedGroup("l0.weight", (0, 2), 4e8),))
    write_profile_json(profile, tmp_path / "tied.json")
    split = Plan((Stage(0, 1, (0,)), Stage(2, 2, (1,))), 1, 4, 2, "1f1b")
    write_plan(split, tmp_path / "split.json", str(tmp_path / "tied.json"), "v100-8x1")
    got = simulate_json("--plan", str(tmp_path / "split.json"))
    (entry,) = got["shared_exchanges"]
    expected = simulate_plan(split, default_model(profile, load_cluster("v100-8x1")))
    assert (entry["name"], entry["stages"]) == ("l0.weight", [0, 1])
    assert entry["end_ms"] == expected.exchanges[0].end_ms
    assert entry["exchange_ms"] > 0
    together = Plan((Stage(0, 2, (0,)),), 1, 4, 2, "1f1b")
    write_plan(together, tmp_path / "together.json", str(tmp_path / "tied.json"), "v100-8x1")
    assert "shared_exchanges" not in simulate_json("--plan", str(tmp_path / "together.json"))


def test_a_trace_on_a_replicated_stages_ring_slows_simulate_plan(tmp_path: Path) -> None:
    """`simulate --plan --bandwidth-trace` of bert-48 on two 2-device stages, the trace slowing only stage 0's all-reduce
    ring (4,5),(5,4) to 0.25: the iteration is what the library gives under the trace, and slower than untraced by
    3 x the ring's work (its work takes 4x; stage 0's all-reduce ends the iteration)."""
    plan = Plan((Stage(0, 26, (4, 5)), Stage(27, 52, (8, 9))), 1, 8, 2, "1f1b")
    write_plan(plan, tmp_path / "plan.json", "dapple/bert-48", "v100-8x2-25g")
    steps = [{"t_ms": 0, "link": link, "factor": 0.25} for link in ([4, 5], [5, 4])]
    (tmp_path / "t.json").write_text(json.dumps(steps))
    plain = simulate_json("--plan", str(tmp_path / "plan.json"))
    slowed = simulate_json("--plan", str(tmp_path / "plan.json"), "--bandwidth-trace", str(tmp_path / "t.json"))
    model = default_model(load_profile("dapple/bert-48"), load_cluster("v100-8x2-25g"))
    expected = simulate_plan(plan, model, read_bandwidth_trace(tmp_path / "t.json"))
    assert slowed["iteration_time"] == expected.iteration_time
    work = (
        expected.collectives[0].end_ms - expected.collectives[0].start_ms - plan_costs(plan, model).stages[0].allreduce_latency_ms
    )
    assert slowed["iteration_time"] - plain["iteration_time"] == pytest.approx(work * 3 / 4, rel=1e-9)


def test_a_3d_plan_file_simulates_like_the_library_and_a_bad_tp_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:  # fmt: skip
    """simulate --plan on a plan with tp 2, sequence parallelism and ZeRO-1 prints simulate_plan's result; a tp that
    does not divide a split layer's width exits 2 with one line naming the file, stage, layer and width."""
    from pipeplan.io.cluster_json import cluster_to_json, read_cluster_json
    from test_tensor_parallel import cluster as tp_cluster
    from test_tensor_parallel import profile as tp_profile

    write_profile_json(tp_profile(), tmp_path / "gpt.json")
    (tmp_path / "c.json").write_text(json.dumps(cluster_to_json(tp_cluster())))
    stages = (Stage(0, 1, (0, 1, 4, 5), tp=2, sequence_parallel=True), Stage(2, 4, (2, 3, 6, 7), tp=2, sequence_parallel=True))
    plan = Plan(stages, 1, 4, 8, "1f1b", zero=1)
    write_plan(plan, tmp_path / "plan.json", str(tmp_path / "gpt.json"), str(tmp_path / "c.json"))
    expected = simulate_plan(plan, default_model(tp_profile(), read_cluster_json(tmp_path / "c.json")))
    assert simulate_json("--plan", str(tmp_path / "plan.json")) == json.loads(json.dumps(expected.to_json()))
    write_plan(Plan((Stage(0, 4, (0, 1, 2), tp=3),), 1, 4, 8, "1f1b"), tmp_path / "bad.json", "gpt.json", "c.json")
    code, out, err = run(monkeypatch, capsys, "simulate", "--plan", str(tmp_path / "bad.json"))
    assert (code, out, err.count("\n")) == (2, "", 1), err
    assert "bad.json: stage 0 (layers 0..4) has tp 3, which does not divide layer 0 ('embed') tp width 32000" in err
