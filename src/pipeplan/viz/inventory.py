"""Tables of what a profile and a cluster hold (`pipeplan show`): totals, layers, devices, link classes, the matrix."""

from __future__ import annotations

from collections import Counter
from typing import Any

from rich import box
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table

from pipeplan.core.hardware.cluster import Cluster
from pipeplan.core.profile import ModelProfile
from pipeplan.core.units import bytes_per_s_to_gb_per_s, ms_to_us
from pipeplan.viz.tables import format_bytes, id_runs

MATRIX_MAX_DEVICES = 16
"""Up to this many devices the table and heat map print every pair's value."""


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
    table.add_row("parameters", format_bytes(profile.total_param_bytes))  # each shared parameter once
    for g in profile.shared_params:
        table.add_row(f"shared {g.name}", f"{format_bytes(g.param_bytes)}, layers {', '.join(map(str, g.layers))}")
    table.add_row("largest cut", format_bytes(max(profile.cut_bytes or (0.0,))))
    return table


LAYER_HEADERS = ("#", "layer", "fwd ms", "bwd ms", "activation", "saved", "params", "cut after")
PLAIN_LAYER_ROWS = 2_000
"""Above this many layers, print_profile_layers writes the table's lines itself (when they fit the console and hold
plain text): rich measures and renders every cell, 13 CPU seconds for 20,000 layers."""


def _layer_rows(profile: ModelProfile) -> list[tuple[str, ...]]:
    """The cells of the layers table, one tuple per layer."""
    cuts = profile.cut_bytes or ()
    rows = []
    for i, layer in enumerate(profile.layers):
        cut = format_bytes(cuts[i]) if i < len(cuts) else "-"
        rows.append((
            str(i), layer.name[:60], f"{layer.fwd_ms:.3f}", f"{layer.bwd_ms:.3f}", format_bytes(layer.activation_bytes),
            format_bytes(layer.saved_bytes or 0.0), format_bytes(layer.param_bytes), cut,
        ))  # fmt: skip
    return rows


def profile_layers_table(profile: ModelProfile, rows: list[tuple[str, ...]] | None = None) -> Table:
    """One row per layer; `cut after` is what crosses a stage boundary placed after the layer."""
    table = Table(box=box.SIMPLE)
    for header in LAYER_HEADERS:
        table.add_column(header, justify="left" if header == "layer" else "right", overflow="ellipsis", no_wrap=True)
    for row in _layer_rows(profile) if rows is None else rows:
        table.add_row(*row)
    return table


def plain_layer_lines(rows: list[tuple[str, ...]], width: int) -> list[str] | None:
    """The lines rich prints for profile_layers_table on an uncoloured console `width` columns wide, written
    directly; None where rich would have to do more than lay out plain text (a row wider than the console, or a
    cell that could be markup or holds a control character), so the caller lets rich print it."""
    if any("[" in cell or not cell.isprintable() for row in rows for cell in row[1:2]):
        return None
    widths = [max(cell_len(row[c]) for row in [LAYER_HEADERS, *rows]) for c in range(len(LAYER_HEADERS))]
    inner = sum(widths) + 3 * len(widths) - 1
    if inner + 2 > width:
        return None

    def line(cells: tuple[str, ...]) -> str:
        padded = (
            cell + " " * (w - cell_len(cell)) if c == 1 else " " * (w - cell_len(cell)) + cell
            for c, (cell, w) in enumerate(zip(cells, widths, strict=True))
        )
        return "  " + "   ".join(padded) + "  "

    blank = " " * (inner + 2)
    return [blank, line(LAYER_HEADERS), " " + "─" * inner + " ", *map(line, rows), blank]


def print_profile_layers(console: Console, profile: ModelProfile) -> None:
    """Print the layers table on `console`: by rich, or above PLAIN_LAYER_ROWS layers by plain_layer_lines when the
    console is uncoloured and the lines fit (the same text, in a fraction of the time)."""
    rows = _layer_rows(profile)
    lines = None
    if len(rows) > PLAIN_LAYER_ROWS and console.color_system is None and not console.is_terminal:
        lines = plain_layer_lines(rows, console.width)
    if lines is None:
        console.print(profile_layers_table(profile, rows))
        return
    console.file.write("\n".join(lines) + "\n")


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
            table.add_row(
                id_runs(sorted(nodes)), id_runs(sorted(mine)), str(shape.count(key)), kind, format_bytes(memory), f"{speed:g}"
            )
    return table


