"""Layer groups for the DP baselines: consecutive layers merged into blocks of about equal compute."""

from __future__ import annotations

from dataclasses import dataclass

from pipeplan.core.partition import quantile_starts
from pipeplan.core.profile import LayerProfile, ModelProfile, SharedGroup
from pipeplan.core.shared_params import span_overlap_bytes


@dataclass(frozen=True, slots=True)
class Blocks:
    """A profile whose consecutive layers were merged into blocks, and where each block starts.

    `starts[b]` is the first original layer of block b; block b ends just
    before `starts[b + 1]` (or at the last layer).
    """

    profile: ModelProfile
    starts: tuple[int, ...]
    num_layers: int

    def layer_range(self, first_block: int, last_block: int) -> tuple[int, int]:
        """Original (first_layer, last_layer) covered by blocks first_block..last_block."""
        end = self.starts[last_block + 1] - 1 if last_block + 1 < len(self.starts) else self.num_layers - 1
        return self.starts[first_block], end


def merge_layers(profile: ModelProfile, max_blocks: int) -> Blocks:
    """Group consecutive layers into at most `max_blocks` blocks of about equal fwd+bwd time.

    A profile with at most `max_blocks` layers is returned as it is (one
    layer per block). Cuts fall as core.partition.quantile_starts puts them (the
    running compute reaching each multiple of total / max_blocks).

    Note:
        The DP baselines (DAPPLE, PipeDream) are cubic or worse in the number
        of layers; profiles of hundreds of layers (nasnet, densenet) are
        planned over blocks. A stage boundary can then only fall between blocks.
    """
    n = profile.num_layers
    starts = quantile_starts([layer.fwd_ms + layer.bwd_ms for layer in profile.layers], max_blocks)
    if n <= max_blocks:
        return Blocks(profile, tuple(starts), n)
    layers = []
    for b, first in enumerate(starts):
        last = starts[b + 1] - 1 if b + 1 < len(starts) else n - 1
        group = profile.layers[first : last + 1]
        layers.append(
            LayerProfile(
                name=group[0].name if len(group) == 1 else f"{group[0].name}..{group[-1].name}",
                fwd_ms=sum(layer.fwd_ms for layer in group),
                bwd_ms=sum(layer.bwd_ms for layer in group),
                activation_bytes=group[-1].activation_bytes,
                param_bytes=sum(layer.param_bytes for layer in group) - span_overlap_bytes(profile.shared_params, first, last),
                saved_bytes=sum(layer.saved_bytes or 0.0 for layer in group) - sum(layer.shared_bytes for layer in group[1:]),
                shared_bytes=group[0].shared_bytes,
            )
        )
    cuts = tuple(profile.cut_bytes[starts[b + 1] - 1] for b in range(len(starts) - 1))  # type: ignore[index]
    block_of = [b for b, first in enumerate(starts) for _ in range(first, starts[b + 1] if b + 1 < len(starts) else n)]
    groups = []
    for g in profile.shared_params:  # a parameter held by layers in two or more blocks: shared by those blocks
        holders = tuple(sorted({block_of[u] for u in g.layers}))
        if len(holders) > 1:
            groups.append(SharedGroup(g.name, holders, g.param_bytes))
    merged = ModelProfile(
        profile.name,
        profile.batch_size,
        tuple(layers),
        profile.reference_device,
        cuts,
        profile.measured,
        shared_params=tuple(groups),
    )
    return Blocks(merged, tuple(starts), n)
