"""A cluster's bandwidth matrix as an annotated heat map PNG (log colour scale, node borders)."""

from __future__ import annotations

from pathlib import Path

from pipeplan.core.hardware.cluster import Cluster
from pipeplan.core.units import bytes_per_s_to_gb_per_s
from pipeplan.io.atomic import atomic_output
from pipeplan.io.file_kinds import PNG
from pipeplan.viz.inventory import MATRIX_MAX_DEVICES


def draw_bandwidth_heatmap(cluster: Cluster, path: Path) -> None:
    """Write the bandwidth matrix as an annotated heat map (log colour scale, diagonal blank, node borders)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import LogNorm

    n = cluster.num_devices
    gb = bytes_per_s_to_gb_per_s(cluster.bandwidth_bytes_per_s.dense())
    np.fill_diagonal(gb, np.nan)
    masked = np.ma.masked_invalid(np.where(gb > 0, gb, np.nan))
    size = min(12.0, max(5.0, 0.55 * n + 2.0))
    fig, ax = plt.subplots(figsize=(size + 1.5, size))
    cmap = plt.get_cmap("viridis").with_extremes(bad="#dddddd")
    positive = gb[np.isfinite(gb) & (gb > 0)]
    low, high = (float(positive.min()), float(positive.max())) if positive.size else (1.0, 1.0)
    norm = LogNorm(vmin=low, vmax=high) if high > low else None
    image = ax.imshow(masked, cmap=cmap, norm=norm, interpolation="nearest")
    colorbar = fig.colorbar(image, ax=ax, label="GB/s (log scale)" if norm else "GB/s", shrink=0.8)
    levels = sorted(set(positive.tolist()))
    if len(levels) <= 8:
        # Label the rates that occur rather than powers of ten.
        colorbar.set_ticks(levels, labels=[f"{v:g}" for v in levels])
        colorbar.ax.minorticks_off()
    if n <= MATRIX_MAX_DEVICES:
        for a in range(n):
            for b in range(n):
                if a != b:
                    value = gb[a, b]
                    dark = norm is not None and norm(value) > 0.6 if value > 0 else False
                    ax.text(b, a, f"{value:g}", ha="center", va="center", fontsize=8, color="black" if dark else "white")
        ax.set_xticks(range(n))
        ax.set_yticks(range(n))
    for boundary in _node_boundaries(cluster):
        ax.axhline(boundary - 0.5, color="white", linewidth=1.5)
        ax.axvline(boundary - 0.5, color="white", linewidth=1.5)
    nic = "" if cluster.nic_bytes_per_s is None else f"; NIC {bytes_per_s_to_gb_per_s(cluster.nic_bytes_per_s):g} GB/s per node"
    ax.set_title(f"{cluster.name}: bandwidth GB/s, sender row -> receiver column{nic}", fontsize=10)
    ax.set_xlabel("receiver device")
    ax.set_ylabel("sender device")
    fig.tight_layout()
    try:
        with atomic_output(path, binary=True, kind=PNG) as handle:
            fig.savefig(handle, format="png", dpi=110)
    finally:
        plt.close(fig)


def _node_boundaries(cluster: Cluster) -> list[int]:
    """Device ids where a new node starts (drawn as lines; skipped when there are too many to see)."""
    starts = [d.id for d in cluster.devices[1:] if d.node != cluster.devices[d.id - 1].node]
    return starts if len(starts) <= 64 else []
