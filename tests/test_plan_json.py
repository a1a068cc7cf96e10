"""Tests of plan files: round trip, deterministic bytes, errors naming file, field and value."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from pipeplan.core.errors import PlanError
from pipeplan.core.plan import AdaptiveSetting, Plan, Stage
from pipeplan.core.profile import LayerProfile, ModelProfile
from pipeplan.core.schedule import Action
from pipeplan.io.plan_json import PLAN_FORMAT, plan_dumps, plan_from_json, plan_to_json, read_plan, write_plan


def sample_plan(order: bool = False) -> Plan:
    """Two stages, the first replicated, two pipeline replicas."""
    stages = (Stage(0, 2, (0, 1, 4, 5)), Stage(3, 5, (2, 6)))
    if order:
        ranks = (
            tuple(Action.parse(a) for a in ("0F0", "0F1", "0B0", "0B1")),
            tuple(Action.parse(a) for a in ("1F0", "1B0", "1F1", "1B1")),
        )
        return Plan(stages, 2, 2, 4, "list", order=ranks)
    return Plan(stages, 2, 8, 4, "kfkb", k=2)


def test_round_trip_keeps_every_field(tmp_path: Path) -> None:
    """write_plan then read_plan gives the same Plan and the names."""
    for plan in (sample_plan(), sample_plan(order=True)):
        path = tmp_path / "plan.json"
        write_plan(plan, path, "bert-48", "a100-8x2")
        back, meta = read_plan(path)
        assert back == plan
        assert meta == {"profile": "bert-48", "cluster": "a100-8x2"}


def test_output_is_byte_identical_and_sorted(tmp_path: Path) -> None:
    """Writing the same plan twice gives the same bytes, sorted keys, no timings."""
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    write_plan(sample_plan(True), a, "p", "c")
    write_plan(sample_plan(True), b, "p", "c")
    assert a.read_bytes() == b.read_bytes()
    obj = json.loads(a.read_text())
    assert list(obj) == sorted(obj)
    assert obj["format"] == PLAN_FORMAT
    assert obj["order"][1] == ["1F0", "1B0", "1F1", "1B1"]
    assert not any("time" in key or "seconds" in key for key in obj)
    assert plan_dumps(sample_plan(), "p", "c").endswith("}\n")


@pytest.mark.parametrize("field", ["microbatches", "k", "chunks", "order", "schedule", "profile"])
def test_missing_field_names_file_and_field(field: str) -> None:
    """A plan without any of its fields (k, chunks and order included: the writer always writes them) is a PlanError
    naming the source and the field."""
    obj = plan_to_json(sample_plan(), "p", "c")
    del obj[field]
    with pytest.raises(PlanError, match=rf"x\.json: missing field '{field}'"):
        plan_from_json(obj, "x.json")


def test_bad_values_name_field_and_value() -> None:
    """Wrong format, negative device, bad action, unknown key and invalid plans are PlanErrors."""
    base = plan_to_json(sample_plan(), "p", "c")
    cases = [
        ({"format": "pipeplan.profile/1"}, r"'format' must be 'pipeplan.plan/1', got 'pipeplan.profile/1'"),
        ({"microbatch_size": 0}, r"'microbatch_size' must be an integer >= 1, got 0"),
        ({"stages": [{"first_layer": 0, "last_layer": 5, "devices": [-1]}]}, r"stages\[0\]: devices\[0\] .* got -1"),
        ({"order": [["0X0"]]}, r"order\[0\]\[0\] is not an action .*'0X0'"),
        ({"extra": 1}, r"unknown field 'extra'"),
        ({"pipeline_replicas": 3}, r"f\.json: stage 0 has 4 devices, not a multiple of pipeline_replicas=3"),
    ]
    for change, message in cases:
        with pytest.raises(PlanError, match=message):
            plan_from_json({**base, **change}, "f.json")


def test_unreadable_or_invalid_file(tmp_path: Path) -> None:
    """A missing file or broken JSON names the file."""
    with pytest.raises(PlanError, match="cannot read plan: does not exist"):
        read_plan(tmp_path / "none.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(PlanError, match=r"bad\.json: invalid JSON"):
        read_plan(bad)


def test_files_are_recorded_beside_the_plan_and_resolved_from_there(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A profile or cluster given as a file is recorded relative to the plan file, so the plan reads from any folder;
    a built-in name is kept as it is; an older plan whose path is relative to the working folder still reads."""
    work = tmp_path / "work"
    (work / "out").mkdir(parents=True)
    (work / "prof.json").write_text("{}")
    monkeypatch.chdir(work)
    write_plan(sample_plan(), "out/plan.json", "prof.json", "v100-8x1")
    recorded = json.loads((work / "out" / "plan.json").read_text())
    assert (recorded["profile"], recorded["cluster"]) == ("../prof.json", "v100-8x1")
    monkeypatch.chdir(tmp_path)
    _, names = read_plan(work / "out" / "plan.json")
    assert names == {"profile": str(work / "prof.json"), "cluster": "v100-8x1"}
    older = dict(recorded, profile="prof.json")  # written relative to the working folder `work`
    (work / "out" / "old.json").write_text(json.dumps(older))
    monkeypatch.chdir(work)
    _, names = read_plan("out/old.json")
    assert names["profile"] == "prof.json"  # nothing beside the plan: kept, and found from the working folder


