"""io.profile_shared: a profile file's shared_parameters, read, written and refused field by field."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from pipeplan.core.errors import ProfileError
from pipeplan.core.profile import LayerProfile, ModelProfile, SharedGroup
from pipeplan.io.profile_json import profile_from_json, profile_to_json, read_profile_json, write_profile_json
from pipeplan.presets.resolve import load_profile


def tied_json(version: int = 1) -> dict[str, Any]:
    """Three layers, the first and last holding one 400-byte weight (each counts it in its param_bytes)."""
    layers = [
        {"name": "emb", "fwd_ms": 1.0, "bwd_ms": 2.0, "activation_bytes": 64, "param_bytes": 400},
        {"name": "block", "fwd_ms": 3.0, "bwd_ms": 6.0, "activation_bytes": 64, "param_bytes": 100},
        {"name": "head", "fwd_ms": 1.0, "bwd_ms": 2.0, "activation_bytes": 32, "param_bytes": 410},
    ]
    obj: dict[str, Any] = {"format": "pipeplan.profile/1", "name": "tied", "batch_size": 4, "layers": layers}
    if version == 2:
        obj = profile_to_json(profile_from_json(obj))
    obj["shared_parameters"] = [{"name": "emb.weight", "layers": [0, 2], "param_bytes": 400}]
    return obj


@pytest.mark.parametrize("version", [1, 2])
def test_reads_the_groups_of_either_format(version: int) -> None:
    """shared_parameters lands in ModelProfile.shared_parameters; the model then counts the weight once."""
    profile = profile_from_json(tied_json(version), "tied.json")
    assert profile.shared_params == (SharedGroup("emb.weight", (0, 2), 400.0),)
    assert profile.total_param_bytes == 510.0


def test_round_trip_keeps_the_groups_and_writes_version_2(tmp_path: Path) -> None:
    """A profile with a group is written as version 2 with the field, and reads back equal."""
    profile = profile_from_json(tied_json(), "tied.json")
    path = tmp_path / "tied.json"
    write_profile_json(profile, path)
    written = json.loads(path.read_text())
    assert written["format"] == "pipeplan.profile/2"
    assert written["shared_parameters"] == [{"name": "emb.weight", "layers": [0, 2], "param_bytes": 400}]
    again = read_profile_json(path)  # as version 2: one-size curves added, every value the same
    assert again.shared_params == profile.shared_params

    def values(p: ModelProfile) -> list[tuple[str, float, float]]:
        return [(x.name, x.fwd_ms, x.param_bytes) for x in p.layers]

    assert values(again) == values(profile)
    assert profile_to_json(again) == written


def test_a_profile_without_the_field_reads_and_writes_as_before() -> None:
    """No field: no groups, and the file written is version 1 without the key (old files unchanged)."""
    obj = tied_json()
    del obj["shared_parameters"]
    profile = profile_from_json(obj)
    assert profile.shared_params == ()
    assert "shared_parameters" not in profile_to_json(profile)
    assert profile_to_json(profile)["format"] == "pipeplan.profile/1"


@pytest.mark.parametrize("name", ["dapple/bert-24-pbs-6", "pipedream/vgg16", "pipedream/resnet18"])
def test_shipped_profiles_still_load_with_no_groups(name: str) -> None:
    """Built-in profiles (graph.txt and DAPPLE text) have no groups and keep their totals."""
    profile = load_profile(name)
    assert profile.shared_params == ()
    assert profile.total_param_bytes == sum(layer.param_bytes for layer in profile.layers)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"a": 1}, r"tied.json: field 'shared_parameters' must be an array of \{name, layers, param_bytes\}, got"),
        ([7], r"tied.json: shared_parameters\[0\] must be a JSON object, got 7"),
        ([{"name": "w", "layers": [0, 2]}], r"shared_parameters\[0\]: missing field 'param_bytes'"),
        ([{"name": "", "layers": [0, 2], "param_bytes": 1}], r"shared_parameters\[0\]: field 'name' must be a non-empty"),
        ([{"name": "w", "layers": [0, 2], "param_bytes": 1, "x": 1}], r"shared_parameters\[0\]: unknown field 'x'"),
        ([{"name": "w", "layers": [2], "param_bytes": 1}], r"\(w\) field 'layers' must be an array of at least 2 layer"),
        ([{"name": "w", "layers": "0,2", "param_bytes": 1}], r"at least 2 layer indices, got \"0,2\""),
        (
            [{"name": "w", "layers": [0, 3], "param_bytes": 1}],
            r"\(w\) field 'layers' names layer 3, but the profile has layers 0\.\.2$",
        ),
        ([{"name": "w", "layers": [0, 1.5], "param_bytes": 1}], r"field 'layers' names layer 1\.5, but"),
        ([{"name": "w", "layers": [2, 0], "param_bytes": 1}], r"field 'layers' must be ascending without repeats, got \[2, 0\]"),
        ([{"name": "w", "layers": [0, 2], "param_bytes": -5}], r"shared_parameters\[0\]: field 'param_bytes' must be .*-5"),
        (
            [{"name": "w", "layers": [0, 2], "param_bytes": 500}],
            r"tied.json: profile 'tied' layer 'emb' holds shared parameters of 500 ",
        ),
        (
            [{"name": "w", "layers": [0, 2], "param_bytes": 1}, {"name": "w", "layers": [0, 1], "param_bytes": 1}],
            r"tied.json: profile 'tied' shared_params names 'w' twice",
        ),
    ],
)
def test_bad_groups_name_file_field_and_value(value: object, message: str) -> None:
    """Every refusal is one ProfileError naming the file, the group's index or name, the field and the value."""
    obj = copy.deepcopy(tied_json())
    obj["shared_parameters"] = value
    with pytest.raises(ProfileError, match=message):
        profile_from_json(obj, "tied.json")


def test_groups_survive_a_profile_built_in_code() -> None:
    """A ModelProfile with a group written and read: equal, field for field."""
    layers = tuple(LayerProfile(f"l{i}", 1.0, 2.0, 8.0, 16.0) for i in range(3))
    profile = ModelProfile("p", 2, layers, shared_params=(SharedGroup("l0.w", (0, 1, 2), 16.0),))
    again = profile_from_json(profile_to_json(profile))
    assert again.shared_params == profile.shared_params
    assert profile_from_json(profile_to_json(again)) == again
    assert again.total_param_bytes == profile.total_param_bytes == 16.0