def link_classes(cluster: Cluster) -> tuple[Counter[tuple[bool, float, float]], dict[tuple[bool, float, float], tuple[int, int]]]:
    """Ordered pairs per (same node?, bytes/s, s) link class, and the first pair (a, b) of each class."""
    import numpy as np

    from pipeplan.core.hardware.links import NodeLinks

    classes: Counter[tuple[bool, float, float]] = Counter()
    example: dict[tuple[bool, float, float], tuple[int, int]] = {}
    nodes = np.array([d.node for d in cluster.devices])
    bandwidth, latency = cluster.bandwidth_bytes_per_s, cluster.latency_ms
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
    nic = (
        "no NIC limit"
        if cluster.nic_bytes_per_s is None
        else f"NIC {bytes_per_s_to_gb_per_s(cluster.nic_bytes_per_s):g} GB/s per node, shared"
    )
    table = Table(title="links (ordered pairs)", caption=nic, caption_justify="left", title_justify="left", box=box.SIMPLE)
    for header in ("where", "GB/s", "latency us", "pairs", "e.g."):
        table.add_column(header, justify="left" if header in ("where", "e.g.") else "right")
    for key in sorted(classes, key=lambda k: (not k[0], -k[1], k[2])):
        same, bw, lat = key
        a, b = example[key]
        table.add_row(
            "intra-node" if same else "inter-node",
            f"{bytes_per_s_to_gb_per_s(bw):g}",
            f"{ms_to_us(lat):g}",
            str(classes[key]),
            f"{a}->{b}",
        )
    return table


def bandwidth_matrix_table(cluster: Cluster) -> Table:
    """The full bandwidth matrix in GB/s (row = sender, column = receiver)."""
    table = Table(title="bandwidth GB/s (row -> column)", title_justify="left", box=box.SIMPLE, pad_edge=False)
    table.add_column("")
    for b in range(cluster.num_devices):
        table.add_column(str(b), justify="right")
    for a, row in enumerate(cluster.bandwidth_bytes_per_s.dense().tolist()):
        table.add_row(str(a), *("-" if a == b else f"{bytes_per_s_to_gb_per_s(v):g}" for b, v in enumerate(row)))
    return table


def profiles_list_table(rows: list[dict[str, Any]]) -> Table:
    """The built-in profiles, one row each (`show profiles`)."""
    table = Table(title="built-in profiles (pipeplan show profile NAME)", title_justify="left", box=box.SIMPLE)
    for header in ("name", "batch", "layers", "fwd ms", "bwd ms", "params", "measured on"):
        table.add_column(header, justify="left" if header in ("name", "measured on") else "right")
    for row in rows:
        table.add_row(
            row["name"], str(row["batch_size"]), str(row["layers"]), f"{row['fwd_ms']:.2f}", f"{row['bwd_ms']:.2f}",
            format_bytes(row["param_bytes"]), row["reference_device"],
        )  # fmt: skip
    return table


def clusters_list_table(rows: list[dict[str, Any]]) -> Table:
    """The built-in clusters, one row each (`show clusters`)."""
    table = Table(title="built-in clusters (pipeplan show cluster NAME)", title_justify="left", box=box.SIMPLE)
    for header in ("name", "devices", "nodes", "kinds", "NIC GB/s", "notes"):
        table.add_column(header, justify="right" if header in ("devices", "nodes", "NIC GB/s") else "left")
    for row in rows:
        kinds = ", ".join(f"{n} {k}" for k, n in row["kinds"].items())
        nic = "-" if row["nic_gb_per_s"] is None else f"{row['nic_gb_per_s']:g}"
        table.add_row(row["name"], str(row["devices"]), str(row["nodes"]), kinds, nic, row["notes"])
    return table
