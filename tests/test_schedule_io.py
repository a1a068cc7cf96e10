"""Tests of schedule files: pipeplan JSON, torch.distributed.pipelining CSV, and `pipeplan schedule` output."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from pipeplan.cli import main
from pipeplan.core.errors import ScheduleError
from pipeplan.core.schedule import Schedule
from pipeplan.io.schedule_io import (
    SCHEDULE_FORMAT,
    read_schedule_csv,
    read_schedule_json,
    schedule_from_csv,
    schedule_from_json,
    schedule_to_csv,
    schedule_to_json,
    write_schedule_csv,
    write_schedule_json,
)
from pipeplan.schedules import gpipe, make_schedule, one_f_one_b

# (name, p, m, k, v): every generator, with k, v and m < p cases.
CASES = [
    ("gpipe", 1, 1, 1, 1),
    ("gpipe", 4, 6, 1, 1),
    ("1f1b", 4, 8, 1, 1),
    ("1f1b", 5, 3, 1, 1),
    ("kfkb", 4, 9, 3, 1),
    ("interleaved-1f1b", 3, 6, 1, 3),
    ("interleaved-1f1b", 4, 4, 1, 2),
    ("zb-h1", 4, 8, 1, 1),
    ("zb-h1", 6, 2, 1, 1),
]


def make(case: tuple[str, int, int, int, int]) -> Schedule:
    name, p, m, k, v = case
    return make_schedule(name, p, m, k=k, chunks=v)


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_csv_round_trip(case: tuple[str, int, int, int, int]) -> None:
    """Every generator's schedule reads back from its CSV with the same actions and stage placement."""
    schedule = make(case)
    back = schedule_from_csv(schedule_to_csv(schedule))
    assert back.ranks == schedule.ranks
    assert back.stage_to_rank == schedule.stage_to_rank


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_json_round_trip(case: tuple[str, int, int, int, int]) -> None:
    """Every generator's schedule survives JSON text and back, name included."""
    schedule = make(case)
    assert schedule_from_json(json.loads(json.dumps(schedule_to_json(schedule)))) == schedule


def test_csv_text_matches_torch_dump() -> None:
    """One CRLF-terminated row per rank, one action per cell, as csv.writer (torch's _dump_csv) writes."""
    assert schedule_to_csv(gpipe(2, 2)) == "0F0,0F1,0B0,0B1\r\n1F0,1F1,1B0,1B1\r\n"


def test_json_object() -> None:
    """The JSON object holds format, name, sizes, placement and text actions."""
    assert schedule_to_json(make_schedule("interleaved-1f1b", 2, 2, chunks=2)) == {
        "format": "pipeplan.schedule/1",
        "schedule": "interleaved-1f1b",
        "stages": 4,
        "microbatches": 2,
        "stage_to_rank": [0, 1, 0, 1],
        "ranks": [
            ["0F0", "0F1", "2F0", "2F1", "2B0", "2B1", "0B0", "0B1"],
            ["1F0", "1F1", "3F0", "3B0", "3F1", "3B1", "1B0", "1B1"],
        ],
    }


def test_files_round_trip(tmp_path: Path) -> None:
    """write_/read_schedule_json and _csv round-trip through files; JSON bytes are deterministic."""
    schedule = make_schedule("zb-h1", 3, 5)
    write_schedule_json(schedule, tmp_path / "a.json")
    write_schedule_json(schedule, tmp_path / "b.json")
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    assert read_schedule_json(tmp_path / "a.json") == schedule
    write_schedule_csv(schedule, tmp_path / "s.csv")
    assert (tmp_path / "s.csv").read_bytes() == schedule_to_csv(schedule).encode()
    assert read_schedule_csv(tmp_path / "s.csv").ranks == schedule.ranks


def test_csv_empty_cells_are_idle_and_lf_is_accepted() -> None:
    """Empty cells (torch's idle steps) are skipped and LF line ends read like CRLF."""
    back = schedule_from_csv("0F0,,0F1,0B0,,0B1\n,1F0,1B0,1F1,1B1\n")
    assert back.to_text() == [["0F0", "0F1", "0B0", "0B1"], ["1F0", "1B0", "1F1", "1B1"]]


def test_json_without_stage_to_rank_infers_it() -> None:
    """stage_to_rank may be left out of the JSON: each stage goes to the rank that runs it."""
    obj = {"format": SCHEDULE_FORMAT, "ranks": [["0F0", "0B0"], ["1F0", "1B0"]]}
    assert schedule_from_json(obj).stage_to_rank == (0, 1)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0F0,0X1\r\n", r"^s\.csv: row 1 \(rank 0\), cell 2: '0X1' is not an action \(expected e\.g\. '2F0'"),
        ("0F0,0B0\r\n1F0,1SEND_F0\r\n", r"^s\.csv: row 2 \(rank 1\), cell 2: '1SEND_F0' is not an action"),
        ("", r"^s\.csv: no rows \(expected one row of actions per rank\)$"),
        ("0F0,0F1,0B0\r\n", r"^s\.csv: rank 0: missing action 0B1$"),
        ("0F0,0B0\r\n0F1,0B1\r\n", r"^s\.csv: stage 0 appears on rank 0 and on rank 1 \(position 0, action 0F1\)$"),
        ('0F0,"0B0\r\n', r"^s\.csv: not valid CSV: "),
    ],
)
def test_malformed_csv(text: str, message: str) -> None:
    """A bad cell or an invalid schedule is one line naming the source, row, cell and value."""
    with pytest.raises(ScheduleError, match=message):
        schedule_from_csv(text, source="s.csv")


