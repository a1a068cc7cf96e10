"""The `pipeplan show` commands: a profile or a cluster as tables, JSON or a bandwidth heat map."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich import box
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from pipeplan.core.cluster import Cluster
    from pipeplan.core.profile import ModelProfile

show_app = typer.Typer(
    name="show",
    help="Show a model profile or a cluster (a built-in name or a file), or list the built-ins.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

MATRIX_MAX_DEVICES = 16
"""Up to this many devices the table and heat map print every pair's value."""


@show_app.command("profile")
def show_profile(
    spec: str = typer.Argument(..., help="Built-in name (see `pipeplan show profiles`), a .json profile or a graph.txt file."),
    as_json: bool = typer.Option(False, "--json", help="Print the profile as pipeplan.profile/1 JSON."),
    profile_batch_size: int | None = typer.Option(
        None, "--profile-batch-size", help="Batch the graph.txt was measured with, when its name has no -pbs-N."
    ),
) -> None:
    """Per-layer costs of a model: times (ms), activation, parameter and cut sizes."""
    from pipeplan.presets.resolve import load_profile

    profile = load_profile(spec, profile_batch_size)
    if as_json:
        from pipeplan.io.profile_json import profile_to_json

        write_json(profile_to_json(profile))
        return
    console = Console(width=max(Console().width, 120))
    console.print(profile_summary(profile))
    console.print(profile_layers_table(profile))


@show_app.command("cluster")
def show_cluster(
    spec: str = typer.Argument(..., help="Built-in name (see `pipeplan show clusters`) or a .json cluster file."),
    as_json: bool = typer.Option(False, "--json", help="Print the cluster in matrix form (GB/s, us, GiB)."),
    png: str | None = typer.Option(None, "--png", help="Write the bandwidth matrix as a heat map PNG."),
) -> None:
    """Devices of a cluster and the bandwidth and latency between them."""
    from pipeplan.cli.outputs import IMAGE_SUFFIXES, Output, check_outputs
    from pipeplan.presets.resolve import load_cluster

    check_outputs([Output("--png", png, IMAGE_SUFFIXES)], {"CLUSTER": spec})
    cluster = load_cluster(spec)
    if png is not None:
        draw_bandwidth_heatmap(cluster, Path(png))
    if as_json:
        from pipeplan.io.cluster_json import cluster_to_json

        write_json(cluster_to_json(cluster))
        return
    console = Console(width=max(Console().width, 120))
    console.print(devices_table(cluster))
    console.print(link_classes_table(cluster))
    if cluster.num_devices <= MATRIX_MAX_DEVICES:
        console.print(bandwidth_matrix_table(cluster))
    if png is not None:
        console.print(f"wrote {png}")


@show_app.command("profiles")
def show_profiles(as_json: bool = typer.Option(False, "--json", help="Print the list as JSON.")) -> None:
    """List the built-in profiles with their sizes and totals."""
    from pipeplan.presets.resolve import list_profiles, load_profile

    rows = []
    for name in list_profiles():
        p = load_profile(name)
        rows.append(
            {
                "name": name,
                "batch_size": p.batch_size,
                "layers": p.num_layers,
                "fwd_ms": round(p.total_fwd_ms, 6),
                "bwd_ms": round(p.total_bwd_ms, 6),
                "param_bytes": int(p.total_param_bytes),
                "reference_device": p.reference_device,
            }
        )
    if as_json:
        write_json({"profiles": rows})
        return
    table = Table(title="built-in profiles (pipeplan show profile NAME)", title_justify="left", box=box.SIMPLE)
    for header in ("name", "batch", "layers", "fwd ms", "bwd ms", "params", "measured on"):
        table.add_column(header, justify="left" if header in ("name", "measured on") else "right")
    for row in rows:
        table.add_row(
            row["name"], str(row["batch_size"]), str(row["layers"]), f"{row['fwd_ms']:.2f}", f"{row['bwd_ms']:.2f}",
            fmt_bytes(row["param_bytes"]), row["reference_device"],
        )  # fmt: skip
    Console(width=max(Console().width, 100)).print(table)


