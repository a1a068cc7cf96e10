"""The measured timeline of one iteration, in the simulator's result format (so viz draws and exports it alike)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch.distributed as dist

from pipeplan.runtime.execution.executor import StepRecord
from pipeplan.runtime.transport.comm import TransferRecord
from pipeplan.sim.result import ComputeSpan, RankStats, SimResult, TransferSpan


def local_part(record: StepRecord, origin_s: float, end_s: float) -> dict[str, Any]:
    """This process's spans in ms from `origin_s` (a moment all processes share after a barrier)."""

    def rel(t: float) -> float:
        return (t - origin_s) * 1000.0

    return {
        "compute": [s._replace(start_ms=rel(s.start_ms), end_ms=rel(s.end_ms)) for s in record.compute],
        "transfers": [(r.message, rel(r.at_s), r.sent) for r in record.transfers],
        "peak_inflight": record.peak_inflight,
        "stage_peaks": dict(record.stage_peaks),
        "end_ms": rel(end_s),
    }


def gather_parts(part: dict[str, Any]) -> list[dict[str, Any]] | None:
    """Every process's part on process 0 (None elsewhere)."""
    parts: list[dict[str, Any]] | None = [{} for _ in range(dist.get_world_size())] if dist.get_rank() == 0 else None
    dist.gather_object(part, parts, dst=0)
    return parts


def build_result(parts: Sequence[dict[str, Any]], num_stages: int, name: str) -> SimResult:
    """Assemble the measured iteration: compute spans, transfers from send to arrival, per-process totals.

    `iteration_time` is the last process's end; `lower_bound` the busiest
    process's compute time (what no schedule can beat on these measured times).
    """
    compute: list[ComputeSpan] = sorted((s for p in parts for s in p["compute"]), key=lambda s: (s.rank, s.start_ms))
    sent: dict[tuple[object, ...], float] = {}
    arrived: dict[tuple[object, ...], float] = {}
    for p in parts:
        for message, at_ms, is_send in p["transfers"]:
            (sent if is_send else arrived)[_key(message)] = at_ms
    transfers = []
    for key, start in sorted(sent.items(), key=lambda kv: kv[1]):
        if key in arrived:
            kind, boundary, mb, src, dst = key
            src_stage, dst_stage = (boundary, boundary + 1) if kind == "act" else (boundary + 1, boundary)
            transfers.append(TransferSpan(src, dst, src_stage, dst_stage, kind, mb, start, max(start, arrived[key])))
    iteration = max(p["end_ms"] for p in parts)
    per_rank = []
    for p in parts:
        busy = sum(s.end_ms - s.start_ms for s in p["compute"])
        per_rank.append(RankStats(busy, max(0.0, iteration - busy), p["peak_inflight"], 0.0))
    stage_peaks = [0] * num_stages
    for p in parts:
        for s, peak in p["stage_peaks"].items():
            stage_peaks[s] = max(stage_peaks[s], peak)
    total_busy = sum(r.busy for r in per_rank)
    bubble = max(0.0, 1.0 - total_busy / (len(parts) * iteration)) if iteration > 0 else 0.0
    return SimResult(
        iteration_time=iteration,
        lower_bound=max(r.busy for r in per_rank),
        bubble_fraction=bubble,
        per_rank=tuple(per_rank),
        stage_peak_inflight=tuple(stage_peaks),
        compute=tuple(compute),
        transfers=tuple(transfers),
        schedule_name=name,
    )


def _key(message: object) -> tuple[object, ...]:
    m: Any = message
    return (m.kind, m.boundary, m.microbatch, m.src, m.dst)


__all__ = ["TransferRecord", "build_result", "gather_parts", "local_part"]