def good_json(**changes: Any) -> dict[str, Any]:
    """A valid 2-rank 1f1b schedule object with some keys replaced."""
    obj = schedule_to_json(one_f_one_b(2, 2))
    obj.update(changes)
    return obj


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        ([], r"^f\.json: a schedule must be a JSON object, got list$"),
        (good_json(format="pipeplan.plan/1"), r"^f\.json: 'format' must be 'pipeplan\.schedule/1', got 'pipeplan\.plan/1'$"),
        (good_json(schedule=3), r"^f\.json: 'schedule' must be a string, got 3$"),
        (good_json(ranks="0F0"), r"^f\.json: 'ranks' must be a non-empty list of lists of actions, got '0F0'$"),
        (good_json(ranks=[]), r"^f\.json: 'ranks' must be a non-empty list"),
        (good_json(ranks=[["0F0", 7]]), r"^f\.json: ranks\[0\]\[1\]: expected an action string such as '2F0', got 7$"),
        (good_json(ranks=[["0F0", "0Q0"]]), r"^f\.json: ranks\[0\]\[1\]: '0Q0' is not an action"),
        (good_json(stage_to_rank=[0, "1"]), r"^f\.json: 'stage_to_rank' must be a list of rank numbers, got \[0, '1'\]$"),
        (good_json(stage_to_rank=[0, 5]), r"^f\.json: stage_to_rank\[1\] must be a rank in 0\.\.1, got 5$"),
        (good_json(stage_to_rank=[1, 0]), r"^f\.json: rank 0, position 0, action 0F0: stage 0 belongs to rank 1$"),
        (good_json(stages=3), r"^f\.json: 'stages' is 3 but the actions have 2$"),
        (good_json(microbatches=4), r"^f\.json: 'microbatches' is 4 but the actions have 2$"),
        (good_json(microbatches="2"), r"^f\.json: 'microbatches' must be an integer, got '2'$"),
    ],
)
def test_malformed_json(obj: object, message: str) -> None:
    """A bad key or cell is one line naming the source, the key or cell, and the value."""
    with pytest.raises(ScheduleError, match=message):
        schedule_from_json(obj, source="f.json")


def test_read_schedule_json_not_json(tmp_path: Path) -> None:
    """A file that is not JSON names the file, line and column."""
    path = tmp_path / "bad.json"
    path.write_text('{"format": ', encoding="utf-8")
    with pytest.raises(ScheduleError, match=r"bad\.json: invalid JSON at line 1 column 12: Expecting value$"):
        read_schedule_json(path)


def test_long_values_are_cut_in_messages() -> None:
    """A huge bad value is shortened so the error stays one readable line."""
    with pytest.raises(ScheduleError) as info:
        schedule_from_json(good_json(ranks="x" * 5000))
    assert len(str(info.value)) < 200
    assert "\n" not in str(info.value)


class _StubStage:
    """The attributes torch's PipelineScheduleMulti reads from its stages, without a process group."""

    def __init__(self, num_stages: int, group_size: int) -> None:
        self.num_stages = num_stages
        self.group_size = group_size
        self.group_rank = 0
        self.stage_index_to_group_rank: dict[int, int] = {}


def _torch_load(path: Path, schedule: Schedule) -> Any:
    pipelining = pytest.importorskip("torch.distributed.pipelining.schedules")
    stage = _StubStage(schedule.num_stages, schedule.num_ranks)
    loader = pipelining.PipelineScheduleMulti([stage], n_microbatches=schedule.num_microbatches)
    loader._load_csv(str(path))
    return loader


@pytest.mark.torch
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_torch_loads_our_csv(tmp_path: Path, case: tuple[str, int, int, int, int]) -> None:
    """torch.distributed.pipelining's _load_csv reads our CSV (gpipe, 1f1b and the rest) to the same actions and placement."""
    pytest.importorskip("torch")
    schedule = make(case)
    path = tmp_path / "schedule.csv"
    write_schedule_csv(schedule, path)
    loader = _torch_load(path, schedule)
    assert [[str(a) for a in loader.pipeline_order[r]] for r in range(schedule.num_ranks)] == schedule.to_text()
    assert [loader.stage_index_to_group_rank[s] for s in range(schedule.num_stages)] == list(schedule.stage_to_rank)


