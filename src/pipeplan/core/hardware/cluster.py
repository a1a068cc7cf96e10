"""Devices and the links between them: any topology, asymmetric allowed."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeplan.core.checks import check_nonneg_float, check_nonneg_int, check_positive_float
from pipeplan.core.errors import ClusterError
from pipeplan.core.hardware.links import DenseLinks, LinkMatrix, NodeLinks
from pipeplan.core.limits import (
    DEVICES,
    MAX_BYTES,
    MAX_BYTES_PER_S,
    MAX_LATENCY_MS,
    MAX_SPEED,
    MIN_BYTES_PER_S,
    MIN_SPEED,
    Limit,
)


@dataclass(frozen=True, slots=True)
class Device:
    """One accelerator: `speed` is throughput relative to the profile's reference device.

    `matmul_fraction`, when known, is the fraction of its kind's nominal 16-bit peak (core.hardware.devices) that a
    large bf16/fp16 matrix multiply reaches on it, as measured (a calibrated preset's published figure, or
    `pipeplan probe` on the machine); None when not measured. An analytic profile's layers are priced at peak times it.
    """

    id: int
    kind: str
    memory_bytes: float
    speed: float = 1.0
    node: int = 0
    matmul_fraction: float | None = None

    def __post_init__(self) -> None:
        check_nonneg_int(ClusterError, "device id", self.id)
        if not isinstance(self.kind, str) or not self.kind:
            raise ClusterError(f"device {self.id} kind must be a non-empty string, got {self.kind!r}")
        memory = check_positive_float(ClusterError, f"device {self.id} memory_bytes", self.memory_bytes, most=MAX_BYTES)
        object.__setattr__(self, "memory_bytes", memory)
        speed = check_positive_float(ClusterError, f"device {self.id} speed", self.speed, MIN_SPEED, MAX_SPEED)
        object.__setattr__(self, "speed", speed)
        check_nonneg_int(ClusterError, f"device {self.id} node", self.node)
        if self.matmul_fraction is not None:
            fraction = check_positive_float(ClusterError, f"device {self.id} matmul_fraction", self.matmul_fraction)
            if fraction > 1:
                raise ClusterError(
                    f"device {self.id} matmul_fraction must be in (0, 1] (a share of the kind's peak), got {fraction!r}"
                )
            object.__setattr__(self, "matmul_fraction", fraction)


@dataclass(frozen=True, slots=True)
class Cluster:
    """Devices with bandwidth (bytes/s) and latency (ms) for every ordered pair.

    `bandwidth[a][b]` (or `bandwidth[a, b]`) is the rate from a to b (0 = no
    path; the diagonal is ignored). Both are LinkMatrix values (core.hardware.links):
    nested sequences given here become a DenseLinks; described clusters of
    identical nodes keep their structure (NodeLinks). `nic_bytes_per_s`, when set, is each node's NIC rate in bytes/s per
    direction, a resource shared by all transfers leaving or entering the node.
    `speed_reference` is the device kind whose throughput is 1.0 in each
    device's `speed` (None: speeds are relative to whatever profile is used;
    see sim.cost.speeds). `allreduce_bytes_per_s` (bytes/s) and `allreduce_latency_ms`
    (ms), when measured, replace the ring over the links in every all-reduce:
    bus bandwidth and per-step latency of the real collective.
    `message_overhead_ms` (ms) is the time a stage-to-stage message costs the
    action that consumes it beyond the link's latency and bandwidth (the
    runtime's receive path on a loaded machine), and `message_latency_ms` (ms)
    what every message between two devices takes beyond the link's measured
    latency (the scheduling of communication threads while every core
    computes); both as `pipeplan probe` fits them, 0 when unknown.
    `tp_allreduce_bytes_per_s` (bytes/s) and `tp_allreduce_latency_ms` (ms per ring step), when measured, price a
    tensor-parallel group's all-reduces in place of its links' (sim.cost.tensor_parallel.group_collectives_ms): the
    bus bandwidth and per-step latency of the collective at the small messages TP sends (activations of one
    microbatch), as `pipeplan probe` fits them (runtime.measurement.tp_collectives); None and 0 when unknown.
    """

    name: str
    devices: tuple[Device, ...]
    bandwidth_bytes_per_s: LinkMatrix
    latency_ms: LinkMatrix
    nic_bytes_per_s: float | None = None
    speed_reference: str | None = None
    allreduce_bytes_per_s: float | None = None
    allreduce_latency_ms: float = 0.0
    message_overhead_ms: float = 0.0
    message_latency_ms: float = 0.0
    tp_allreduce_bytes_per_s: float | None = None
    tp_allreduce_latency_ms: float = 0.0

    def __post_init__(self) -> None:
        n = len(self.devices)
        if n < 1:
            raise ClusterError(f"cluster {self.name!r} must have at least one device, got 0")
        DEVICES.check(ClusterError, f"cluster {self.name!r}", n)
        for i, device in enumerate(self.devices):
            if device.id != i:
                raise ClusterError(f"cluster {self.name!r} device {i} has id {device.id}; ids must be 0..{n - 1} in order")
        for field, label in (("bandwidth_bytes_per_s", "bandwidth"), ("latency_ms", "latency")):
            object.__setattr__(self, field, _link_matrix(self.name, label, getattr(self, field), n))
        rate = {"least": MIN_BYTES_PER_S, "most": MAX_BYTES_PER_S}
        if self.nic_bytes_per_s is not None:
            check_positive_float(ClusterError, f"cluster {self.name!r} nic_bytes_per_s", self.nic_bytes_per_s, **rate)
        if self.speed_reference is not None and (not isinstance(self.speed_reference, str) or not self.speed_reference):
            raise ClusterError(f"cluster {self.name!r} speed_reference must be a device kind, got {self.speed_reference!r}")
        for field in ("allreduce_bytes_per_s", "tp_allreduce_bytes_per_s"):
            if getattr(self, field) is not None:
                check_positive_float(ClusterError, f"cluster {self.name!r} {field}", getattr(self, field), **rate)
        for field in ("allreduce_latency_ms", "message_overhead_ms", "message_latency_ms", "tp_allreduce_latency_ms"):
            check_nonneg_float(ClusterError, f"cluster {self.name!r} {field}", getattr(self, field), MAX_LATENCY_MS)

    @property
    def num_devices(self) -> int:
        """Number of devices."""
        return len(self.devices)

    @property
    def num_nodes(self) -> int:
        """Number of distinct nodes."""
        return len({d.node for d in self.devices})

    def link_bandwidth(self, src: int, dst: int) -> float:
        """Effective bytes/s from src to dst: the pair rate, capped by NICs between nodes.

        Returns math.inf for src == dst (no transfer).
        """
        if src == dst:
            return math.inf
        rate = self.bandwidth_bytes_per_s.at(src, dst)
        if self.nic_bytes_per_s is not None and self.devices[src].node != self.devices[dst].node:
            rate = min(rate, self.nic_bytes_per_s)
        return rate

    def link_latency(self, src: int, dst: int) -> float:
        """Milliseconds a message from src to dst takes before its bytes move: the pair's latency plus the cluster's
        message latency (0 for src == dst)."""
        if src == dst:
            return 0.0
        return self.latency_ms.at(src, dst) + self.message_latency_ms

    def require_link(self, src: int, dst: int) -> float:
        """Like link_bandwidth, but raise ClusterError when the two devices cannot talk."""
        rate = self.link_bandwidth(src, dst)
        if rate <= 0:
            raise ClusterError(f"cluster {self.name!r} bandwidth[{src}][{dst}] is 0 but devices {src} and {dst} must talk")
        return rate


def _link_matrix(name: str, field: str, value: object, n: int) -> LinkMatrix:
    """`value` as an n x n LinkMatrix of finite numbers >= 0 within the limits of `field` (_check_bounds); a bad entry
    is named with its position."""
    matrix = _finite_matrix(name, field, value, n)
    _check_bounds(name, field, matrix)
    return matrix


def _check_bounds(name: str, field: str, matrix: LinkMatrix) -> None:
    """Off the diagonal, a bandwidth is 0 (no link) or within MIN_BYTES_PER_S..MAX_BYTES_PER_S, a latency at most
    MAX_LATENCY_MS: so every transfer time stays finite. The first entry out of bounds is named with its position."""
    if isinstance(matrix, NodeLinks):
        labelled = [("intra", matrix.intra), ("inter", matrix.inter)]
        labelled += [
            (f"[{k // matrix.n}][{k % matrix.n}]", v)
            for k, v in zip(matrix.keys.tolist(), matrix.overrides.tolist(), strict=True)
        ]
        entries = [(label, v) for label, v in labelled if not _within(field, v)]
    else:
        dense = matrix.dense()
        np.fill_diagonal(dense, 0.0)
        bad = np.argwhere(~_within(field, dense))
        entries = [(f"[{a}][{b}]", float(dense[a, b])) for a, b in bad[:1].tolist()]
    if entries:
        label, entry = entries[0]
        where = f"cluster {name!r} {field}{label if label.startswith('[') else ' ' + label}"
        for limit in _bounds(field):
            limit.check(ClusterError, where, entry)


def _bounds(field: str) -> tuple[Limit, ...]:
    """The limits of one entry of `field` (bandwidth or latency), beyond 0."""
    return (MIN_BYTES_PER_S, MAX_BYTES_PER_S) if field == "bandwidth" else (MAX_LATENCY_MS,)


def _within(field: str, value: Any) -> Any:
    """Whether value (a float or an array) is within `field`'s bounds; 0 always is."""
    if field == "bandwidth":
        return (value == 0) | ((value >= MIN_BYTES_PER_S.value) & (value <= MAX_BYTES_PER_S.value))
    return value <= MAX_LATENCY_MS.value


