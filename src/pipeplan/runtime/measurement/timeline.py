"""The measured timeline of one iteration, in the simulator's result format (so viz draws and exports it alike)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pipeplan.core.units import s_to_ms
from pipeplan.runtime.execution.executor import StepRecord
from pipeplan.runtime.transport.comm import TransferRecord
from pipeplan.runtime.transport.exchange import gather_json
from pipeplan.sim.result import ComputeSpan, RankStats, SimResult, TransferSpan


def local_part(record: StepRecord, origin_s: float, end_s: float) -> dict[str, Any]:
    """This process's spans in ms from `origin_s` (a moment all processes share after a barrier), as JSON values:
    a span and a message's key as lists, the stage peaks as [stage, peak] rows (`gather_parts` reads them back)."""

    def rel(t: float) -> float:
        return s_to_ms(t - origin_s)

    return {
        "compute": [[s.rank, s.stage, s.op, s.microbatch, rel(s.start_s), rel(s.end_s)] for s in record.compute],
        "transfers": [[list(_key(r.message)), rel(r.at_s), r.sent] for r in record.transfers],
        "peak_inflight": record.peak_inflight,
        "stage_peaks": [[stage, peak] for stage, peak in record.stage_peaks],
        "end_ms": rel(end_s),
    }


def gather_parts(part: dict[str, Any]) -> list[dict[str, Any]] | None:
    """Every process's part on process 0 (None elsewhere), through gather_json: spans as ComputeSpan, a message's
    key as a tuple, the stage peaks as a dict."""
    parts = gather_json(part)
    if parts is None:
        return None
    return [
        {
            "compute": [ComputeSpan(*span) for span in p["compute"]],
            "transfers": [(tuple(key), float(at_ms), bool(sent)) for key, at_ms, sent in p["transfers"]],
            "peak_inflight": p["peak_inflight"],
            "stage_peaks": {int(stage): int(peak) for stage, peak in p["stage_peaks"]},
            "end_ms": float(p["end_ms"]),
        }
        for p in parts
    ]


def build_result(parts: Sequence[dict[str, Any]], num_stages: int, name: str) -> SimResult:
    """Assemble the measured iteration: compute spans, transfers from send to arrival, per-process totals.

    `iteration_time` is the last process's end; `lower_bound` the busiest
    process's compute time (what no schedule can beat on these measured times).
    """
    compute: list[ComputeSpan] = sorted((s for p in parts for s in p["compute"]), key=lambda s: (s.rank, s.start_ms))
    sent: dict[tuple[object, ...], float] = {}
    arrived: dict[tuple[object, ...], float] = {}
    for p in parts:
        for key, at_ms, is_send in p["transfers"]:
            (sent if is_send else arrived)[key] = at_ms
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
