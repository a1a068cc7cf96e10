"""Tests of core.precision (a run's dtype and precision, the refusal of a prediction across them) and of the memory
the cost model gives each, against closed forms and the runtime's memory meter."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipeplan.core.errors import ProfileError, TrainConfigError
from pipeplan.core.precision import (
    DTYPES,
    PRECISIONS,
    check_numerics,
    check_profile_numerics,
    prediction_mismatch,
    source_numerics,
)
from pipeplan.core.profile import ProfileSource
from pipeplan.io.profile_json import profile_from_json, profile_to_json
from pipeplan.presets.resolve import load_profile


def test_every_dtype_trains_full_and_only_float32_under_autocast() -> None:
    """full over float32 and float64; bf16 and fp16 over float32 only, the refusal naming both options and the way
    out; an unknown name is named with the choices."""
    for dtype in DTYPES:
        check_numerics(dtype, "full", TrainConfigError)
    for precision in ("bf16", "fp16"):
        check_numerics("float32", precision, TrainConfigError)
        with pytest.raises(TrainConfigError, match=rf"^--precision {precision} computes over float32 master weights, got "
                           r"--dtype float64: give --dtype float32, or --precision full to compute in float64$"):  # fmt: skip
            check_numerics("float64", precision, TrainConfigError)
    with pytest.raises(TrainConfigError, match=r"^--precision must be one of full, bf16, fp16, got 'fp8'$"):
        check_numerics("float32", "fp8", TrainConfigError)
    with pytest.raises(ProfileError, match=r"^dtype must be float32 or float64, got 'float16'$"):
        check_numerics("float16", "full", ProfileError, ("dtype", "precision"))


def test_a_profile_is_measured_or_projected_only_in_numbers_it_can_be() -> None:
    """bf16 (a bfloat16 model) is projected only; float64 and mixed precision are measured only."""
    check_profile_numerics("fp32", "bf16", projected=False)
    check_profile_numerics("bf16", "full", projected=True)
    for dtype, precision, projected, message in (
        ("bf16", "full", False, "dtype bf16 (a bfloat16 model) is for projections only (project_to); to measure bf16 "
                                "mixed precision, give precision bf16"),
        ("float64", "full", True, "dtype float64 is measured, not projected"),
        ("fp32", "fp16", True, "precision fp16 is measured, not projected"),
        ("float64", "bf16", False, "precision bf16 computes over float32 master weights, got dtype float64"),
        ("fp16", "full", False, "dtype must be one of fp32, bf16, float32, float64, got 'fp16'"),
    ):  # fmt: skip
        with pytest.raises(ProfileError, match=message.replace("(", r"\(").replace(")", r"\)")):
            check_profile_numerics(dtype, precision, projected)


def test_a_prediction_across_numbers_is_one_line_naming_both_and_the_way_out() -> None:
    """Equal numbers: None; else one line naming the profile, both numbers and the options that measure the run's."""
    assert all(prediction_mismatch("p.json", (d, "full"), (d, "full")) is None for d in DTYPES)
    text = prediction_mismatch("p.json", ("float32", "full"), ("float64", "full"))
    assert text == (
        "profile p.json was measured in float32, but this run trains in float64: its times and bytes are another "
        "run's; profile the model again with --dtype float64 and predict with that profile, or train with --dtype "
        "float32"
    )
    text = prediction_mismatch("p.json", ("float32", "full"), ("float32", "bf16"))
    assert text is not None and "trains in bf16 autocast over float32" in text and "again with --precision bf16" in text
    assert all("\n" not in (prediction_mismatch("p", (d, p), ("float32", "fp16")) or "") for d in DTYPES for p in PRECISIONS)


def test_a_profile_without_numbers_was_measured_in_float32_full() -> None:
    """No source, or a source of older files (no precision; a projection's fp32): float32, full."""
    assert source_numerics(None, None) == ("float32", "full")
    assert source_numerics("fp32", None) == ("float32", "full")
    profile = load_profile("dapple/bert-48")
    assert profile.source is None and profile.numerics == ("float32", "full")


