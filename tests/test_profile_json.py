"""Tests of the pipeplan.profile/1 JSON format: round trips, defaults, determinism and errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pipeplan.core.errors import ProfileError
from pipeplan.core.profile import LayerProfile, ModelProfile, SplitTiming, TensorSplit
from pipeplan.io.profile_json import profile_from_json, profile_to_json, read_profile_json, write_profile_json
from pipeplan.presets.resolve import load_profile


def small() -> dict[str, Any]:
    """A valid two-layer profile object; the second layer has FLOP and byte counts."""
    first = {"name": "l0", "fwd_ms": 1.5, "bwd_ms": 3.0, "activation_bytes": 64, "param_bytes": 1024, "saved_bytes": 128}
    second = {"name": "l1", "fwd_ms": 0.5, "bwd_ms": 1.0, "activation_bytes": 32, "param_bytes": 0, "flops": 2e9}
    second["bytes_moved"] = 4e6
    return {
        "format": "pipeplan.profile/1",
        "name": "tiny",
        "batch_size": 4,
        "reference_device": "A100",
        "measured": False,
        "cut_bytes": [96],
        "layers": [first, second],
    }


def test_reads_every_field() -> None:
    """Each JSON field lands in the matching ModelProfile/LayerProfile field."""
    profile = profile_from_json(small(), "tiny.json")
    assert (profile.name, profile.batch_size, profile.reference_device, profile.measured) == ("tiny", 4, "A100", False)
    assert profile.cut_bytes == (96.0,)
    assert profile.layers[0] == LayerProfile("l0", 1.5, 3.0, 64, 1024, 128)
    assert profile.layers[1].flops == 2e9
    assert profile.layers[1].bytes_moved == 4e6
    assert profile.layers[0].flops is None


def test_optional_fields_take_their_defaults() -> None:
    """Without reference_device, measured, cut_bytes and saved_bytes: unknown, true, activations, activation."""
    obj = small()
    for key in ("format", "reference_device", "measured", "cut_bytes"):
        del obj[key]
    del obj["layers"][0]["saved_bytes"]
    profile = profile_from_json(obj)
    assert (profile.reference_device, profile.measured) == ("unknown", True)
    assert profile.cut_bytes == (64.0,)
    assert profile.layers[0].saved_bytes == 64.0


def test_round_trip_of_a_builtin_profile(tmp_path: Path) -> None:
    """A graph.txt profile written as JSON and read back is equal to the original."""
    original = load_profile("pipedream/resnet18")
    path = tmp_path / "resnet18.json"
    write_profile_json(original, path)
    assert read_profile_json(path) == original


def test_writing_is_deterministic_with_sorted_keys(tmp_path: Path) -> None:
    """The same profile gives the same bytes, with keys sorted and whole byte counts as integers."""
    profile = profile_from_json(small())
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    write_profile_json(profile, first)
    write_profile_json(profile_from_json(profile_to_json(profile)), second)
    assert first.read_bytes() == second.read_bytes()
    text = first.read_text()
    assert text.index('"batch_size"') < text.index('"cut_bytes"') < text.index('"layers"') < text.index('"name"')
    assert json.loads(text)["layers"][0]["param_bytes"] == 1024
    assert isinstance(json.loads(text)["layers"][0]["param_bytes"], int)


def test_to_json_lists_every_layer_field() -> None:
    """Each layer object carries all LayerProfile fields; unknown counts are null."""
    layer = profile_to_json(profile_from_json(small()))["layers"][0]
    assert sorted(layer) == ["activation_bytes", "bwd_ms", "bytes_moved", "flops", "fwd_ms", "name", "param_bytes", "saved_bytes"]
    assert layer["flops"] is None


def test_fractional_sizes_survive_a_round_trip() -> None:
    """A scaled profile's fractional byte counts stay floats and round-trip exactly."""
    profile = ModelProfile("f", 1, (LayerProfile("a", 0.1, 0.2, 10.5, 0.25), LayerProfile("b", 0.3, 0.4, 1.0, 0.0)))
    assert profile_from_json(json.loads(json.dumps(profile_to_json(profile)))) == profile