def diamond() -> ModelProfile:
    """a -> b, a -> c, (b, c) -> d."""
    layers = tuple(LayerProfile(name, 1.0, 2.0, 8.0, 0.0) for name in ("a", "b", "c", "d"))
    return ModelProfile("diamond", 4, layers, layer_inputs=((), (0,), (0,), (1, 2)))


def test_a_dag_plan_names_its_stage_layers_and_round_trips(tmp_path: Path) -> None:
    """Stages {a, c} and {b, d} are written with their layer names and read back to the same order, with the profile
    or with a function of the recorded name; a chain plan's bytes do not change."""
    profile = diamond()
    plan = Plan((Stage(0, 1, (0,)), Stage(2, 3, (1,))), 1, 2, 4, "1f1b", layer_order=(0, 2, 1, 3))
    obj = plan_to_json(plan, "diamond.json", "c", profile)
    assert [s["layers"] for s in obj["stages"]] == [["a", "c"], ["b", "d"]]
    path = tmp_path / "plan.json"
    write_plan(plan, path, "diamond-name", "c", profile=profile)
    assert read_plan(path, profile)[0] == plan
    asked: list[str] = []
    assert read_plan(path, lambda name: asked.append(name) or profile)[0] == plan
    assert asked == ["diamond-name"]
    with pytest.raises(PlanError, match="its stages name their layers; reading it needs the profile"):
        read_plan(path)
    with pytest.raises(PlanError, match="needs its 4-layer profile, got no profile"):
        plan_to_json(plan, "p", "c")
    chain = Plan((Stage(0, 1, (0,)), Stage(2, 3, (1,))), 1, 2, 4, "1f1b")
    identity = Plan(chain.stages, 1, 2, 4, "1f1b", layer_order=(0, 1, 2, 3))
    assert plan_dumps(identity, "p", "c", profile) == plan_dumps(chain, "p", "c")
    assert "layers" not in plan_dumps(chain, "p", "c")


@pytest.mark.parametrize(
    ("layers", "message"),
    [
        ([["a", "c"], ["c", "d"]], r"stages 0 and 1 both hold layer 2 \(c\)"),
        ([["a", "c"], ["d"]], r"no stage holds layer 1 \(b\)"),
        ([["b", "c"], ["a", "d"]], r"stage 0 holds layer 1 \(b\) but its input layer 0 \(a\) is in the later stage 1"),
        ([["a", "x"], ["b", "d"]], r"stage 0 lists layer 'x', but profile 'diamond' has no layer of that name"),
        ([["a", "c", "b"], ["d"]], r"stage 0 lists 3 layers, so it spans positions 0..2 .* say 0..1"),
    ],
)
def test_bad_stage_layers_name_the_stage_and_the_layer(tmp_path: Path, layers: list, message: str) -> None:
    """Overlapping stages, a layer in no stage, a stage not closed under the cut, an unknown name and positions that
    disagree with the lists are refused naming the file, the stage and the layer."""
    plan = Plan((Stage(0, 1, (0,)), Stage(2, 3, (1,))), 1, 2, 4, "1f1b", layer_order=(0, 2, 1, 3))
    obj = plan_to_json(plan, "p", "c", diamond())
    for stage, names in zip(obj["stages"], layers, strict=True):
        stage["layers"] = names
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(obj))
    with pytest.raises(PlanError, match=f"bad.json: {message}"):
        read_plan(path, diamond())


def adaptive_plan() -> Plan:
    """sample_plan (kfkb, k = 2, m = 8) with an adaptive setting: k 1..4 within 12 GB."""
    return dataclasses.replace(sample_plan(), adaptive=AdaptiveSetting((1, 2, 3, 4), 12e9))


