"""profiler.split_timing: a marked zoo block is timed as the runtime runs it split (models.tp_block.shard_block on a
mesh of t, torch's fake process group) at every t dividing its width, and the times land in the profile's tp timed,
one value per batch size; nothing is timed where no block is marked or a process group already exists."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

from pipeplan.core.layer_profile import TensorSplit  # noqa: E402
from pipeplan.models.zoo.charlm import charlm  # noqa: E402
from pipeplan.profiler import split_timing  # noqa: E402
from pipeplan.profiler.curves import profile_batch_sizes  # noqa: E402
from pipeplan.profiler.measure import measure_layers  # noqa: E402

pytestmark = pytest.mark.torch


def chain() -> list[nn.Module]:
    """An embedding, an encoder block of 4 heads and 32 hidden units (width 4: t = 2 and 4), and a head."""
    torch.manual_seed(0)
    return [nn.Embedding(10, 24), nn.TransformerEncoderLayer(24, 4, 32, dropout=0.0, batch_first=True), nn.Linear(24, 10)]


@pytest.mark.slow  # DTensor's first sharded run in a process takes seconds
def test_a_block_is_timed_split_by_the_runtimes_code_at_every_degree_its_width_allows(monkeypatch: pytest.MonkeyPatch) -> None:
    """measure_layers runs shard_block for the block at t = 2 and t = 4, each on a mesh of t devices, and its profile
    carries both timings (positive, one value); the embedding and the head are neither marked nor timed."""
    seen: list[tuple[int, int]] = []
    real = split_timing.shard_block

    def spy(dense: nn.TransformerEncoderLayer, causal: bool, tp: int, mesh, device, training) -> nn.Module:
        seen.append((tp, mesh.size()))
        return real(dense, causal, tp, mesh, device, training)

    monkeypatch.setattr(split_timing, "shard_block", spy)
    layers = chain()
    measured = measure_layers(layers, torch.randint(0, 10, (2, 5)), 2, runs=2, warmup=1, whole=False)
    assert seen == [(2, 2), (4, 4)]
    profile = measured.to_profile("m")
    block = profile.layers[1].tp
    assert block is not None and [x.tp for x in block.timed] == [2, 4]
    assert all(len(x.fwd_ms) == 1 and x.fwd_ms[0] > 0 and x.bwd_ms[0] > 0 for x in block.timed)
    assert profile.layers[0].tp is None and profile.layers[2].tp is None
    # norm_bytes: one LayerNorm's weight and bias, 24 float32 elements each (what sequence parallelism all-reduces)
    assert block == TensorSplit("block", 4, timed=block.timed, norm_bytes=2 * 24 * 4)
    assert not dist.is_initialized()  # the fake group is gone again


@pytest.mark.slow
def test_a_profile_over_several_sizes_has_one_split_time_per_size() -> None:
    """charlm (2 heads, ffn 64: width 2) profiled at sizes 1 and 2: each block's tp timed holds t = 2 with 2 values."""
    spec = charlm(d_model=16, heads=2, layers=2, seq_len=4)
    profile = profile_batch_sizes(spec, (1, 2), runs=1, warmup=1)
    blocks = [layer.tp for layer in profile.layers if layer.tp is not None]
    assert len(blocks) == 2
    assert all([x.tp for x in b.timed] == [2] and len(b.timed[0].fwd_ms) == 2 for b in blocks)


def test_nothing_is_timed_without_a_marked_block_or_beside_an_existing_process_group() -> None:
    """time_splits gives None for a chain with no split, and for a marked chain in a process that has a group."""
    layers = chain()
    x, grad = torch.randint(0, 10, (2, 5)), torch.randn(2, 5, 10)
    none, dense = (None, None, None), ([1.0] * 3, [2.0] * 3)
    assert split_timing.time_splits(layers, none, x, grad, lambda: None, None, 1, 1, dense) is None
    marked = (None, TensorSplit("block", 4), None)
    dist.init_process_group("fake", store=dist.HashStore(), rank=0, world_size=1)
    try:
        assert split_timing.time_splits(layers, marked, x, grad, lambda: None, None, 1, 1, dense) is None
    finally:
        dist.destroy_process_group()


def test_a_split_time_is_the_profiles_dense_time_times_the_measured_ratio(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the split over dense ratios fixed (forward 1.5 at t = 2 and 1.25 at t = 4, backward 2 and 3), the
    profile's timed values are its own dense medians times them, exactly."""
    fixed = {2: (1.5, 2.0), 4: (1.25, 3.0)}
    monkeypatch.setattr(split_timing, "_ratios", lambda layers, chosen, t, *rest: {1: fixed[t]})
    profile = measure_layers(chain(), torch.randint(0, 10, (2, 5)), 2, runs=2, warmup=0, whole=False).to_profile("m")
    block = profile.layers[1]
    assert block.tp is not None
    assert [(x.tp, x.fwd_ms, x.bwd_ms) for x in block.tp.timed] == [
        (t, (block.fwd_ms * f,), (block.bwd_ms * b,)) for t, (f, b) in fixed.items()
    ]