def edit(path: str, value: object, base: Any = None) -> dict[str, Any]:
    """small() (or `base()`) with the field at a dotted path replaced (or deleted when value is DELETE)."""
    obj = (base or small)()
    keys = path.split(".")
    target: Any = obj
    for key in keys[:-1]:
        target = target[int(key)] if key.isdigit() else target[key]
    last: Any = int(keys[-1]) if keys[-1].isdigit() else keys[-1]
    if value is DELETE:
        del target[last]
    else:
        target[last] = value
    return obj


DELETE = object()


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("name", DELETE, r"p\.json: missing field 'name'"),
        ("layers.1.fwd_ms", DELETE, r"p\.json: layers\[1\]: missing field 'fwd_ms'"),
        ("layers.0.activation_bytes", -64, r"p\.json: layers\[0\]: field 'activation_bytes' must be .* >= 0, got -64"),
        ("layers.0.param_bytes", "1 KiB", r"layers\[0\]: field 'param_bytes' must be a finite number >= 0, got \"1 KiB\""),
        ("layers.0.bwd_ms", True, r"layers\[0\]: field 'bwd_ms' must be a finite number >= 0, got true"),
        ("layers.1.flops", -1, r"layers\[1\]: field 'flops' must be a finite number >= 0, got -1"),
        ("layers.0.saved_bytes", -1.5, r"layers\[0\]: field 'saved_bytes' must be a finite number >= 0, got -1.5"),
        ("layers.0.fwd", 1, r"layers\[0\]: unknown field 'fwd'; known fields: name, fwd_ms"),
        ("batch_size", 0, r"p\.json: field 'batch_size' must be an integer >= 1, got 0"),
        ("batch_size", 2.5, r"field 'batch_size' must be an integer >= 1, got 2.5"),
        ("measured", "yes", r"field 'measured' must be true or false, got \"yes\""),
        (
            "format",
            "pipeplan.cluster/1",
            r"field 'format' must be one of 'pipeplan.profile/1', 'pipeplan.profile/2', got \"pipeplan.cluster/1\"",
        ),
        ("cut_bytes", [1, 2], r"field 'cut_bytes' must have 1 entries .* got 2"),
        ("cut_bytes", [-5], r"p\.json: cut_bytes\[0\] must be a finite number >= 0, got -5"),
        ("layers", [], r"field 'layers' must be an array of at least 1 items, got \[\]"),
        ("layers.1", "l1", r"layers\[1\] must be a JSON object, got \"l1\""),
        ("extra", 1, r"p\.json: unknown field 'extra'"),
    ],
)
def test_bad_fields_name_file_field_and_value(path: str, value: object, message: str) -> None:
    """Each bad or missing field raises ProfileError naming the file, the field and the value."""
    with pytest.raises(ProfileError, match=message):
        profile_from_json(edit(path, value), "p.json")


def test_not_an_object() -> None:
    """A top-level array is rejected with its value."""
    with pytest.raises(ProfileError, match=r"x\.json must be a JSON object, got \[1\]"):
        profile_from_json([1], "x.json")


def test_invalid_json_file_names_file_and_position(tmp_path: Path) -> None:
    """Broken JSON reports the file, line and column; a missing file reports the file."""
    path = tmp_path / "broken.json"
    path.write_text('{\n  "name": "x",\n  oops\n}\n')
    with pytest.raises(ProfileError, match=r"broken\.json: invalid JSON at line 3 column 3"):
        read_profile_json(path)
    with pytest.raises(ProfileError, match=r"missing\.json: cannot read profile: does not exist"):
        read_profile_json(tmp_path / "missing.json")


def test_notes_are_allowed_and_ignored() -> None:
    """A free-form `notes` field is accepted and does not change the profile."""
    obj = small()
    obj["notes"] = "measured on a laptop"
    assert profile_from_json(obj) == profile_from_json(small())


