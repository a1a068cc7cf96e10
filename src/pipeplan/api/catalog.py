"""The built-in profiles and clusters through the API: each listed with its sizes and totals (`pipeplan show
profiles`, `show clusters`)."""

from __future__ import annotations

from collections import Counter
from typing import Any


def builtin_profiles() -> list[dict[str, Any]]:
    """Every built-in profile: its name, batch size, layers, forward and backward ms, parameter bytes, device."""
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
    return rows


def builtin_clusters() -> list[dict[str, Any]]:
    """Every built-in cluster: its name, devices, nodes, device kinds, NIC GB/s and notes."""
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
                "nic_gb_per_s": None if c.nic_bytes_per_s is None else c.nic_bytes_per_s / 1e9,
                "notes": CLUSTER_BUILDERS[name]().get("notes", ""),
            }
        )
    return rows