@show_app.command("clusters")
def show_clusters(as_json: bool = typer.Option(False, "--json", help="Print the list as JSON.")) -> None:
    """List the built-in clusters."""
    from pipeplan.presets.clusters import CLUSTER_BUILDERS
    from pipeplan.presets.resolve import list_clusters, load_cluster

    rows = []
    for name in list_clusters():
        c = load_cluster(name)
        kinds = Counter(d.kind for d in c.devices)
        rows.append(
            {
                "name": name,
                "devices": c.num_devices,
                "nodes": c.num_nodes,
                "kinds": dict(sorted(kinds.items())),
                "nic_gb_per_s": None if c.nic_bandwidth is None else c.nic_bandwidth / 1e9,
                "notes": CLUSTER_BUILDERS[name]().get("notes", ""),
            }
        )
    if as_json:
        write_json({"clusters": rows})
        return
    table = Table(title="built-in clusters (pipeplan show cluster NAME)", title_justify="left", box=box.SIMPLE)
    for header in ("name", "devices", "nodes", "kinds", "NIC GB/s", "notes"):
        table.add_column(header, justify="right" if header in ("devices", "nodes", "NIC GB/s") else "left")
    for row in rows:
        kinds = ", ".join(f"{n} {k}" for k, n in row["kinds"].items())
        nic = "-" if row["nic_gb_per_s"] is None else f"{row['nic_gb_per_s']:g}"
        table.add_row(row["name"], str(row["devices"]), str(row["nodes"]), kinds, nic, row["notes"])
    Console(width=max(Console().width, 140)).print(table)


def profile_summary(profile: ModelProfile) -> Table:
    """Name, batch, reference device and totals of a profile."""
    table = Table(title=f"profile {profile.name}", show_header=False, title_justify="left", box=box.SIMPLE)
    table.add_column("quantity")
    table.add_column("value", justify="right")
    table.add_row("batch size (samples)", str(profile.batch_size))
    if profile.batch_sizes is not None and len(profile.batch_sizes) > 1:
        table.add_row("measured at batch sizes", ", ".join(map(str, profile.batch_sizes)))
    table.add_row("reference device", profile.reference_device + ("" if profile.measured else " (projected)"))
    if profile.threads is not None:
        table.add_row("CPU threads", str(profile.threads))
    if profile.source is not None:
        options = "".join(f" --opt {k}={v}" for k, v in profile.source.options)
        table.add_row("model", f"{profile.source.module}{options} (dataset {profile.source.dataset})")
    table.add_row("layers", str(profile.num_layers))
    table.add_row("forward (ms)", f"{profile.total_fwd_ms:.3f}")
    table.add_row("backward (ms)", f"{profile.total_bwd_ms:.3f}")
    steps = {name for layer in profile.layers for name, _ in layer.optimizer_ms}
    for name in sorted(steps):
        total = sum(layer.optimizer_step_ms(name) or 0.0 for layer in profile.layers)
        table.add_row(f"{name} step (ms)", f"{total:.3f}")
    table.add_row("parameters", fmt_bytes(profile.total_param_bytes))
    table.add_row("largest cut", fmt_bytes(max(profile.cut_bytes or (0.0,))))
    return table


def profile_layers_table(profile: ModelProfile) -> Table:
    """One row per layer; `cut after` is what crosses a stage boundary placed after the layer."""
    table = Table(box=box.SIMPLE)
    for header in ("#", "layer", "fwd ms", "bwd ms", "activation", "saved", "params", "cut after"):
        table.add_column(header, justify="left" if header == "layer" else "right", overflow="ellipsis", no_wrap=True)
    cuts = profile.cut_bytes or ()
    for i, layer in enumerate(profile.layers):
        table.add_row(
            str(i), layer.name[:60], f"{layer.fwd_ms:.3f}", f"{layer.bwd_ms:.3f}", fmt_bytes(layer.activation_bytes),
            fmt_bytes(layer.saved_bytes or 0.0), fmt_bytes(layer.param_bytes), fmt_bytes(cuts[i]) if i < len(cuts) else "-",
        )  # fmt: skip
    return table


