"""Schedule files: pipeplan JSON and torch.distributed.pipelining's compute-only CSV."""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipeplan.core.errors import ScheduleError, ScheduleTooLargeError
from pipeplan.core.limits import ACTIONS, RANKS
from pipeplan.core.schedule import Action, Schedule, infer_stage_to_rank
from pipeplan.core.validate import validate

SCHEDULE_FORMAT = "pipeplan.schedule/1"
"""Value of the "format" key of a schedule JSON file."""


def schedule_to_json(schedule: Schedule) -> dict[str, Any]:
    """The JSON object of a schedule: name, sizes, stage placement and per-rank actions in text form."""
    return {
        "format": SCHEDULE_FORMAT,
        "schedule": schedule.name,
        "stages": schedule.num_stages,
        "microbatches": schedule.num_microbatches,
        "stage_to_rank": list(schedule.stage_to_rank),
        "ranks": schedule.to_text(),
    }


def _short(value: object, limit: int = 80) -> str:
    """repr of value, cut to `limit` characters so an error stays one readable line."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _parse_cell(cell: object, where: str) -> Action | None:
    """An action from one cell; None for an empty (idle) cell."""
    if not isinstance(cell, str):
        raise ScheduleError(f"{where}: expected an action string such as '2F0', got {_short(cell)}")
    if cell.strip() == "":
        return None
    try:
        return Action.parse(cell)
    except ScheduleTooLargeError as exc:
        raise ScheduleTooLargeError(f"{where}: {exc}") from None
    except ScheduleError:
        expected = "expected e.g. '2F0': stage, op in FBIWU, microbatch"
        raise ScheduleError(f"{where}: {_short(cell)} is not an action ({expected})") from None


def _build(ranks: tuple[tuple[Action, ...], ...], stage_to_rank: Sequence[int] | None, name: str, source: str) -> Schedule:
    """Assemble and validate a schedule read from `source`, prefixing any error with the source."""
    try:
        placement = tuple(stage_to_rank) if stage_to_rank is not None else infer_stage_to_rank(ranks)
        return validate(Schedule(ranks, placement, name))
    except ScheduleError as exc:
        raise ScheduleError(f"{source}: {exc}") from None


def _int_field(obj: dict[str, Any], key: str, source: str) -> int | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ScheduleError(f"{source}: {key!r} must be an integer, got {_short(value)}")
    return value


def schedule_from_json(obj: object, source: str = "schedule JSON") -> Schedule:
    """Read a schedule from its JSON object (as written by schedule_to_json) and validate it.

    `stage_to_rank` may be left out (each stage goes to the rank that runs
    it); `stages` and `microbatches`, when present, must match the actions.

    Raises:
        ScheduleError: naming `source`, the key or cell, and the bad value.
    """
    if not isinstance(obj, dict):
        raise ScheduleError(f"{source}: a schedule must be a JSON object, got {type(obj).__name__}")
    fmt = obj.get("format")
    if fmt != SCHEDULE_FORMAT:
        raise ScheduleError(f"{source}: 'format' must be {SCHEDULE_FORMAT!r}, got {fmt!r}")
    name = obj.get("schedule", "")
    if not isinstance(name, str):
        raise ScheduleError(f"{source}: 'schedule' must be a string, got {_short(name)}")
    rows = obj.get("ranks")
    if not isinstance(rows, list) or not rows or not all(isinstance(row, list) for row in rows):
        raise ScheduleError(f"{source}: 'ranks' must be a non-empty list of lists of actions, got {_short(rows)}")
    RANKS.check(ScheduleTooLargeError, f"{source}: 'ranks'", len(rows))
    ACTIONS.check(ScheduleTooLargeError, f"{source}: 'ranks'", sum(len(row) for row in rows))
    ranks = tuple(
        tuple(a for i, cell in enumerate(row) if (a := _parse_cell(cell, f"{source}: ranks[{r}][{i}]")) is not None)
        for r, row in enumerate(rows)
    )
    placement = obj.get("stage_to_rank")
    if placement is not None and (
        not isinstance(placement, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in placement)
    ):
        raise ScheduleError(f"{source}: 'stage_to_rank' must be a list of rank numbers, got {_short(placement)}")
    schedule = _build(ranks, placement, name, source)
    for key, actual in (("stages", schedule.num_stages), ("microbatches", schedule.num_microbatches)):
        declared = _int_field(obj, key, source)
        if declared is not None and declared != actual:
            raise ScheduleError(f"{source}: {key!r} is {declared} but the actions have {actual}")
    return schedule


def read_schedule_json(path: str | Path) -> Schedule:
    """Read and validate a schedule JSON file.

    Raises:
        ScheduleError: the file cannot be read (what stands there, its size), is not JSON, or not a valid schedule
            (naming the file).
    """
    from pipeplan.io.json_fields import load_json_file

    return schedule_from_json(load_json_file(path, ScheduleError, "schedule"), source=os.fspath(path))


def write_schedule_json(schedule: Schedule, path: str | Path) -> None:
    """Write a schedule as indented JSON with sorted keys (same schedule, same bytes), whole or not at all."""
    from pipeplan.io.atomic import write_text_atomic

    write_text_atomic(path, json.dumps(schedule_to_json(schedule), indent=2, sort_keys=True) + "\n")


def schedule_to_csv(schedule: Schedule) -> str:
    """The compute-only CSV of torch.distributed.pipelining: one row per rank, one action per cell.

    Note:
        Written with the csv module's default dialect, as torch's
        `_dump_csv` does, so the text matches byte for byte (rows end in
        CRLF). pipeplan orders actions without time steps, so no idle cells
        are written.
    """
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    for row in schedule.to_text():
        writer.writerow(row)
    return buffer.getvalue()


def schedule_from_csv(text: str, source: str = "schedule CSV", name: str = "") -> Schedule:
    """Read a compute-only CSV (row r = rank r; empty cells are idle) and validate it.

    Each stage goes to the rank whose row holds it, as in torch's `_load_csv`.

    Raises:
        ScheduleError: naming `source`, the rank (row) and cell, and the bad value.
    """
    parsed: list[tuple[Action, ...]] = []
    count = 0
    try:
        for r, row in enumerate(csv.reader(io.StringIO(text, newline=""), strict=True)):
            RANKS.check(ScheduleTooLargeError, f"{source}: schedule", r + 1)  # before the row is parsed
            count += sum(1 for cell in row if cell.strip())
            ACTIONS.check(ScheduleTooLargeError, f"{source}: schedule", count)
            where = f"{source}: row {r + 1} (rank {r}), cell "
            parsed.append(tuple(a for c, cell in enumerate(row) if (a := _parse_cell(cell, f"{where}{c + 1}")) is not None))
    except csv.Error as exc:
        raise ScheduleError(f"{source}: not valid CSV: {exc}") from None
    if not parsed:
        raise ScheduleError(f"{source}: no rows (expected one row of actions per rank)")
    return _build(tuple(parsed), None, name, source)


def read_schedule_csv(path: str | Path) -> Schedule:
    """Read and validate a compute-only CSV schedule file (for example one torch's `_dump_csv` wrote).

    Raises:
        ScheduleError: the file cannot be read (what stands there, its size), a malformed cell or an invalid schedule
            (naming the file).
    """
    from pipeplan.io.files import read_input_text

    text = read_input_text(path, "schedule", ScheduleError)
    return schedule_from_csv(text, source=os.fspath(path), name=Path(path).stem)


def write_schedule_csv(schedule: Schedule, path: str | Path) -> None:
    """Write the compute-only CSV of a schedule (loadable by torch's `_load_csv`), whole or not at all."""
    from pipeplan.io.atomic import write_text_atomic

    write_text_atomic(path, schedule_to_csv(schedule))