def small_v2() -> dict[str, Any]:
    """A valid two-layer pipeplan.profile/2 object measured at batch sizes 1, 2 and 4 (reference 4)."""
    first = {
        "name": "l0", "fwd_ms": [0.5, 0.8, 1.5], "bwd_ms": [1.0, 1.6, 3.0], "bwd_input_ms": [0.4, 0.7, 1.4],
        "bwd_weight_ms": [0.6, 0.9, 1.6], "activation_bytes": [16, 32, 64], "saved_bytes": [32, 64, 128],
        "param_bytes": 1024, "optimizer_ms": {"adam": 0.25, "sgd": 0.05},
    }  # fmt: skip
    second = {"name": "l1", "fwd_ms": [0.2, 0.3, 0.5], "bwd_ms": [0.4, 0.6, 1.0], "activation_bytes": [8, 16, 32],
              "param_bytes": 0}  # fmt: skip
    return {
        "format": "pipeplan.profile/2", "name": "tiny", "batch_size": 4, "batch_sizes": [1, 2, 4],
        "reference_device": "cpu", "threads": 1, "cut_bytes": [[16, 32, 64]], "layers": [first, second],
        "source": {"module": "mlp", "options": {"hidden": "8"}, "dataset": "digits", "dtype": "float32"},
    }  # fmt: skip


def test_version_2_reads_curves_split_optimizer_steps_threads_and_source() -> None:
    """Every array lands in the layer's curve, the scalars are the values at batch_size, I/W and steps are kept."""
    profile = profile_from_json(small_v2(), "v2.json")
    assert profile.batch_sizes == (1, 2, 4) and profile.batch_size == 4 and profile.threads == 1
    first = profile.layers[0]
    assert first.curve is not None and first.curve.fwd_ms == (0.5, 0.8, 1.5)
    assert (first.fwd_ms, first.bwd_ms, first.bwd_input_ms, first.bwd_weight_ms) == (1.5, 3.0, 1.4, 1.6)
    assert first.optimizer_step_ms("adam") == 0.25 and first.optimizer_step_ms("sgd_momentum") is None
    assert profile.layers[1].saved_bytes == 32 and profile.layers[1].bwd_input_ms is None
    assert profile.cut_curves == ((16.0, 32.0, 64.0),) and profile.cut_bytes == (64.0,)
    assert profile.source is not None and profile.source.options == (("hidden", "8"),)


def test_version_2_round_trips_and_a_plain_profile_stays_version_1(tmp_path: Path) -> None:
    """A several-size profile writes as /2 and reads back equal; one without anything new writes as /1, as before."""
    profile = profile_from_json(small_v2())
    assert profile_to_json(profile)["format"] == "pipeplan.profile/2"
    path = tmp_path / "p.json"
    write_profile_json(profile, path)
    assert read_profile_json(path) == profile
    assert not list(tmp_path.glob(".*.tmp"))  # written through a temporary file, renamed into place
    assert profile_to_json(load_profile("dapple/bert-48"))["format"] == "pipeplan.profile/1"


