"""Timeline PNG: one row per rank, one box per compute action, transfers in a thin row below.

Note: boxes are drawn as one PolyCollection per colour, not one patch per
action, so a 1f1b schedule with p=64, m=1024 (131,072 boxes) renders in
seconds; labels are drawn only where they fit, and not at all past
`_MAX_LABELS`, since thousands of text objects dominate the render time.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.collections import PolyCollection
from matplotlib.colors import to_rgb
from matplotlib.patches import Patch

from pipeplan.sim.result import ComputeSpan, SimResult, TransferSpan

OP_COLORS = {"F": "#0072B2", "B": "#D55E00", "I": "#E69F00", "W": "#009E73", "U": "#CC79A7"}
"""Okabe-Ito colours (readable with every common colour-vision deficiency)."""
OP_NAMES = {"F": "F forward", "B": "B backward", "I": "I backward (input)", "W": "W backward (weights)", "U": "U optimizer"}
TRANSFER_COLORS = {"act": "#56B4E9", "grad": "#F0A070"}
IDLE_COLOR = "#E4E4E4"

_DPI = 120
_COMPUTE_H = 0.8  # height of a rank's compute row (row pitch is 1 without transfers)
_TRANSFER_H = 0.3  # height of the transfer sub-row (act upper half, grad lower half)
_GAP = 0.25
_LABEL_PT = 7.0
_MAX_LABELS = 5000
_MIN_W_IN, _MAX_W_IN = 8.0, 32.0
_MAX_H_IN = 30.0


def _shade(color: str, chunk: int, chunks: int) -> tuple[float, float, float]:
    """The op colour darkened for later chunks of a rank (interleaved schedules)."""
    r, g, b = to_rgb(color)
    k = 0.45 * chunk / (chunks - 1) if chunks > 1 else 0.0
    return (r * (1 - k), g * (1 - k), b * (1 - k))


def _text_color(rgb: tuple[float, float, float]) -> str:
    """Black or white, whichever reads better on rgb."""
    luminance = 0.2126 * rgb[0] + 0.7152 * rgb[1] + 0.0722 * rgb[2]
    return "black" if luminance > 0.5 else "white"


def figure_size(num_ranks: int, max_actions: int, pitch: float) -> tuple[float, float]:
    """Width grows with the busiest rank's action count, height with the ranks; both capped."""
    width = min(max(_MIN_W_IN, 2.0 + 0.3 * max_actions), _MAX_W_IN)
    height = min(1.6 + 0.5 * num_ranks * pitch, _MAX_H_IN)
    return width, height


def _rank_chunks(spans: Sequence[ComputeSpan]) -> dict[tuple[int, int], tuple[int, int]]:
    """(rank, stage) -> (chunk index on that rank, chunks on that rank)."""
    stages: dict[int, set[int]] = {}
    for span in spans:
        stages.setdefault(span.rank, set()).add(span.stage)
    out = {}
    for rank, held in stages.items():
        ordered = sorted(held)
        for i, stage in enumerate(ordered):
            out[(rank, stage)] = (i, len(ordered))
    return out


def _boxes(x0: np.ndarray, x1: np.ndarray, y0: np.ndarray, h: float) -> np.ndarray:
    """Rectangles as an (n, 4, 2) vertex array, the form PolyCollection builds fastest."""
    verts = np.empty((len(x0), 4, 2))
    verts[:, 0, 0] = verts[:, 3, 0] = x0
    verts[:, 1, 0] = verts[:, 2, 0] = x1
    verts[:, 0, 1] = verts[:, 1, 1] = y0
    verts[:, 2, 1] = verts[:, 3, 1] = y0 + h
    return verts


def _draw_compute(ax: Axes, spans: Sequence[ComputeSpan], row_base: np.ndarray, px_per_ms: float) -> bool:
    """Draw one box per action, coloured by op (shaded by chunk), labelled with its microbatch where it fits.

    Returns whether some rank holds several stages (chunks).
    """
    chunks = _rank_chunks(spans)
    rank = np.fromiter((s.rank for s in spans), dtype=np.int64, count=len(spans))
    start = np.fromiter((s.start_ms for s in spans), dtype=float, count=len(spans))
    stop = np.fromiter((s.end_ms for s in spans), dtype=float, count=len(spans))
    y0 = row_base[rank]
    width_px = (stop - start) * px_per_ms
    groups: dict[tuple[str, int, int], list[int]] = {}
    for i, span in enumerate(spans):
        groups.setdefault((span.op, *chunks[(span.rank, span.stage)]), []).append(i)
    colors = {key: _shade(OP_COLORS[key[0]], key[1], key[2]) for key in groups}
    for key in sorted(groups, key=lambda k: ("FBIWU".index(k[0]), k[1], k[2])):
        idx = np.asarray(groups[key])
        # A white edge separates neighbouring boxes, but would whiten boxes only a few pixels wide.
        edges = np.where(width_px[idx] >= 6, 0.6, 0.0)
        boxes = _boxes(start[idx], stop[idx], y0[idx], _COMPUTE_H)
        ax.add_collection(PolyCollection(boxes, facecolors=[colors[key]], edgecolors="white", linewidths=edges, zorder=2))
    digits = np.fromiter((len(str(s.microbatch)) for s in spans), dtype=float, count=len(spans))
    fits = np.flatnonzero(width_px >= digits * _LABEL_PT * 0.62 * _DPI / 72 + 3)
    if len(fits) <= _MAX_LABELS:
        for i in fits:
            span = spans[i]
            color = colors[(span.op, *chunks[(span.rank, span.stage)])]
            x, y = (start[i] + stop[i]) / 2, y0[i] + _COMPUTE_H / 2
            ax.text(x, y, str(span.microbatch), ha="center", va="center", fontsize=_LABEL_PT, color=_text_color(color), zorder=3)
    return any(n > 1 for _, n in chunks.values())


