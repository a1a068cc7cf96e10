"""The timeline of a simulated iteration as Chrome trace-event JSON (a Perfetto timeline); opens in ui.perfetto.dev
and chrome://tracing.

One process per rank ("rank r"), with a "compute" thread holding one complete
event per action (named like `2F0`) and a "send" thread holding the transfers
the rank sends (transfers that take no time are left out). Timestamps and
durations are microseconds, as the format requires: the simulator's
milliseconds times 1000.
"""

from __future__ import annotations

import json
from typing import Any

from pipeplan.core.units import ms_to_us
from pipeplan.sim.result import SimResult

COMPUTE_TID = 0
SEND_TID = 1


def _metadata(pid: int, tid: int | None, name: str, value: str | int) -> dict[str, Any]:
    """A metadata ("M") event: process/thread name or sort index."""
    key = "name" if name.endswith("_name") else "sort_index"
    event: dict[str, Any] = {"ph": "M", "pid": pid, "name": name, "args": {key: value}}
    if tid is not None:
        event["tid"] = tid
    return event


def timeline_events(result: SimResult) -> dict[str, Any]:
    """The timeline as a JSON-ready dict `{"traceEvents": [...], "displayTimeUnit": "ms"}`.

    Events are sorted (metadata first, then by rank, thread, start, name), so the
    same result gives the same timeline.
    """
    num_ranks = max(
        len(result.per_rank),
        1 + max((s.rank for s in result.compute), default=-1),
        1 + max((max(t.src_rank, t.dst_rank) for t in result.transfers), default=-1),
    )
    transfers = [t for t in result.transfers if t.end_ms > t.start_ms]
    senders = {t.src_rank for t in transfers}
    meta: list[dict[str, Any]] = []
    for rank in range(num_ranks):
        meta.append(_metadata(rank, None, "process_name", f"rank {rank}"))
        meta.append(_metadata(rank, None, "process_sort_index", rank))
        meta.append(_metadata(rank, COMPUTE_TID, "thread_name", "compute"))
        meta.append(_metadata(rank, COMPUTE_TID, "thread_sort_index", COMPUTE_TID))
        if rank in senders:
            meta.append(_metadata(rank, SEND_TID, "thread_name", "send"))
            meta.append(_metadata(rank, SEND_TID, "thread_sort_index", SEND_TID))

    events: list[dict[str, Any]] = []
    for span in result.compute:
        events.append(
            {
                "ph": "X",
                "pid": span.rank,
                "tid": COMPUTE_TID,
                "name": f"{span.stage}{span.op}{span.microbatch}",
                "cat": span.op,
                "ts": ms_to_us(span.start_ms),
                "dur": ms_to_us(span.end_ms - span.start_ms),
                "args": {"stage": span.stage, "op": span.op, "microbatch": span.microbatch},
            }
        )
    for t in transfers:
        events.append(
            {
                "ph": "X",
                "pid": t.src_rank,
                "tid": SEND_TID,
                "name": f"{t.kind} {t.src_stage}->{t.dst_stage} mb{t.microbatch}",
                "cat": t.kind,
                "ts": ms_to_us(t.start_ms),
                "dur": ms_to_us(t.end_ms - t.start_ms),
                "args": {
                    "kind": t.kind,
                    "microbatch": t.microbatch,
                    "src_rank": t.src_rank,
                    "dst_rank": t.dst_rank,
                    "src_stage": t.src_stage,
                    "dst_stage": t.dst_stage,
                },
            }
        )
    events.sort(key=lambda e: (e["pid"], e["tid"], e["ts"], e["name"]))
    return {
        "traceEvents": meta + events,
        "displayTimeUnit": "ms",
        "otherData": {
            "schedule": result.schedule_name,
            "iteration_time_ms": result.iteration_time,
            "bubble_fraction": result.bubble_fraction,
        },
    }


def write_timeline(result: SimResult, path: str) -> None:
    """Write the timeline of `result` to `path` as JSON (sorted keys, byte-identical for the same result), whole or not at all."""
    # json.dumps runs the C encoder; json.dump to a file would use the much slower Python one.
    from pipeplan.io.atomic import write_text_atomic
    from pipeplan.io.file_kinds import PERFETTO

    text = json.dumps(timeline_events(result), sort_keys=True, separators=(",", ":"))
    write_text_atomic(path, text + "\n", PERFETTO)