def test_shared_bytes_read_round_trip_and_default_to_zero(tmp_path: Path) -> None:
    """A layer's shared bytes (what its predecessor saves too) are an optional array; absent, zeros, and not written."""
    obj = small_v2()
    obj["layers"][1]["shared_bytes"] = [4, 8, 16]
    profile = profile_from_json(obj)
    assert profile.layers[1].shared_bytes == 16 and profile.layers[1].curve.shared_bytes == (4.0, 8.0, 16.0)  # type: ignore[union-attr]
    assert profile.layers[0].shared_bytes == 0 and profile.layers[0].curve.shared_bytes is None  # type: ignore[union-attr]
    path = tmp_path / "p.json"
    write_profile_json(profile, path)
    assert read_profile_json(path) == profile
    assert "shared_bytes" not in profile_to_json(profile_from_json(small_v2()))["layers"][1]


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("batch_sizes", [1, 2, 2], r"batch_sizes must be strictly increasing \(no repeats\), got \[1, 2, 2\]"),
        ("batch_sizes", [4, 2, 1], r"batch_sizes must be strictly increasing \(no repeats\), got \[4, 2, 1\]"),
        ("batch_sizes", [1, 2, "4"], r"batch_sizes\[2\] must be an integer >= 1, got '4'"),
        ("batch_sizes", [0, 2, 4], r"batch_sizes\[0\] must be an integer >= 1, got 0"),
        ("batch_sizes", DELETE, r"missing field 'batch_sizes'"),
        ("batch_size", 3, r"field 'batch_size' 3 must be one of batch_sizes \[1, 2, 4\]"),
        ("layers.0.fwd_ms", [0.5, -0.8, 1.5], r"layers\[0\]: field 'fwd_ms'\[1\] must be a finite number >= 0, got -0.8"),
        ("layers.0.bwd_ms", [1.0, "fast", 3.0], r"layers\[0\]: field 'bwd_ms'\[1\] must be a finite number >= 0, got \"fast\""),
        ("layers.0.fwd_ms", [0.5, 1.5], r"field 'fwd_ms' must be an array of 3 numbers \(one per batch size\), got \[0.5, 1.5\]"),
        ("layers.0.fwd_ms", 1.5, r"field 'fwd_ms' must be an array of 3 numbers"),
        ("layers.0.bwd_weight_ms", DELETE, r"needs both bwd_input_ms and bwd_weight_ms or neither"),
        ("layers.0.optimizer_ms", {"adam": -1}, r"optimizer_ms: field 'adam' must be a finite number >= 0, got -1"),
        ("cut_bytes", [[16, 32]], r"cut_bytes\[0\] must be an array of 3 numbers"),
        ("threads", 0, r"field 'threads' must be an integer >= 1, got 0"),
        ("source.module", "", r"source: field 'module' must be a non-empty string"),
        ("source.options", {"hidden": 8}, r"source: options\['hidden'\] must be a string, got 8"),
        ("layers.0.speed", 1, r"layers\[0\]: unknown field 'speed'"),
        ("layers.1.shared_bytes", [8, 16], r"layers\[1\]: field 'shared_bytes' must be an array of 3 numbers"),
        ("layers.1.shared_bytes", [8, 16, 64], r"layers\[1\]: layer 'l1' shared_bytes \(64\) exceeds its saved_bytes \(32\)"),
    ],
)
def test_bad_version_2_fields_name_file_field_and_value(path: str, value: object, message: str) -> None:
    """Repeated or unordered batch sizes, non-numeric or negative times, wrong lengths: ProfileError naming them."""
    with pytest.raises(ProfileError, match=message):
        profile_from_json(edit(path, value, small_v2), "v2.json")


def test_a_dag_profile_keeps_its_inputs_through_both_versions(tmp_path: Path) -> None:
    """resnet50's edges survive a version 1 file; inputs given for some layers only are refused naming the first
    without."""
    profile = load_profile("resnet50")
    path = tmp_path / "r.json"
    write_profile_json(profile, path)
    back = read_profile_json(path)
    assert back.layer_inputs == profile.layer_inputs and back == profile
    obj = small()
    obj["layers"][1]["inputs"] = [0]
    with pytest.raises(ProfileError, match=r"layers\[0\] has no field 'inputs' but other layers do"):
        profile_from_json(obj, "x.json")
    obj["layers"][0]["inputs"] = []
    obj["layers"][1]["inputs"] = [1]
    with pytest.raises(ProfileError, match=r"x.json: profile 'tiny' layer 1 \(l1\) names input 1, not an earlier layer"):
        profile_from_json(obj, "x.json")


def test_a_tensor_parallel_split_round_trips_through_both_versions(tmp_path: Path) -> None:
    """A layer's "tp" object reads into a TensorSplit and writes back as it was, in /1 and /2; a layer without one
    writes no "tp" key (every older profile's bytes unchanged)."""
    for obj in (small(), small_v2()):
        obj["layers"][0]["tp"] = {"kind": "block", "width": 16}
        tp = {"kind": "column", "width": 512, "replicated_share": 0.25, "whole_fwd": 0.125, "whole_bwd": 0.5, "recomputed": True,
              "norm_bytes": 8192}  # fmt: skip
        obj["layers"][1]["tp"] = dict(tp)
        profile = profile_from_json(obj, "tp.json")
        assert profile.layers[0].tp == TensorSplit("block", 16)
        assert profile.layers[1].tp == TensorSplit("column", 512, 0.25, 0.125, 0.5, True, norm_bytes=8192.0)
        out = profile_to_json(profile)
        assert out["layers"][0]["tp"] == {"kind": "block", "width": 16}
        assert out["layers"][1]["tp"] == tp
        path = tmp_path / "p.json"
        write_profile_json(profile, path)
        assert read_profile_json(path) == profile
    assert all("tp" not in layer for layer in profile_to_json(profile_from_json(small()))["layers"])