def devices_table(cluster: Cluster) -> Table:
    """Devices grouped by runs of nodes with the same composition (1024 GPUs fit in a few rows)."""
    table = Table(
        title=f"cluster {cluster.name}: {cluster.num_devices} devices on {cluster.num_nodes} nodes",
        title_justify="left",
        box=box.SIMPLE,
    )
    for header in ("nodes", "devices", "per node", "kind", "memory", "speed"):
        table.add_column(header, justify="left" if header in ("nodes", "devices", "kind") else "right")
    groups: list[tuple[list[int], list[int], tuple[tuple[str, float, float], ...]]] = []
    by_node: dict[int, list[int]] = {}
    for device in cluster.devices:
        by_node.setdefault(device.node, []).append(device.id)
    for node, ids in sorted(by_node.items()):
        shape = tuple((cluster.devices[i].kind, cluster.devices[i].memory_bytes, cluster.devices[i].speed) for i in ids)
        if groups and groups[-1][2] == shape and groups[-1][0][-1] == node - 1 and groups[-1][1][-1] == ids[0] - 1:
            groups[-1][0].append(node)
            groups[-1][1].extend(ids)
        else:
            groups.append(([node], list(ids), shape))
    for nodes, ids, shape in groups:
        # The group's nodes share `shape`, so the device at position j of ids sits at position j % len(shape) of its node.
        for key in sorted(set(shape)):
            mine = [i for j, i in enumerate(ids) if shape[j % len(shape)] == key]
            kind, memory, speed = key
            table.add_row(_span(nodes), _span(mine), str(shape.count(key)), kind, fmt_bytes(memory), f"{speed:g}")
    return table