def _draw_transfers(ax: Axes, transfers: Sequence[TransferSpan], row_base: np.ndarray) -> None:
    """Draw each transfer in its sender's sub-row: activations in the upper half, gradients in the lower."""
    for kind, offset in (("act", _TRANSFER_H / 2), ("grad", 0.0)):
        chosen = [t for t in transfers if t.kind == kind]
        if not chosen:
            continue
        src = np.fromiter((t.src_rank for t in chosen), dtype=np.int64, count=len(chosen))
        start = np.fromiter((t.start_ms for t in chosen), dtype=float, count=len(chosen))
        stop = np.fromiter((t.end_ms for t in chosen), dtype=float, count=len(chosen))
        boxes = _boxes(start, stop, row_base[src] - _TRANSFER_H - 0.04 + offset, _TRANSFER_H / 2)
        ax.add_collection(PolyCollection(boxes, facecolors=TRANSFER_COLORS[kind], edgecolors="none", zorder=2))


def render_gantt(result: SimResult, path: str, title: str = "", show_transfers: bool = True) -> None:
    """Write a PNG Gantt chart of the simulated iteration to `path`.

    Args:
        result: a SimResult recorded with its timeline (`record=True`).
        path: the PNG file to write.
        title: first title line; defaults to the schedule name. A second line gives
            iteration time, bubble and efficiency.
        show_transfers: add a thin row under each rank with the transfers it sends
            (activations upper half, gradients lower half); skipped when no
            transfer takes time.
    """
    spans = result.compute
    num_ranks = max(len(result.per_rank), 1 + max((s.rank for s in spans), default=-1), 1)
    transfers = [t for t in result.transfers if t.end_ms > t.start_ms] if show_transfers else []
    pitch = _COMPUTE_H + _GAP + (_TRANSFER_H if transfers else 0.0)
    per_rank = np.bincount(np.fromiter((s.rank for s in spans), dtype=np.int64, count=len(spans)), minlength=num_ranks)
    width_in, height_in = figure_size(num_ranks, int(per_rank.max(initial=0)), pitch)
    end = max(result.iteration_time, max((s.end_ms for s in spans), default=0.0))
    end = max(end, max((t.end_ms for t in transfers), default=0.0))
    x_max = end * 1.01 if end > 0 else 1.0

    fig, ax = plt.subplots(figsize=(width_in, height_in), dpi=_DPI)
    left, right = 0.8 / width_in, 1.0 - 0.25 / width_in
    fig.subplots_adjust(left=left, right=right, top=1.0 - 0.75 / height_in, bottom=1.05 / height_in)
    # y of the bottom of each rank's compute row; rank 0 on top.
    row_base = (num_ranks - 1 - np.arange(num_ranks)) * pitch + (_TRANSFER_H if transfers else 0.0)

    # Idle: a grey band under every compute row; boxes cover the busy parts.
    idle = _boxes(np.zeros(num_ranks), np.full(num_ranks, end), row_base, _COMPUTE_H)
    ax.add_collection(PolyCollection(idle, facecolors=IDLE_COLOR, edgecolors="none", zorder=1))
    multi_chunk = _draw_compute(ax, spans, row_base, width_in * (right - left) * _DPI / x_max)
    _draw_transfers(ax, transfers, row_base)

    ax.set_xlim(0.0, x_max)
    ax.set_ylim(-_GAP / 2 - 0.05, num_ranks * pitch - _GAP / 2)
    ax.set_yticks(list(row_base + _COMPUTE_H / 2))
    rank_fontsize = 9 if num_ranks <= 32 else 6
    ax.set_yticklabels([f"rank {r}" for r in range(num_ranks)], fontsize=rank_fontsize)
    ax.tick_params(axis="y", length=0)
    ax.set_xlabel("time (ms)")
    ax.grid(axis="x", color="#BBBBBB", linewidth=0.5, linestyle=":", zorder=0)
    ax.set_axisbelow(True)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)

    name = title or result.schedule_name or "schedule"
    ax.set_title(
        f"{name}\niteration {result.iteration_time:.4g} ms, bubble {result.bubble_fraction:.1%}, "
        f"efficiency {result.efficiency:.1%}",
        fontsize=10,
    )
    ops = sorted({s.op for s in spans}, key="FBIWU".index)
    handles = [Patch(facecolor=OP_COLORS[op], label=OP_NAMES[op]) for op in ops]
    handles.append(Patch(facecolor=IDLE_COLOR, label="idle"))
    kinds = {t.kind for t in transfers}
    handles += [Patch(facecolor=TRANSFER_COLORS[k], label=f"{k} send") for k in ("act", "grad") if k in kinds]
    fig.legend(
        handles=handles,
        loc="lower center",
        ncol=len(handles),
        fontsize=8,
        frameon=False,
        title="darker shade = later chunk on the rank; numbers = microbatch" if multi_chunk else "numbers = microbatch",
        title_fontsize=8,
    )
    from pipeplan.io.atomic import atomic_output
    from pipeplan.io.file_kinds import PNG

    try:
        with atomic_output(path, binary=True, kind=PNG) as handle:
            fig.savefig(handle, format="png", dpi=_DPI, metadata={"Software": None})
    finally:
        plt.close(fig)
