"""What one iteration measured on each process, as the flat numbers the shared all-reduce carries, and the
controller's IterationObservation built from every process's numbers (torch-free).

Note:
    A process's slot holds HEADER's values, then one RECORD per message it sent or received, then one COLLECTIVE per
    emulated data-parallel all-reduce of its stages (the same span on every participant). Times are ms on the
    run's clock (0 when the run started, the same on every process). On an emulated network a transfer's start and
    arrival are the sender's stamps; on the real one, a message whose receiver had to wait for it (longer than
    BLOCKED_MS) arrived when the wait ended, and moved from when its sender handed it over or, when later, when
    its receive was posted (a transport may hold a message until then); a message that was there before it was
    needed says only that it was fast enough, and is left out.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pipeplan.adapt import Collective, IterationObservation, Transfer
from pipeplan.core.units import s_to_ms

if TYPE_CHECKING:
    from pipeplan.runtime.execution.executor import StepRecord

BLOCKED_MS = 0.1
"""A receive whose wait took longer than this was waited for: its message arrived when the wait ended."""

HEADER = ("k", "stage", "fwd_ms", "bwd_ms", "start_ms", "end_ms", "optimizer_ms", "static_bytes", "activation_bytes",
          "memory_limit_bytes", "records", "collective_records")  # fmt: skip
RECORD = ("sent", "grad", "boundary", "microbatch", "src", "dst", "nbytes", "at_ms", "wait_ms", "wire_start_ms", "wire_end_ms",
          "posted_ms")  # fmt: skip

COLLECTIVE = ("stage", "start_ms", "end_ms", "nbytes")

Key = tuple[str, int, int, int, int]
"""A message: (kind, boundary, microbatch, sender process, receiver process)."""


def slot_size(microbatches: int, stages: int = 1) -> int:
    """Values one process's slot needs: its F and B each receive and send at most one message per microbatch, and
    each of its `stages` runs at most one all-reduce."""
    return len(HEADER) + len(RECORD) * 4 * microbatches + len(COLLECTIVE) * stages


def pack(
    record: StepRecord,
    origin_s: float,
    k: int,
    stage: int,
    times_s: tuple[float, float],
    optimizer_ms: float,
    static_bytes: float,
    activation_bytes: float,
    memory_limit_bytes: float,
) -> list[float]:
    """One process's slot: what it ran (k, its stage), its mean forward and backward per microbatch (what each cost
    the process: StepRecord.busy_s), the iteration's start and the end of its optimizer step (`times_s`,
    perf_counter s), its memory figures, every message it sent or received and its emulated all-reduces."""

    def ms(t_s: float) -> float:
        return s_to_ms(t_s - origin_s)

    # what each action cost its process (compute and its own handling of messages; its spans when not recorded)
    busy = record.busy_s or tuple(s.end_s - s.start_s for s in record.compute)
    fwd = [s_to_ms(b) for s, b in zip(record.compute, busy, strict=True) if s.op == "F"]
    bwd = [s_to_ms(b) for s, b in zip(record.compute, busy, strict=True) if s.op != "F"]
    rows: list[float] = []
    for r in record.transfers:
        m = r.message
        wire = r.emulated or (0.0, 0.0)
        rows += [float(r.sent), float(m.kind == "grad"), m.boundary, m.microbatch, m.src, m.dst, r.nbytes, ms(r.at_s),
                 s_to_ms(r.wait_s), *wire, ms(r.posted_s) if r.posted_s else 0.0]  # fmt: skip
    header = [k, stage, statistics.fmean(fwd) if fwd else 0.0, statistics.fmean(bwd) if bwd else 0.0, ms(times_s[0]),
              ms(times_s[1]), optimizer_ms, static_bytes, activation_bytes, memory_limit_bytes,
              len(record.transfers), len(record.collectives)]  # fmt: skip
    for c in record.collectives:
        rows += [c.stage, c.start_ms, c.end_ms, c.nbytes]
    return [float(x) for x in header + rows]


def unpack(values: Sequence[float]) -> dict[str, Any]:
    """A slot as a dict: HEADER's names, `sent` {message: ms handed over}, `received` [(message, bytes, ms consumed,
    ms waited, (wire start, wire end), ms its receive was posted)], `collectives` [Collective], `allreduce_bytes`
    {stage: the gradient bytes its all-reduce summed}."""
    part: dict[str, Any] = dict(zip(HEADER, values, strict=False))
    part["k"], part["stage"] = int(part["k"]), int(part["stage"])
    part["sent"], part["received"] = {}, []
    width, first = len(RECORD), len(HEADER)
    for i in range(int(part["records"])):
        row = values[first + i * width : first + (i + 1) * width]
        sent, grad, boundary, mb, src, dst, nbytes, at_ms, wait_ms, start, end, posted = row
        key: Key = ("grad" if grad else "act", int(boundary), int(mb), int(src), int(dst))
        if sent:
            part["sent"][key] = at_ms
        else:
            part["received"].append((key, nbytes, at_ms, wait_ms, (start, end), posted))
    first += int(part["records"]) * width
    width = len(COLLECTIVE)
    rows = [values[first + i * width : first + (i + 1) * width] for i in range(int(part.get("collective_records", 0)))]
    part["collectives"] = [Collective(int(stage), start, end) for stage, start, end, _ in rows]
    part["allreduce_bytes"] = {int(stage): nbytes for stage, _, _, nbytes in rows}
    return part


def transfers(parts: Sequence[dict[str, Any]], devices: Sequence[int], emulated: bool) -> tuple[Transfer, ...]:
    """Every transfer whose start and arrival are known (see the note), on its (src device, dst device) link."""
    issued = {key: at for p in parts for key, at in p["sent"].items()}
    out = []
    for p in parts:
        for key, nbytes, arrived, wait_ms, wire, posted in p["received"]:
            link = (devices[key[3]], devices[key[4]])
            if emulated:
                out.append(Transfer(link, nbytes, wire[0], wire[1]))
            elif wait_ms > BLOCKED_MS and key in issued:
                start = max(issued[key], posted)
                out.append(Transfer(link, nbytes, start, max(arrived, start)))
    return tuple(sorted(out, key=lambda t: (t.start_ms, t.link)))


def slowest(parts: Sequence[dict[str, Any]], name: str) -> tuple[float, ...]:
    """Per stage, in stage order, the largest value of `name` among its processes (its replicas in every pipeline
    copy): the replica the pipeline waits for."""
    by_stage: dict[int, float] = {}
    for p in parts:
        by_stage[p["stage"]] = max(by_stage.get(p["stage"], p[name]), p[name])
    return tuple(by_stage[s] for s in sorted(by_stage))


def observation(
    index: int, k: int, parts: Sequence[dict[str, Any]], devices: Sequence[int], emulated: bool
) -> IterationObservation:
    """Iteration `index` as the controller observes it: from the earliest start among stage 0's processes to the
    last optimizer step's end, per-stage compute in stage order (a replicated stage's: its slowest replica's, in
    any pipeline copy), every known transfer on its (src device, dst device) link, each stage's emulated all-reduce (once)."""
    start = min(p["start_ms"] for p in parts if p["stage"] == 0)
    return IterationObservation(
        index=index,
        k=k,
        iteration_ms=max(p["end_ms"] for p in parts) - start,
        stage_fwd_ms=slowest(parts, "fwd_ms"),
        stage_bwd_ms=slowest(parts, "bwd_ms"),
        transfers=transfers(parts, devices, emulated),
        start_ms=start,
        collectives=collectives(parts),
    )


def collectives(parts: Sequence[dict[str, Any]]) -> tuple[Collective, ...]:
    """Each stage's all-reduce once (every participant recorded the same span), in stage order."""
    by_stage = {c.stage: c for p in parts for c in p.get("collectives", ())}
    return tuple(by_stage[s] for s in sorted(by_stage))