def link_classes(cluster: Cluster) -> tuple[Counter[tuple[bool, float, float]], dict[tuple[bool, float, float], tuple[int, int]]]:
    """Ordered pairs per (same node?, bytes/s, s) link class, and the first pair (a, b) of each class."""
    import numpy as np

    from pipeplan.core.links import NodeLinks

    classes: Counter[tuple[bool, float, float]] = Counter()
    example: dict[tuple[bool, float, float], tuple[int, int]] = {}
    nodes = np.array([d.node for d in cluster.devices])
    bandwidth, latency = cluster.bandwidth, cluster.latency
    if isinstance(bandwidth, NodeLinks) and isinstance(latency, NodeLinks) and np.array_equal(bandwidth.nodes, nodes):
        # by structure: the overridden pairs one by one, every other pair by its kind (no n x n pass)
        special = sorted({*map(int, bandwidth.keys), *map(int, latency.keys)})
        n = cluster.num_devices
        for key in special:
            a, b = divmod(key, n)
            pair_class = (bool(nodes[a] == nodes[b]), bandwidth.at(a, b), latency.at(a, b))
            classes[pair_class] += 1
        counts = np.bincount(nodes)
        within = int((counts * (counts - 1)).sum())
        plain = {True: within, False: n * (n - 1) - within}
        for key in special:
            plain[bool(nodes[key // n] == nodes[key % n])] -= 1
        for same, kind in ((True, (bandwidth.intra, latency.intra)), (False, (bandwidth.inter, latency.inter))):
            if plain[same]:
                classes[(same, *kind)] += plain[same]
        for pair_class in classes:
            same, bw, lat = pair_class
            for a in range(n):  # the class's first pair in row order
                match = (bandwidth[a] == bw) & (latency[a] == lat) & ((nodes == nodes[a]) == same)
                match[a] = False
                if match.any():
                    example[pair_class] = (a, int(np.argmax(match)))
                    break
        return classes, example
    bw_all, lat_all = bandwidth.dense(), latency.dense()
    for a in range(cluster.num_devices):
        same_row = nodes == nodes[a]
        for b, (bw, lat, same) in enumerate(zip(bw_all[a].tolist(), lat_all[a].tolist(), same_row.tolist(), strict=True)):
            if a != b:
                key = (same, bw, lat)
                classes[key] += 1
                example.setdefault(key, (a, b))
    return classes, example


def link_classes_table(cluster: Cluster) -> Table:
    """Distinct (bandwidth, latency, same node?) link classes with their ordered-pair counts."""
    classes, example = link_classes(cluster)
    nic = "no NIC limit" if cluster.nic_bandwidth is None else f"NIC {cluster.nic_bandwidth / 1e9:g} GB/s per node, shared"
    table = Table(title="links (ordered pairs)", caption=nic, caption_justify="left", title_justify="left", box=box.SIMPLE)
    for header in ("where", "GB/s", "latency us", "pairs", "e.g."):
        table.add_column(header, justify="left" if header in ("where", "e.g.") else "right")
    for key in sorted(classes, key=lambda k: (not k[0], -k[1], k[2])):
        same, bw, lat = key
        a, b = example[key]
        table.add_row("intra-node" if same else "inter-node", f"{bw / 1e9:g}", f"{lat * 1e6:g}", str(classes[key]), f"{a}->{b}")
    return table


def bandwidth_matrix_table(cluster: Cluster) -> Table:
    """The full bandwidth matrix in GB/s (row = sender, column = receiver)."""
    table = Table(title="bandwidth GB/s (row -> column)", title_justify="left", box=box.SIMPLE, pad_edge=False)
    table.add_column("")
    for b in range(cluster.num_devices):
        table.add_column(str(b), justify="right")
    for a, row in enumerate(cluster.bandwidth.dense().tolist()):
        table.add_row(str(a), *("-" if a == b else f"{v / 1e9:g}" for b, v in enumerate(row)))
    return table


def draw_bandwidth_heatmap(cluster: Cluster, path: Path) -> None:
    """Write the bandwidth matrix as an annotated heat map (log colour scale, diagonal blank, node borders)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import LogNorm

    n = cluster.num_devices
    gb = cluster.bandwidth.dense() / 1e9
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
    nic = "" if cluster.nic_bandwidth is None else f"; NIC {cluster.nic_bandwidth / 1e9:g} GB/s per node"
    ax.set_title(f"{cluster.name}: bandwidth GB/s, sender row -> receiver column{nic}", fontsize=10)
    ax.set_xlabel("receiver device")
    ax.set_ylabel("sender device")
    fig.tight_layout()
    from pipeplan.io.atomic import atomic_output

    try:
        with atomic_output(path, binary=True) as handle:
            fig.savefig(handle, format="png", dpi=110)
    finally:
        plt.close(fig)


def _node_boundaries(cluster: Cluster) -> list[int]:
    """Device ids where a new node starts (drawn as lines; skipped when there are too many to see)."""
    starts = [d.id for d in cluster.devices[1:] if d.node != cluster.devices[d.id - 1].node]
    return starts if len(starts) <= 64 else []


def _span(ids: list[int]) -> str:
    """Sorted ids as runs: `3`, `0-7`, `0-3,8-11` (every run of consecutive ids as first-last)."""
    runs: list[list[int]] = []
    for i in sorted(ids):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def fmt_bytes(n: float) -> str:
    """Binary-prefixed size: 512 B, 64.0 MiB, 1.50 GiB."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.3g} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def write_json(obj: Any) -> None:
    """Print obj as JSON with sorted keys; arrays of numbers and flat objects on one line each.

    Note:
        A 1024-GPU cluster's matrices have a million entries; one number per
        line (plain indent=2) would print two million lines.
    """
    sys.stdout.write(_compact(obj, 0))
    sys.stdout.write("\n")


def _compact(obj: Any, level: int) -> str:
    """JSON text: containers of scalars inline, others one item per line."""
    pad, inner = "  " * level, "  " * (level + 1)
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        if all(not isinstance(v, (dict, list)) for v in obj.values()):
            return json.dumps(obj, sort_keys=True)
        items = [f"{inner}{json.dumps(k)}: {_compact(obj[k], level + 1)}" for k in sorted(obj)]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, list):
        if not obj:
            return "[]"
        if all(not isinstance(v, (dict, list)) for v in obj):
            return json.dumps(obj)
        return "[\n" + ",\n".join(inner + _compact(v, level + 1) for v in obj) + "\n" + pad + "]"
    return json.dumps(obj)


def register(app: typer.Typer) -> None:
    """Add the `show` command group to app."""
    app.add_typer(show_app, name="show")
