"""Profiling a branching model (profiler.graph_timing): the profile keeps the graph and prices cuts by live sets."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from pipeplan.core.dag import reorder  # noqa: E402
from pipeplan.io.profile_json import read_profile_json, write_profile_json  # noqa: E402
from pipeplan.models.specs import resolve_module_spec  # noqa: E402
from pipeplan.profiler import measure_layers  # noqa: E402
from pipeplan.profiler.curves import profile_batch_sizes  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_torch_thread")]


def test_a_graph_profile_keeps_its_inputs_and_prices_each_cut_by_its_live_set() -> None:
    """Cutting inside a residual block carries both branches: the cut's bytes are the two outputs still read later."""
    spec = resolve_module_spec("rescnn", blocks=1, channels=4)
    profile = measure_layers(spec, None, 8, runs=2, warmup=1).to_profile("rescnn")
    assert profile.layer_inputs == spec.layer_inputs
    act = [layer.activation_bytes for layer in profile.layers]
    image = 8 * 4 * 8 * 8 * 4  # 8 samples x 4 channels x 8 x 8 float32
    assert act[3] == act[4] == image
    names = [layer.name for layer in profile.layers]
    conv1 = names.index("blocks_0_conv1")
    assert profile.cut_bytes[conv1] == act[3] + act[conv1]  # relu (read by the skip) and conv1 (read by relu_1)
    assert profile.cut_bytes[names.index("add")] == act[names.index("add")]  # the diamond closed: one tensor
    timed = [layer for layer in profile.layers if layer.param_bytes > 0]
    assert all(layer.fwd_ms > 0 and layer.bwd_ms > 0 for layer in timed)
    assert profile.layers[0].bwd_ms == 0  # the input has no gradient to compute


def test_the_cut_bytes_of_any_order_are_the_live_sets_of_the_measured_outputs() -> None:
    """Placing the skip branch first makes it cross the cut beside the main branch (core.dag.reorder of the profile)."""
    spec = resolve_module_spec("rescnn", blocks=1, channels=4)
    profile = measure_layers(spec, None, 4, runs=0).to_profile("rescnn")
    order = (0, 1, 2, 3, 7, 4, 5, 6, 8, 9, 10)  # blocks_0_skip before conv1
    chain = reorder(profile, order)
    act = [layer.activation_bytes for layer in profile.layers]
    assert chain.cut_bytes[4] == act[3] + act[7]  # after the skip: relu (read by conv1) and the skip (read by add)
    assert chain.cut_bytes[6] == act[7] + act[5]  # after relu_1: the skip is forwarded beside the main branch


def test_a_graph_profile_at_several_sizes_round_trips_through_its_file(tmp_path: Path) -> None:
    """The profile file of a graph measured at two sizes keeps every layer's inputs and the live-set cut curves."""
    spec = resolve_module_spec("rescnn", blocks=1, channels=4)
    profile = profile_batch_sizes(spec, (2, 4), runs=1, warmup=0)
    assert profile.layer_inputs == spec.layer_inputs
    assert profile.cut_curves is not None and profile.cut_curves[4][0] * 2 == profile.cut_curves[4][1]
    path = tmp_path / "rescnn.json"
    write_profile_json(profile, path)
    back = read_profile_json(path)
    assert back.layer_inputs == profile.layer_inputs and back.cut_bytes == profile.cut_bytes


def test_a_graph_projected_onto_a_gpu_keeps_its_inputs() -> None:
    """`profile --project-to` counts a graph on the meta device and keeps its layer inputs and live-set cuts."""
    from pipeplan.profiler.projection import project_curves

    spec = resolve_module_spec("rescnn", blocks=1, channels=4)
    profile = project_curves("rescnn", {"blocks": "1", "channels": "4"}, "sample", (2, 4), "A100", "fp32", 1.0)
    assert profile.layer_inputs == spec.layer_inputs
    names = [layer.name for layer in profile.layers]
    conv1 = names.index("blocks_0_conv1")
    assert profile.cut_bytes[conv1] == profile.layers[3].activation_bytes + profile.layers[conv1].activation_bytes