@pytest.mark.parametrize(
    ("tp", "message"),
    [
        ({"kind": "conv", "width": 4}, "layers\\[0\\]: tp kind must be one of block, .*got 'conv'"),
        ({"kind": "mlp", "width": 0}, "layers\\[0\\]: tp: field 'width' must be an integer >= 1, got 0"),
        ({"kind": "mlp", "width": 8, "replicated_share": 1.5}, "tp replicated_share must be a fraction in 0..1, got 1.5"),
        ({"kind": "mlp", "width": 8, "heads": 2}, "tp: unknown field 'heads'"),
        ({"kind": "mlp", "width": 8, "whole_fwd": 2}, "tp whole_fwd must be a fraction in 0..1, got 2"),
        ({"kind": "mlp", "width": 8, "recomputed": 1}, "tp: field 'recomputed' must be true or false, got 1"),
        ({"kind": "mlp", "width": 8, "norm_bytes": -1}, "tp: field 'norm_bytes' must be a finite number >= 0, got -1"),
        ({"kind": "mlp", "width": 8, "norm_bytes": "8"}, "tp: field 'norm_bytes' must be a finite number >= 0, got \"8\""),
    ],
)
def test_a_bad_tp_object_names_the_layer_field_and_value(tp: dict[str, Any], message: str) -> None:
    """A bad "tp" object is refused naming the file, the layer, the field and the value."""
    obj = small()
    obj["layers"][0]["tp"] = tp
    with pytest.raises(ProfileError, match=message):
        profile_from_json(obj, "tp.json")


def test_master_copy_round_trips_through_both_versions_and_is_written_only_when_true(tmp_path: Path) -> None:
    """ "master_copy": true reads into ModelProfile.master_copy and writes back in /1 and /2; a profile without it
    writes no key (every older profile's bytes unchanged); a value that is no boolean names the field."""
    for obj in (small(), small_v2()):
        assert "master_copy" not in profile_to_json(profile_from_json(obj))
        obj["master_copy"] = True
        profile = profile_from_json(obj, "mixed.json")
        assert profile.master_copy
        assert profile_to_json(profile)["master_copy"] is True
        path = tmp_path / "p.json"
        write_profile_json(profile, path)
        assert read_profile_json(path) == profile
        obj["master_copy"] = 1
        with pytest.raises(ProfileError, match=r"bad\.json: field 'master_copy' must be true or false, got 1"):
            profile_from_json(obj, "bad.json")
    with pytest.raises(ProfileError, match="profile 'x' master_copy must be true or false, got 'yes'"):
        ModelProfile("x", 1, (LayerProfile("l", 1.0, 1.0, 1.0, 1.0),), master_copy="yes")  # type: ignore[arg-type]
    assert load_profile("gpt:layers=2,hidden=64,heads=4,seq=8,vocab=16").master_copy