def test_an_adaptive_plan_round_trips_with_its_block_and_a_plain_one_is_written_as_before(tmp_path: Path) -> None:
    """The "adaptive" block holds the start k (the plan's), k_choices and the budget; without a setting, no block."""
    path = tmp_path / "plan.json"
    write_plan(adaptive_plan(), path, "p", "c")
    obj = json.loads(path.read_text())
    assert obj["adaptive"] == {"k": 2, "k_choices": [1, 2, 3, 4], "memory_budget_bytes": 12_000_000_000}
    assert read_plan(path)[0] == adaptive_plan()
    assert "adaptive" not in plan_to_json(sample_plan(), "p", "c")


ADAPTIVE_BAD = [
    ({"adaptive": {"k": 3, "k_choices": [1, 2, 3], "memory_budget_bytes": 1e9}},
     "adaptive.k 3 contradicts the plan's k 2"),
    ({"adaptive": {"k": 2, "k_choices": [1, 3], "memory_budget_bytes": 1e9}}, "adaptive.k 2 is not among adaptive.k_choices"),
    ({"adaptive": {"k": 2, "k_choices": [2, 1], "memory_budget_bytes": 1e9}}, "k_choices must be ascending"),
    ({"adaptive": {"k": 2, "k_choices": [1, 2, 9], "memory_budget_bytes": 1e9}}, "holds k=9, above the plan's microbatches 8"),
    ({"adaptive": {"k": 2, "k_choices": [0, 2], "memory_budget_bytes": 1e9}}, r"k_choices\[0\] must be an integer >= 1, got 0"),
    ({"adaptive": {"k": 2, "k_choices": [2], "memory_budget_bytes": 0}}, "'memory_budget_bytes' must be a finite number > 0"),
    ({"adaptive": {"k": 2, "k_choices": [2]}}, "missing field 'memory_budget_bytes'"),
    ({"adaptive": {"k": 2, "k_choices": [2], "memory_budget_bytes": 1e9, "budget": 1}}, "unknown field 'budget'"),
    ({"schedule": "1f1b", "k": 1, "adaptive": {"k": 1, "k_choices": [1, 2], "memory_budget_bytes": 1e9}},
     "an adaptive setting changes kfkb's k, but the plan's schedule is '1f1b'"),
    ({"schedule": "interleaved-1f1b", "k": 1, "adaptive": {"k": 1, "k_choices": [1], "memory_budget_bytes": 1e9}},
     "but the plan's schedule is 'interleaved-1f1b'"),
]  # fmt: skip


@pytest.mark.parametrize(("change", "message"), ADAPTIVE_BAD)
def test_an_adaptive_block_that_contradicts_its_plan_is_refused_naming_the_field(change: dict, message: str) -> None:
    """A start k other than the plan's or outside k_choices, k_choices unordered or beyond m, a budget <= 0, a
    schedule without k: PlanError naming the file and the field."""
    obj = {**plan_to_json(sample_plan(), "p", "c"), **change}
    with pytest.raises(PlanError, match=rf"^p\.json: .*{message}"):
        plan_from_json(obj, "p.json")


def test_tensor_parallel_stages_and_sharding_round_trip_and_defaults_are_left_out(tmp_path: Path) -> None:
    """tp, sequence_parallel and zero are written only away from their defaults, and read back equal."""
    plan = Plan((Stage(0, 2, (0, 1, 2, 3), tp=2, sequence_parallel=True), Stage(3, 5, (4, 5))), 1, 4, 4, "1f1b", zero=1)
    obj = plan_to_json(plan, "p", "c")
    assert obj["zero"] == 1 and obj["stages"][0]["tp"] == 2 and obj["stages"][0]["sequence_parallel"] is True
    assert "tp" not in obj["stages"][1] and "sequence_parallel" not in obj["stages"][1]
    path = tmp_path / "plan.json"
    write_plan(plan, path, "p", "c")
    assert read_plan(path)[0] == plan
    plain = plan_to_json(sample_plan(), "p", "c")
    assert "zero" not in plain and all(set(s) == {"first_layer", "last_layer", "devices"} for s in plain["stages"])


def test_a_tp_that_does_not_divide_a_stage_is_refused_naming_the_file_and_stage() -> None:
    """A stage whose devices are not a multiple of its tp is refused with the file, the stage and the values."""
    obj = plan_to_json(sample_plan(), "p", "c")
    obj["stages"][1]["tp"] = 3
    with pytest.raises(PlanError, match=r"f.json: stages\[1\]: stage 3..5 has 2 devices, not a multiple of its tp 3"):
        plan_from_json(obj, "f.json")
    obj["stages"][1]["tp"] = 1
    obj["zero"] = 5
    with pytest.raises(PlanError, match=r"f\.json: plan zero must be 0 .*got 5"):
        plan_from_json(obj, "f.json")