def _finite_matrix(name: str, field: str, value: object, n: int) -> LinkMatrix:
    """`value` as an n x n LinkMatrix of finite numbers >= 0; a bad entry is named with its position."""
    if isinstance(value, LinkMatrix):
        if value.n != n:
            raise ClusterError(f"cluster {name!r} {field} must be a {n}x{n} matrix, got {value.n}x{value.n}")
        if isinstance(value, NodeLinks):
            for label, entry in (("intra", value.intra), ("inter", value.inter), ("diagonal", value.diagonal)):
                check_nonneg_float(ClusterError, f"cluster {name!r} {field} {label}", entry)
            for key, entry in zip(value.keys.tolist(), value.overrides.tolist(), strict=True):
                check_nonneg_float(ClusterError, f"cluster {name!r} {field}[{key // n}][{key % n}]", entry)
            return value
        rows: object = value.array if isinstance(value, DenseLinks) else value.dense()
    else:
        rows = value
    if isinstance(rows, np.ndarray):
        if rows.shape == (n, n) and rows.dtype.kind == "f" and np.isfinite(rows).all() and (rows >= 0).all():
            return value if isinstance(value, LinkMatrix) else DenseLinks(rows)
        rows = rows.tolist()
    if (
        not isinstance(rows, (list, tuple))
        or len(rows) != n
        or any(not isinstance(r, (list, tuple)) or len(r) != n for r in rows)
    ):
        shape = f"{len(rows)}x{','.join(str(len(r)) for r in rows)}" if isinstance(rows, (list, tuple)) else repr(rows)[:40]
        raise ClusterError(f"cluster {name!r} {field} must be a {n}x{n} matrix, got {shape}")
    for a, row in enumerate(rows):
        # Fast path for the common all-finite-float row (a 1024-GPU cluster has 1M entries per matrix).
        # A finite sum rules out NaN and inf; map(type) keeps bools and strings out; all at C speed.
        if row and set(map(type, row)) <= {float, int} and min(row) >= 0 and math.isfinite(sum(row)):
            continue
        for b, entry in enumerate(row):
            check_nonneg_float(ClusterError, f"cluster {name!r} {field}[{a}][{b}]", entry)
    return value if isinstance(value, LinkMatrix) else DenseLinks(np.array(rows, dtype=float))
