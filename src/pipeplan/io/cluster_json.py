"""pipeplan's JSON cluster format, `pipeplan.cluster/1`, in matrix form and in description form.

Files use GB/s (10^9 bytes/s) for bandwidth, microseconds for latency and GiB
(2**30 bytes) for `memory_gb`; the in-memory Cluster uses bytes/s, seconds
and bytes.

Note:
    Matrix form gives every ordered pair (any topology, asymmetric allowed).
    Description form (nodes x GPUs per node, one intra- and one inter-node
    rate, a shared per-node NIC, per-pair overrides) keeps that structure in
    memory (core.hardware.links.NodeLinks: two values and the overridden pairs, not
    n^2 entries), so 16,384 GPUs load at once and take kilobytes. An override
    sets the ordered pair a->b only; give [b, a] too for both directions.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

from pipeplan.core.errors import ClusterError
from pipeplan.core.hardware.cluster import Cluster, Device
from pipeplan.core.hardware.devices import CPU_KIND, GENERIC_KIND, canonical_kind, device_spec, speed_scale
from pipeplan.core.hardware.links import LinkMatrix, NodeLinks
from pipeplan.core.limits import DEVICES, MAX_BYTES, MAX_BYTES_PER_S, MAX_LATENCY_MS, MAX_SPEED, MIN_BYTES_PER_S, MIN_SPEED, Limit
from pipeplan.core.units import (
    BYTES_PER_GB,
    BYTES_PER_GIB,
    US_PER_MS,
    bytes_per_s_to_gb_per_s,
    bytes_to_gib,
    gb_per_s_to_bytes_per_s,
    gib_to_bytes,
    ms_to_us,
    s_to_ms,
    us_to_s,
)
from pipeplan.io.json_fields import Fields, check_number, load_json_file

CLUSTER_FORMAT = "pipeplan.cluster/1"

_MATRIX_KEYS = (
    "format", "name", "devices", "bandwidth_gb_per_s", "latency_us", "nic_gb_per_s", "allreduce", "message_overhead_us",
    "message_latency_us", "tp_allreduce", "notes",
)  # fmt: skip
_DESCRIPTION_KEYS = (
    "format",
    "name",
    "nodes",
    "gpus_per_node",
    "device",
    "intra_node_gb_per_s",
    "inter_node_gb_per_s",
    "nic_gb_per_s",
    "latency_us",
    "overrides",
    "allreduce",
    "message_overhead_us",
    "message_latency_us",
    "tp_allreduce",
    "notes",
)
_DEVICE_KEYS = ("kind", "memory_gb", "speed", "node", "matmul_fraction")
RATE = (MIN_BYTES_PER_S.scaled(BYTES_PER_GB, "GB/s"), MAX_BYTES_PER_S.scaled(BYTES_PER_GB, "GB/s"))
"""Bounds of a rate in GB/s (0, where allowed, means no link)."""
LATENCY = (MAX_LATENCY_MS.scaled(1 / US_PER_MS, "us"),)
MEMORY = (MAX_BYTES.scaled(BYTES_PER_GIB, "GiB"),)
SPEED = (MIN_SPEED, MAX_SPEED)
FRACTION = (Limit(1.0, "", "a matmul cannot reach more than its device's peak", least=False),)
"""Bound of a device's matmul_fraction (a share of its kind's peak)."""


def cluster_to_json(cluster: Cluster, notes: str | None = None) -> dict[str, Any]:
    """The cluster in matrix form: GB/s, microseconds, GiB; with `notes`, its "notes" (where it came from)."""
    result: dict[str, Any] = {
        "format": CLUSTER_FORMAT,
        "name": cluster.name,
        "devices": [_device_json(d) for d in cluster.devices],
        "bandwidth_gb_per_s": [
            [_clean(bytes_per_s_to_gb_per_s(v)) for v in row] for row in cluster.bandwidth_bytes_per_s.dense().tolist()
        ],
        "latency_us": [[_clean(ms_to_us(v)) for v in row] for row in cluster.latency_ms.dense().tolist()],
    }
    if cluster.nic_bytes_per_s is not None:
        result["nic_gb_per_s"] = _clean(bytes_per_s_to_gb_per_s(cluster.nic_bytes_per_s))
    if cluster.allreduce_bytes_per_s is not None:
        result["allreduce"] = {
            "gb_per_s": _clean(bytes_per_s_to_gb_per_s(cluster.allreduce_bytes_per_s)),
            "latency_us": _clean(ms_to_us(cluster.allreduce_latency_ms)),
        }
    if cluster.tp_allreduce_bytes_per_s is not None:
        result["tp_allreduce"] = {
            "gb_per_s": _clean(bytes_per_s_to_gb_per_s(cluster.tp_allreduce_bytes_per_s)),
            "latency_us": _clean(ms_to_us(cluster.tp_allreduce_latency_ms)),
        }
    if cluster.message_overhead_ms > 0:
        result["message_overhead_us"] = _clean(ms_to_us(cluster.message_overhead_ms))
    if cluster.message_latency_ms > 0:
        result["message_latency_us"] = _clean(ms_to_us(cluster.message_latency_ms))
    if notes is not None:
        result["notes"] = notes
    return result


def _device_json(device: Device) -> dict[str, Any]:
    """One device of the matrix form; `matmul_fraction` only when measured."""
    entry: dict[str, Any] = {
        "kind": device.kind, "memory_gb": _clean(bytes_to_gib(device.memory_bytes)), "speed": device.speed, "node": device.node,
    }  # fmt: skip
    if device.matmul_fraction is not None:
        entry["matmul_fraction"] = device.matmul_fraction
    return entry


def cluster_from_json(obj: object, source: str = "<json>") -> Cluster:
    """Build a Cluster from a parsed `pipeplan.cluster/1` object in either form.

    Raises:
        ClusterError: naming source, field and value.
    """
    top = Fields(obj, source, ClusterError)
    if "format" in top.obj and top.obj["format"] != CLUSTER_FORMAT:
        raise ClusterError(f"{source}: field 'format' must be {CLUSTER_FORMAT!r}, got {top.obj['format']!r}")
    if "devices" in top.obj and "nodes" in top.obj:
        raise ClusterError(f"{source}: give either 'devices' (matrix form) or 'nodes' (description form), not both")
    if "devices" in top.obj:
        return _from_matrix_form(top)
    if "nodes" in top.obj:
        return _from_description_form(top)
    raise ClusterError(f"{source}: missing field 'devices' (matrix form) or 'nodes' (description form)")


def read_cluster_json(path: str | os.PathLike[str]) -> Cluster:
    """Read a `pipeplan.cluster/1` file in either form.

    Raises:
        ClusterError: unreadable file, invalid JSON, or a bad field (named with its value).
    """
    source = os.fspath(path)
    return cluster_from_json(load_json_file(source, ClusterError, "cluster"), source)


def _from_matrix_form(top: Fields) -> Cluster:
    """Matrix form: devices plus full n x n bandwidth and latency matrices."""
    top.check_keys(_MATRIX_KEYS)
    source = top.where
    name = top.string("name")
    devices = []
    items = top.array("devices", 1)
    DEVICES.check(ClusterError, f"{source}: field 'devices'", len(items))  # before any device is built
    for i, item in enumerate(items):
        kind, memory_bytes, speed, node, fraction = _device_fields(item, f"{source}: devices[{i}]", has_node=True)
        devices.append(Device(id=i, kind=kind, memory_bytes=memory_bytes, speed=speed, node=node, matmul_fraction=fraction))
    n = len(devices)
    bandwidth = _matrix(top, "bandwidth_gb_per_s", n, gb_per_s_to_bytes_per_s, RATE)
    raw_latency = top.raw("latency_us")
    if isinstance(raw_latency, (int, float)) and not isinstance(raw_latency, bool):
        # One number: the same latency between every pair of distinct devices.
        value = _latency_ms(check_number(raw_latency, f"{source}: field 'latency_us'", ClusterError, limits=LATENCY))
        latency = tuple(tuple(0.0 if a == b else value for b in range(n)) for a in range(n))
    else:
        latency = _matrix(top, "latency_us", n, _latency_ms, LATENCY)
    nic = top.optional_number("nic_gb_per_s", positive=True, limits=RATE)
    return _cluster(top, name, tuple(devices), bandwidth, latency, None if nic is None else gb_per_s_to_bytes_per_s(nic))


def _from_description_form(top: Fields) -> Cluster:
    """Description form: nodes x gpus_per_node identical devices, two rates, overrides."""
    top.check_keys(_DESCRIPTION_KEYS)
    source = top.where
    name = top.string("name")
    nodes = top.integer("nodes", 1)
    per_node = top.integer("gpus_per_node", 1)
    n = nodes * per_node
    DEVICES.check(ClusterError, f"{source}: nodes x gpus_per_node ({nodes:,} x {per_node:,})", n)  # before any is built
    template = top.raw("device")
    kind, memory_bytes, speed, _, fraction = _device_fields(template, f"{source}: device", has_node=False)
    devices = tuple(
        Device(id=i, kind=kind, memory_bytes=memory_bytes, speed=speed, node=i // per_node, matmul_fraction=fraction)
        for i in range(n)
    )
    intra = gb_per_s_to_bytes_per_s(top.number("intra_node_gb_per_s", limits=RATE)) if per_node > 1 else 0.0
    inter = gb_per_s_to_bytes_per_s(top.number("inter_node_gb_per_s", limits=RATE)) if nodes > 1 else 0.0
    raw_latency = top.raw("latency_us")
    if isinstance(raw_latency, (int, float)) and not isinstance(raw_latency, bool):
        # one number: the same latency inside and between nodes
        one = check_number(raw_latency, f"{source}: field 'latency_us'", ClusterError, limits=LATENCY)
        intra_lat = inter_lat = _latency_ms(one)
    else:
        latency_fields = Fields(raw_latency, f"{source}: latency_us", ClusterError)
        latency_fields.check_keys(("intra", "inter"))
        intra_lat = _latency_ms(latency_fields.number("intra", limits=LATENCY)) if per_node > 1 else 0.0
        inter_lat = _latency_ms(latency_fields.number("inter", limits=LATENCY)) if nodes > 1 else 0.0
    intra_lat = intra_lat if per_node > 1 else 0.0
    inter_lat = inter_lat if nodes > 1 else 0.0
    overrides = top.array("overrides") if top.has("overrides") else []
    bandwidth_pairs: dict[tuple[int, int], float] = {}
    latency_pairs: dict[tuple[int, int], float] = {}
    for k, item in enumerate(overrides):
        _apply_override(item, f"{source}: overrides[{k}]", n, bandwidth_pairs, latency_pairs)
    nic = top.optional_number("nic_gb_per_s", positive=True, limits=RATE)
    node_of = np.arange(n) // per_node
    return _cluster(
        top,
        name,
        devices,
        NodeLinks(node_of, intra, inter, 0.0, bandwidth_pairs),
        NodeLinks(node_of, intra_lat, inter_lat, 0.0, latency_pairs),
        None if nic is None else gb_per_s_to_bytes_per_s(nic),
    )


def _apply_override(
    item: object, where: str, n: int, bandwidth: dict[tuple[int, int], float], latency: dict[tuple[int, int], float]
) -> None:
    """Set the ordered pair a->b's bandwidth (and latency, when given)."""
    fields = Fields(item, where, ClusterError)
    fields.check_keys(("pair", "gb_per_s", "latency_us"))
    pair = fields.raw("pair")
    if (
        not isinstance(pair, list)
        or len(pair) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < n for v in pair)
        or pair[0] == pair[1]
    ):
        raise ClusterError(f"{where}: field 'pair' must be two different device ids in 0..{n - 1}, got {pair!r}")
    a, b = pair
    bandwidth[(a, b)] = gb_per_s_to_bytes_per_s(fields.number("gb_per_s", limits=RATE))
    if fields.has("latency_us"):
        latency[(a, b)] = _latency_ms(fields.number("latency_us", limits=LATENCY))