def test_a_profiles_numbers_round_trip_through_its_json_and_old_files_read_as_float32_full() -> None:
    """dtype and precision are written in the source and read back; a source without precision reads as full."""
    base = replace(load_profile("dapple/bert-48"), batch_sizes=None)
    for dtype, precision in (("float32", "bf16"), ("float32", "fp16"), ("float64", "full")):
        profile = replace(base, source=ProfileSource("mlp", (("hidden", "8"),), "digits", dtype, precision))
        obj = profile_to_json(profile)
        assert obj["source"]["dtype"] == dtype and obj["source"]["precision"] == precision
        again = profile_from_json(obj)
        assert profile_to_json(again) == obj and again.numerics == (dtype, precision)
    old = profile_to_json(replace(base, source=ProfileSource("mlp")))
    del old["source"]["precision"]
    assert profile_from_json(old).numerics == ("float32", "full")
    old["source"]["precision"] = "fp8"
    assert profile_from_json(old).source.precision == "fp8"  # kept as read; model_source refuses to build it


@pytest.mark.torch
@pytest.mark.parametrize(("dtype", "precision", "bytes_per_param"), [("fp32", "bf16", 4), ("fp32", "fp16", 4),
                                                                    ("float64", "full", 8), ("fp32", "full", 4)])  # fmt: skip
def test_static_memory_is_the_master_weights_gradients_and_adam_state_as_the_runtime_measures_it(
    dtype: str, precision: str, bytes_per_param: int
) -> None:
    """mlp of 2 blocks of Linear(16, 16): N = 2 (16·16 + 16) parameters. The profile records N master weights of
    the dtype (float32 under bf16/fp16, float64 doubles them); the cost model's static memory with Adam is 4 such
    bytes per parameter (weight, gradient, two moments), and the runtime's meter finds exactly that after a step
    under the same autocast."""
    torch = pytest.importorskip("torch")
    from pipeplan import api
    from pipeplan.core.precision import MEASURED_DTYPES
    from pipeplan.models.autocast import autocast
    from pipeplan.models.build import build_model
    from pipeplan.runtime.execution.memory_meter import static_bytes as measured_static
    from pipeplan.sim.cost.layers import OPTIMIZER_STATE, static_bytes

    n = 2 * (16 * 16 + 16)
    profile = api.profile_model("mlp", 4, options={"hidden": 16, "blocks": 2}, dataset="sample", batch_sizes=[4],
                                runs=1, warmup=0, dtype=dtype, precision=precision)  # fmt: skip
    assert profile.numerics == (MEASURED_DTYPES[dtype], precision)
    assert profile.total_param_bytes == n * bytes_per_param
    predicted = static_bytes(profile.total_param_bytes, OPTIMIZER_STATE["adam"])
    assert predicted == 4 * n * bytes_per_param
    model = build_model("mlp", {"hidden": "16", "blocks": "2"}, "sample", MEASURED_DTYPES[dtype])
    net = model.reference()
    optimizer = torch.optim.Adam(net.parameters(), lr=0.1)
    with autocast(precision):
        loss = model.loss_fn(net(model.batch(4)), model.targets(4))
    loss.backward()
    optimizer.step()
    assert measured_static(list(net.parameters()), optimizer) == predicted + 4 * 4  # + Adam's 4 float32 step counters


@pytest.mark.torch
def test_profile_under_bf16_measures_the_16_bit_activations_autocast_produces() -> None:
    """mlp blocks (Linear, ReLU) under bf16 autocast output bfloat16: each layer's activation is 2 bytes a value,
    half of float32's, and the source records bf16 (measured under the autocast, not cast)."""
    pytest.importorskip("torch")
    from pipeplan import api

    def measured(precision: str) -> list[float]:
        profile = api.profile_model("mlp", 4, options={"hidden": 16, "blocks": 2}, dataset="sample", batch_sizes=[4],
                                    runs=1, warmup=0, precision=precision)  # fmt: skip
        assert profile.source is not None and profile.source.precision == precision
        return [layer.activation_bytes for layer in profile.layers]

    assert measured("full") == [4 * 16 * 4.0] * 2
    assert measured("bf16") == [4 * 16 * 2.0] * 2