def test_main_grads_round_trips_and_is_written_only_when_not_the_default(tmp_path: Path) -> None:
    """ "main_grads" reads into ModelProfile.main_grads and writes back in /1 and /2 when it is not "weights" (a
    profile without it writes no key); an unknown value, a non-string or one without a master copy names the file,
    the field and the value (one line)."""
    for obj in (small(), small_v2()):
        obj["master_copy"] = True
        assert "main_grads" not in profile_to_json(profile_from_json(obj))
        for value in ("fp32", "fp32_copy"):
            obj["main_grads"] = value
            profile = profile_from_json(obj, "m.json")
            assert profile.main_grads == value and profile_to_json(profile)["main_grads"] == value
            path = tmp_path / "p.json"
            write_profile_json(profile, path)
            assert read_profile_json(path) == profile
        for bad, message in (("fp64", "main_grads must be one of 'weights', 'fp32', 'fp32_copy', got 'fp64'"),
                             (32, "field 'main_grads' must be a non-empty string, got 32")):  # fmt: skip
            obj["main_grads"] = bad
            with pytest.raises(ProfileError, match=rf"bad\.json: .*{message}") as caught:
                profile_from_json(obj, "bad.json")
            assert "\n" not in str(caught.value)
        obj["master_copy"], obj["main_grads"] = False, "fp32"
        with pytest.raises(ProfileError, match=r"bad\.json: profile .* main_grads 'fp32' needs master_copy true"):
            profile_from_json(obj, "bad.json")


def test_a_splits_timed_degrees_round_trip_one_value_per_batch_size(tmp_path: Path) -> None:
    """A "tp" object's "timed" list (the profiler's split times) reads into SplitTiming values, one per batch size
    (one in /1, three in /2), and writes back as it was; a "tp" object without it (every profile written before)
    reads with no timings and writes no "timed" key."""
    for obj, values in ((small(), 1), (small_v2(), 3)):
        timed = [
            {"tp": 2, "fwd_ms": [1.0 + k for k in range(values)], "bwd_ms": [2.0 + k for k in range(values)]},
            {"tp": 4, "fwd_ms": [0.75] * values, "bwd_ms": [1.25] * values},
        ]
        obj["layers"][0]["tp"] = {"kind": "block", "width": 8, "timed": timed}
        obj["layers"][1]["tp"] = {"kind": "block", "width": 8}
        profile = profile_from_json(obj, "tp.json")
        split = profile.layers[0].tp
        assert split is not None
        assert split.timed == (
            SplitTiming(2, tuple(1.0 + k for k in range(values)), tuple(2.0 + k for k in range(values))),
            SplitTiming(4, (0.75,) * values, (1.25,) * values),
        )
        assert split.timing(4) == split.timed[1] and split.timing(8) is None
        assert profile.layers[1].tp == TensorSplit("block", 8) and profile.layers[1].tp.timed == ()
        out = profile_to_json(profile)
        assert out["layers"][0]["tp"]["timed"] == timed and "timed" not in out["layers"][1]["tp"]
        write_profile_json(profile, tmp_path / "p.json")
        assert read_profile_json(tmp_path / "p.json") == profile


@pytest.mark.parametrize(
    ("timed", "message"),
    [
        ([{"tp": 3, "fwd_ms": [1.0], "bwd_ms": [1.0]}], "tp timed names tp 3, which does not divide the split's width 8"),
        ([{"tp": 1, "fwd_ms": [1.0], "bwd_ms": [1.0]}], "timed\\[0\\]: field 'tp' must be an integer >= 2, got 1"),
        ([{"tp": 2, "fwd_ms": [1.0], "bwd_ms": [-1]}], "timed\\[0\\]: bwd_ms\\[0\\] must be a finite number >= 0, got -1"),
        (
            [{"tp": 2, "fwd_ms": [1.0, 2.0], "bwd_ms": [1.0, 2.0]}],
            "tp timed at tp 2 has 2 values, not one per batch size \\(1\\)",
        ),
        ([{"tp": 4, "fwd_ms": [1.0], "bwd_ms": [1.0]}, {"tp": 2, "fwd_ms": [1.0], "bwd_ms": [1.0]}], "ascending without repeats"),
        ([{"tp": 2, "fwd_ms": [1.0], "bwd_ms": [1.0], "t": 2}], "timed\\[0\\]: unknown field 't'"),
    ],
)
def test_a_bad_timed_list_names_the_layer_field_and_value(timed: list[dict[str, Any]], message: str) -> None:
    """A bad "timed" list is refused naming the file, the layer, the entry and the value."""
    obj = small()
    obj["layers"][0]["tp"] = {"kind": "block", "width": 8, "timed": timed}
    with pytest.raises(ProfileError, match=message):
        profile_from_json(obj, "tp.json")