def _device_fields(obj: object, where: str, has_node: bool) -> tuple[str, float, float, int, float | None]:
    """(kind, memory_bytes, speed, node, matmul_fraction) of a device object; memory and speed default to the kind's,
    node to 0, matmul_fraction (a share of the kind's peak, in (0, 1]) to None: not measured.

    `generic` devices give memory_gb and speed; `cpu` devices give memory_gb (their speed defaults to 1.0,
    the CPU the profile was measured on).
    """
    fields = Fields(obj, where, ClusterError)
    fields.check_keys(_DEVICE_KEYS if has_node else ("kind", "memory_gb", "speed", "matmul_fraction"))
    kind = canonical_kind(fields.raw("kind"), f"{where}: field 'kind'")
    spec = device_spec(kind)
    if kind in (GENERIC_KIND, CPU_KIND) or spec is None:
        memory_gb = fields.number("memory_gb", positive=True, limits=MEMORY)
    else:
        memory_gb = fields.number("memory_gb", positive=True, default=spec.memory_gib, limits=MEMORY)
    speed = fields.number("speed", positive=True, default=None if spec is None else spec.speed, limits=SPEED)
    node = fields.integer("node", 0, default=0) if has_node else 0
    fraction = fields.optional_number("matmul_fraction", positive=True, limits=FRACTION)
    return kind, gib_to_bytes(memory_gb), speed, node, fraction