@pytest.mark.torch
def test_we_read_torch_dumped_csv_with_idle_steps(tmp_path: Path) -> None:
    """A CSV that torch's _dump_csv wrote, idle (None) steps included, reads back to the same actions."""
    pytest.importorskip("torch")
    schedule = one_f_one_b(3, 4)
    padded = tmp_path / "padded.csv"
    # torch's own schedules pad ranks with idle steps; write one the way they look (rank r starts r steps late).
    padded.write_text("".join("," * r + line for r, line in enumerate(schedule_to_csv(schedule).splitlines(True))))
    loader = _torch_load(padded, schedule)
    assert loader.pipeline_order[2][:2] == [None, None]
    dumped = tmp_path / "dumped.csv"
    loader._dump_csv(str(dumped))
    back = read_schedule_csv(dumped)
    assert back.ranks == schedule.ranks


def run_cli(argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Run `pipeplan argv...`; return (exit code, stdout, stderr)."""
    monkeypatch.setattr(sys, "argv", ["pipeplan", *argv])
    with pytest.raises(SystemExit) as info:
        main()
    out = capsys.readouterr()
    return int(info.value.code or 0), out.out, out.err


@pytest.mark.parametrize("fmt", ["csv", "json", "text"])
def test_cli_schedule_formats(fmt: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`pipeplan schedule 1f1b -p 4 -m 8 --format F` prints the 1f1b schedule as csv, json or text."""
    code, out, err = run_cli(["schedule", "1f1b", "-p", "4", "-m", "8", "--format", fmt], monkeypatch, capsys)
    assert (code, err) == (0, "")
    expected = one_f_one_b(4, 8)
    if fmt == "csv":
        assert schedule_from_csv(out).ranks == expected.ranks
    elif fmt == "json":
        assert schedule_from_json(json.loads(out)) == expected
    else:
        lines = out.splitlines()
        assert lines[0] == "rank 0: 0F0 0F1 0F2 0F3 0B0 0F4 0B1 0F5 0B2 0F6 0B3 0F7 0B4 0B5 0B6 0B7"
        assert len(lines) == 4


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["1f1b", "-p", "0", "-m", "8"], "stages must be an integer >= 1, got 0"),
        (["1f1b", "-p", "4", "-m", "0"], "microbatches must be an integer >= 1, got 0"),
        (["kfkb", "-p", "4", "-m", "8", "--k", "0"], "k must be an integer >= 1, got 0"),
        (["interleaved-1f1b", "-p", "4", "-m", "8", "-v", "0"], "chunks must be an integer >= 1, got 0"),
        (["interleaved-1f1b", "-p", "4", "-m", "6", "-v", "2"], "got m=6, p=4"),
        (["zb-h2", "-p", "4", "-m", "8"], "unknown schedule 'zb-h2'"),
        (["1f1b", "-p", "4", "-m", "8", "--format", "xml"], "--format must be text, json or csv, got 'xml'"),
    ],
)
def test_cli_schedule_bad_input(
    argv: list[str], message: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Bad input exits with code 2 and one line on stderr naming the value, no traceback."""
    code, out, err = run_cli(["schedule", *argv], monkeypatch, capsys)
    assert code == 2
    assert out == ""
    assert len(err.splitlines()) == 1
    assert err.startswith("error: ScheduleError: ")
    assert message in err


def test_cli_schedule_reads_a_file_and_json_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`schedule FILE.csv --json` converts a torch CSV to pipeplan JSON (the same ranks); --json equals --format json;
    a name without sizes names the missing flag."""
    path = tmp_path / "torch.csv"
    write_schedule_csv(one_f_one_b(2, 3), path)
    code, out, _ = run_cli(["schedule", str(path), "--json"], monkeypatch, capsys)
    assert code == 0
    assert schedule_from_json(json.loads(out)).ranks == one_f_one_b(2, 3).ranks
    code, by_flag, _ = run_cli(["schedule", "1f1b", "-p", "2", "-m", "3", "--json"], monkeypatch, capsys)
    code_fmt, by_format, _ = run_cli(["schedule", "1f1b", "-p", "2", "-m", "3", "--format", "json"], monkeypatch, capsys)
    assert code == code_fmt == 0 and by_flag == by_format
    code, _, err = run_cli(["schedule", "1f1b", "-p", "2"], monkeypatch, capsys)
    assert code == 2 and "schedule 1f1b needs --microbatches" in err


def test_cli_schedule_refuses_sizes_given_with_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A schedule file fixes its own sizes: `schedule FILE -p 4` is an error naming the flag, not a silent no-op."""
    path = tmp_path / "torch.csv"
    write_schedule_csv(one_f_one_b(2, 3), path)
    code, out, err = run_cli(["schedule", str(path), "-p", "4"], monkeypatch, capsys)
    assert code == 2 and out == "" and f"--stages does not apply to the schedule file {path}" in err
