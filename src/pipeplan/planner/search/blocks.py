"""Blocks: runs of consecutive layers the partition DP treats as one, so very deep profiles stay fast."""

from __future__ import annotations

from pipeplan.core.partition import quantile_ends
from pipeplan.core.profile import ModelProfile

MAX_BLOCKS = 64
"""The DP cuts only between blocks; boundary refinement later moves cuts to any layer."""


def make_blocks(profile: ModelProfile, max_blocks: int = MAX_BLOCKS) -> tuple[tuple[int, int], ...]:
    """Split the layers into at most `max_blocks` runs of about equal compute plus weights, cut where little data crosses.

    Each block is (first_layer, last_layer). With few layers every layer is a
    block. Otherwise the cut nearest each compute quantile is moved, within
    half a block's width, to the layer boundary with the smallest cut_bytes
    (ties: the nearest), so the DP sees the model's natural cut points.
    """
    n = profile.num_layers
    if n <= max_blocks:
        return tuple((i, i) for i in range(n))
    work = [layer.fwd_ms + layer.bwd_ms for layer in profile.layers]
    params = [layer.param_bytes for layer in profile.layers]
    total_work, total_params = sum(work), sum(params)
    if total_work > 0 and total_params > 0:
        # equal shares of compute and of weights: a layer heavy in weights but light in compute (an embedding)
        # gets a block of its own, so the DP can give its all-reduce a stage of its own
        work = [w / total_work + q / total_params for w, q in zip(work, params, strict=True)]
    cuts = profile.cut_bytes or ()
    window = max(1, n // (2 * max_blocks))
    chosen: list[int] = []  # a cut after layer c
    for target in quantile_ends(work, max_blocks):
        c = min(target, n - 2)
        low = max(chosen[-1] + 1 if chosen else 0, c - window)
        high = min(n - 2, c + window)
        if low > high:
            continue
        best = min(range(low, high + 1), key=lambda i: (cuts[i], abs(i - c), i))
        chosen.append(best)
    blocks = []
    first = 0
    for c in chosen:
        blocks.append((first, c))
        first = c + 1
    blocks.append((first, n - 1))
    return tuple(blocks)
