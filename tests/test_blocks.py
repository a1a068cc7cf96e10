"""Tests of the planner's blocks: contiguous runs of layers the partition DP treats as one."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeplan.core.profile import LayerProfile, ModelProfile
from pipeplan.planner.search.blocks import make_blocks
from pipeplan.presets.resolve import load_profile


def profile_of(layers: list[tuple[float, float, float]]) -> ModelProfile:
    """A profile from (fwd+bwd ms, cut bytes, param bytes) per layer (backward twice the forward)."""
    return ModelProfile("p", 1, tuple(LayerProfile(f"l{i}", t / 3, 2 * t / 3, c, q) for i, (t, c, q) in enumerate(layers)))


def test_few_layers_are_one_block_each() -> None:
    """With at most max_blocks layers every layer is its own block."""
    assert make_blocks(profile_of([(1.0, 1.0, 1.0)] * 5), 8) == tuple((i, i) for i in range(5))


@settings(max_examples=60, deadline=None)
@given(
    layers=st.lists(
        st.tuples(st.floats(0.0, 10.0), st.floats(0.0, 1e9), st.floats(0.0, 1e9)),
        min_size=1,
        max_size=120,
    ),
    max_blocks=st.integers(1, 40),
)
def test_blocks_cover_every_layer_once_in_order(layers: list[tuple[float, float, float]], max_blocks: int) -> None:
    """Any profile: at most max_blocks non-empty blocks (or one per layer), contiguous from layer 0 to the last."""
    blocks = make_blocks(profile_of(layers), max_blocks)
    assert len(blocks) <= max(max_blocks, 1) or len(blocks) == len(layers)
    assert blocks[0][0] == 0 and blocks[-1][1] == len(layers) - 1
    for (a, b), (c, _) in itertools.pairwise(blocks):
        assert a <= b and c == b + 1
    assert all(a <= b for a, b in blocks)


def test_a_weight_heavy_light_compute_layer_gets_a_block_of_its_own() -> None:
    """An embedding (half the weights, almost no compute) first: blocks split by compute alone would bury it in the
    first block with 1/8 of the compute; by compute and weights it stands alone, so the DP can give it a stage."""
    layers = [(0.01, 1e6, 8e9)] + [(1.0, 1e6, 1e8)] * 79 + [(0.01, 1e6, 0.0)]
    blocks = make_blocks(profile_of(layers), 8)
    assert blocks[0] == (0, 0)


def test_gnmt32_embeddings_stand_alone_in_32_blocks() -> None:
    """dapple/gnmt-32 (192 layers): its first and last layers (embedding, projection) are blocks of their own."""
    blocks = make_blocks(load_profile("dapple/gnmt-32"), 32)
    assert len(blocks) <= 32
    assert blocks[0] == (0, 0) and blocks[-1] == (191, 191)
