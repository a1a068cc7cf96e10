"""pipeplan's bandwidth-trace format, `pipeplan.bandwidth_trace/1`: read (`read_bandwidth_trace`, any file simulate,
plan, adapt and train take) and written (`write_bandwidth_trace`, what `pipeplan trace` makes).

A file is a JSON list of steps {"t_ms", "link": [a, b] | "all", "factor"}
sorted by t_ms, or an object {"format", "generator", "steps"} (the generator:
how `pipeplan trace` made it, read and ignored). The value is
core.hardware.bandwidth_trace.BandwidthTrace.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pipeplan.core.errors import CostError
from pipeplan.core.hardware.bandwidth_trace import BandwidthTrace, TraceStep, check_step
from pipeplan.core.hardware.links import Link
from pipeplan.core.limits import TRACE_STEPS
from pipeplan.io.json_fields import load_json_file

TRACE_FORMAT = "pipeplan.bandwidth_trace/1"
"""The "format" of a bandwidth-trace file."""


def bandwidth_trace_to_json(trace: BandwidthTrace) -> list[dict[str, Any]]:
    """The steps' JSON list form, read by `bandwidth_trace_from_json`."""
    return [
        {"t_ms": s.t_ms, "link": "all" if s.link is None else [s.link[0], s.link[1]], "factor": s.factor} for s in trace.steps
    ]


def write_bandwidth_trace(trace: BandwidthTrace, path: str | os.PathLike[str], generator: dict[str, Any]) -> None:
    """Write {"format", "generator", "steps"} to `path`, whole or not at all (io.atomic).

    Raises:
        OutputError: the file cannot be written (a full disk: NoSpaceError), naming it.
    """
    from pipeplan.io.atomic import write_text_atomic
    from pipeplan.io.file_kinds import BANDWIDTH_TRACE

    obj = {"format": TRACE_FORMAT, "generator": generator, "steps": bandwidth_trace_to_json(trace)}
    write_text_atomic(path, json.dumps(obj, indent=1, sort_keys=True) + "\n", BANDWIDTH_TRACE)


def bandwidth_trace_from_json(obj: object) -> BandwidthTrace:
    """Build a trace from its JSON form: a list of {"t_ms", "link": [a, b] | "all", "factor"}, sorted by t_ms.

    An object {"steps": [...]} (optionally with "format": "pipeplan.bandwidth_trace/1" and "generator": {...}, how
    `pipeplan trace` made it; read and ignored) is accepted too.

    Raises:
        CostError: naming the bad entry and value.
    """
    if isinstance(obj, dict):
        unknown = sorted(set(obj) - {"format", "steps", "generator"})
        if unknown:
            raise CostError(f"bandwidth trace: unknown key {unknown[0]!r} (expected 'steps', 'format', 'generator')")
        fmt = obj.get("format", TRACE_FORMAT)
        if fmt != TRACE_FORMAT:
            raise CostError(f"bandwidth trace: format must be 'pipeplan.bandwidth_trace/1', got {fmt!r}")
        obj = obj.get("steps")
    if not isinstance(obj, list):
        raise CostError(f"bandwidth trace must be a JSON list of steps, got {type(obj).__name__}")
    TRACE_STEPS.check(CostError, "bandwidth trace", len(obj))  # before any step is built
    steps = []
    for i, entry in enumerate(obj):
        if not isinstance(entry, dict):
            raise CostError(f"bandwidth trace entry {i} must be an object with t_ms, link, factor, got {entry!r}")
        unknown = sorted(set(entry) - {"t_ms", "link", "factor"})
        if unknown:
            raise CostError(f"bandwidth trace entry {i}: unknown key {unknown[0]!r} (expected t_ms, link, factor)")
        missing = [k for k in ("t_ms", "link", "factor") if k not in entry]
        if missing:
            raise CostError(f"bandwidth trace entry {i}: missing {missing[0]!r}")
        raw_link = entry["link"]
        if raw_link == "all":
            link: Link | None = None
        elif isinstance(raw_link, list):
            link = tuple(raw_link)  # type: ignore[assignment]
        else:
            raise CostError(f'bandwidth trace entry {i}: link must be "all" or [a, b], got {raw_link!r}')
        check_step(i, entry["t_ms"], link, entry["factor"])
        steps.append(TraceStep(float(entry["t_ms"]), link, float(entry["factor"])))
    return BandwidthTrace(tuple(steps))  # checks the order


def read_bandwidth_trace(path: str | Path) -> BandwidthTrace:
    """Read a bandwidth trace JSON file (through io's one JSON reader).

    Raises:
        CostError: the file cannot be read (what stands there, its size), is not JSON, or has a bad entry.
    """
    obj = load_json_file(path, CostError, "bandwidth trace")
    try:
        return bandwidth_trace_from_json(obj)
    except CostError as exc:
        raise CostError(f"{os.fspath(path)}: {exc}") from None