def _matrix(
    top: Fields, key: str, n: int, convert: Callable[[float], float], limits: tuple[Limit, ...]
) -> tuple[tuple[float, ...], ...]:
    """An n x n matrix of finite numbers >= 0 within limits off the diagonal (0 spared by a lower limit), each
    in internal units (`convert`: a core.units conversion from the file's unit)."""
    rows = top.raw(key)
    if not isinstance(rows, list) or len(rows) != n or not all(isinstance(r, list) and len(r) == n for r in rows):
        shape = _shape(rows)
        raise ClusterError(f"{top.where}: field {key!r} must be a {n}x{n} matrix (one row per device), got {shape}")
    if _plain_numbers(rows, limits):  # numpy checks every entry at once; else the loop names the first bad one
        return tuple(tuple(convert(v) for v in row) for row in rows)
    result = []
    for a, row in enumerate(rows):
        result.append(
            tuple(
                convert(check_number(v, f"{top.where}: {key}[{a}][{b}]", ClusterError, limits=() if a == b else limits))
                for b, v in enumerate(row)
            )
        )
    return tuple(result)


def _plain_numbers(rows: list[list[Any]], limits: tuple[Limit, ...]) -> bool:
    """Whether every entry is a finite number >= 0 (not a bool) and, off the diagonal, 0 or within limits."""
    if not all(set(map(type, row)) <= {float, int} for row in rows):
        return False
    values = np.array(rows, dtype=float)
    if not (np.isfinite(values).all() and (values >= 0).all()):
        return False
    np.fill_diagonal(values, 0.0)
    return all(((values == 0) | (values >= limit.value) if limit.least else values <= limit.value).all() for limit in limits)


def _shape(rows: object) -> str:
    """A matrix's shape in words, for messages."""
    if not isinstance(rows, list):
        return repr(rows)[:60]
    lengths = sorted({len(r) if isinstance(r, list) else -1 for r in rows})
    cols = ",".join("non-list" if k < 0 else str(k) for k in lengths)
    return f"{len(rows)} rows of {cols} entries"


def _cluster(
    top: Fields,
    name: str,
    devices: tuple[Device, ...],
    bandwidth: LinkMatrix | tuple[tuple[float, ...], ...],
    latency: LinkMatrix | tuple[tuple[float, ...], ...],
    nic: float | None,
) -> Cluster:
    """Build the Cluster (speed scale from the kinds, measured all-reduce); a core check failure names the source."""
    source = top.where
    scales = {speed_scale(d.kind) for d in devices}
    if len(scales) > 1:
        raise ClusterError(
            f"{source}: devices mix kind {CPU_KIND!r} with GPU kinds; their speeds are on different scales "
            "(a CPU's is relative to the CPU a profile was measured on, a GPU's to a V100): describe them as two clusters"
        )
    allreduce_bw, allreduce_lat = _collective(top, "allreduce")
    tp_bw, tp_lat = _collective(top, "tp_allreduce")
    overhead = _latency_ms(top.number("message_overhead_us", default=0.0, limits=LATENCY))
    message_latency = _latency_ms(top.number("message_latency_us", default=0.0, limits=LATENCY))
    try:
        return Cluster(
            name=name, devices=devices, bandwidth_bytes_per_s=bandwidth, latency_ms=latency, nic_bytes_per_s=nic,
            speed_reference=scales.pop(), allreduce_bytes_per_s=allreduce_bw, allreduce_latency_ms=allreduce_lat,
            message_overhead_ms=overhead, message_latency_ms=message_latency, tp_allreduce_bytes_per_s=tp_bw,
            tp_allreduce_latency_ms=tp_lat,
        )  # fmt: skip
    except ClusterError as exc:
        raise ClusterError(f"{source}: {exc}") from None


def _collective(top: Fields, key: str) -> tuple[float | None, float]:
    """A measured collective's {gb_per_s, latency_us} (`allreduce`: the data-parallel all-reduce; `tp_allreduce`:
    a tensor-parallel group's, at its small messages) as (bytes/s, ms per ring step); (None, 0) when absent."""
    if not top.has(key):
        return None, 0.0
    fields = Fields(top.raw(key), f"{top.where}: {key}", ClusterError)
    fields.check_keys(("gb_per_s", "latency_us"))
    rate = gb_per_s_to_bytes_per_s(fields.number("gb_per_s", positive=True, limits=RATE))
    return rate, _latency_ms(fields.number("latency_us", default=0.0, limits=LATENCY))


def _latency_ms(us: float) -> float:
    """A file's latency (us) in ms, through seconds (us x 1e-6 x 1000): the float the cost model has priced a file's
    latency at since clusters kept seconds, so plans and simulated times stay those of the golden records."""
    return s_to_ms(us_to_s(us))


def _clean(value: float) -> int | float:
    """Round away float noise from unit conversion; whole numbers as JSON integers."""
    value = round(value, 9)
    return int(value) if value.is_integer() and abs(value) < 2**53 else value
