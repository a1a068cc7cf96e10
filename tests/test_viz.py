"""Tests of viz: the Gantt PNG, the Perfetto timeline and the rich tables, on hand-built results."""

from __future__ import annotations

import dataclasses
import io
import json
import struct
from pathlib import Path

import pytest
from rich.console import Console

from pipeplan.sim.result import ComputeSpan, RankStats, SimResult, TransferSpan
from pipeplan.viz.gantt import figure_size, render_gantt
from pipeplan.viz.perfetto import timeline_events, write_timeline
from pipeplan.viz.tables import comparison_table, format_bytes, rank_table, summary_table, wide_console


def two_rank_result() -> SimResult:
    """1f1b with p=2, m=2, F=1, B=2 and 0.5 ms transfers, timed by hand."""
    compute = (
        ComputeSpan(0, 0, "F", 0, 0.0, 1.0),
        ComputeSpan(0, 0, "F", 1, 1.0, 2.0),
        ComputeSpan(1, 1, "F", 0, 1.5, 2.5),
        ComputeSpan(1, 1, "B", 0, 2.5, 4.5),
        ComputeSpan(1, 1, "F", 1, 4.5, 5.5),
        ComputeSpan(0, 0, "B", 0, 5.0, 7.0),
        ComputeSpan(1, 1, "B", 1, 5.5, 7.5),
        ComputeSpan(0, 0, "B", 1, 8.0, 10.0),
    )
    transfers = (
        TransferSpan(0, 1, 0, 1, "act", 0, 1.0, 1.5),
        TransferSpan(0, 1, 0, 1, "act", 1, 2.0, 2.5),
        TransferSpan(1, 0, 1, 0, "grad", 0, 4.5, 5.0),
        TransferSpan(1, 0, 1, 0, "grad", 1, 7.5, 8.0),
    )
    per_rank = (RankStats(6.0, 4.0, 2, 2 * 64.0), RankStats(6.0, 4.0, 1, 64.0))
    return SimResult(10.0, 9.0, 0.4, per_rank, (2, 1), compute, transfers, "1f1b")


def chain_result(ranks: int, microbatches: int, split: bool = False, chunks: int = 1) -> SimResult:
    """A GPipe-like timeline of `ranks` ranks (each with `chunks` stages) and no transfers, for shape tests."""
    compute = []
    ops = ("F", "I", "W") if split else ("F", "B")
    for r in range(ranks):
        t = float(r)
        for c in range(chunks):
            for op in ops:
                for mb in range(microbatches):
                    compute.append(ComputeSpan(r, c * ranks + r, op, mb, t, t + 1.0))
                    t += 1.0
    end = max(s.end_ms for s in compute)
    per_rank = tuple(RankStats(float(len(ops) * microbatches * chunks), 0.0, microbatches, 0.0) for _ in range(ranks))
    return SimResult(end, end, 0.0, per_rank, (microbatches,) * ranks * chunks, tuple(compute), (), "chain")


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from a PNG file's IHDR chunk."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_gantt_writes_a_png_of_the_expected_size(tmp_path: Path) -> None:
    """A small timeline is an 8-inch-wide PNG at 120 dpi, taller than one rank row."""
    path = tmp_path / "t.png"
    render_gantt(two_rank_result(), str(path))
    width, height = png_size(path)
    assert width == 8 * 120
    assert 200 < height < 800
    assert path.stat().st_size > 10_000


@pytest.mark.slow
def test_gantt_grows_with_actions_and_ranks_and_stays_capped(tmp_path: Path) -> None:
    """More actions per rank widen the figure, more ranks heighten it, and both stop at a cap."""
    sizes = {}
    for key, result in {
        "small": chain_result(2, 4),
        "long": chain_result(2, 40),
        "tall": chain_result(16, 4),
    }.items():
        path = tmp_path / f"{key}.png"
        render_gantt(result, str(path))
        sizes[key] = png_size(path)
    assert sizes["long"][0] > sizes["small"][0]
    assert sizes["tall"][1] > sizes["small"][1]
    assert figure_size(64, 2048, 1.35) == (32.0, 30.0)
    assert figure_size(1, 1, 1.35) == (8.0, 1.6 + 0.5 * 1.35)


def test_gantt_is_byte_identical_for_the_same_result(tmp_path: Path) -> None:
    """Rendering the same result twice gives the same bytes."""
    a, b = tmp_path / "a.png", tmp_path / "b.png"
    render_gantt(two_rank_result(), str(a))
    render_gantt(two_rank_result(), str(b))
    assert a.read_bytes() == b.read_bytes()


def test_gantt_draws_transfer_rows_only_when_asked(tmp_path: Path) -> None:
    """The transfer sub-rows make the figure taller; show_transfers=False leaves them out."""
    with_rows, without = tmp_path / "with.png", tmp_path / "without.png"
    render_gantt(two_rank_result(), str(with_rows))
    render_gantt(two_rank_result(), str(without), show_transfers=False)
    assert png_size(with_rows)[1] > png_size(without)[1]


def test_gantt_handles_split_backward_and_chunks(tmp_path: Path) -> None:
    """I/W ops and several stages per rank render, with a different picture from the plain F/B chain."""
    paths = [tmp_path / f"{i}.png" for i in range(3)]
    render_gantt(chain_result(4, 8), str(paths[0]))
    render_gantt(chain_result(4, 8, split=True), str(paths[1]))
    render_gantt(chain_result(4, 4, chunks=2), str(paths[2]))
    contents = {p.read_bytes() for p in paths}
    assert len(contents) == 3


def test_trace_has_one_complete_event_per_action_with_exact_times() -> None:
    """Every compute span becomes one "X" event named like 2F0 with ts/dur in microseconds."""
    result = two_rank_result()
    trace = timeline_events(result)
    assert trace["displayTimeUnit"] == "ms"
    compute = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["tid"] == 0]
    assert len(compute) == len(result.compute)
    by_name = {(e["pid"], e["name"]): e for e in compute}
    for span in result.compute:
        event = by_name[(span.rank, f"{span.stage}{span.op}{span.microbatch}")]
        assert event["ts"] == span.start_ms * 1000.0
        assert event["dur"] == (span.end_ms - span.start_ms) * 1000.0
        assert event["args"] == {"stage": span.stage, "op": span.op, "microbatch": span.microbatch}
    assert by_name[(0, "0B1")]["ts"] == 8000.0 and by_name[(0, "0B1")]["dur"] == 2000.0


def test_trace_puts_transfers_on_the_senders_send_thread() -> None:
    """Transfers are complete events on thread 1 of the sending rank, with their endpoints in args."""
    trace = timeline_events(two_rank_result())
    sends = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["tid"] == 1]
    assert [(e["pid"], e["name"], e["ts"], e["dur"]) for e in sends] == [
        (0, "act 0->1 mb0", 1000.0, 500.0),
        (0, "act 0->1 mb1", 2000.0, 500.0),
        (1, "grad 1->0 mb0", 4500.0, 500.0),
        (1, "grad 1->0 mb1", 7500.0, 500.0),
    ]
    assert sends[2]["args"]["dst_rank"] == 0


def test_trace_names_each_rank_process_and_its_threads() -> None:
    """Metadata events name process r "rank r" and its threads "compute" and "send"."""
    meta = [e for e in timeline_events(two_rank_result())["traceEvents"] if e["ph"] == "M"]
    names = {(e["pid"], e.get("tid"), e["name"]): e["args"] for e in meta}
    assert names[(1, None, "process_name")] == {"name": "rank 1"}
    assert names[(0, 0, "thread_name")] == {"name": "compute"}
    assert names[(1, 1, "thread_name")] == {"name": "send"}


def test_trace_leaves_out_transfers_that_take_no_time() -> None:
    """With zero-duration transfers there is no send thread and no transfer event."""
    result = two_rank_result()
    instant = tuple(t._replace(end_ms=t.start_ms) for t in result.transfers)
    events = timeline_events(dataclasses.replace(result, transfers=instant))
    assert all(e.get("tid") != 1 for e in events["traceEvents"])


def test_write_timeline_is_loadable_and_deterministic(tmp_path: Path) -> None:
    """The trace file is JSON equal to timeline_events, and byte-identical across writes."""
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    write_timeline(two_rank_result(), str(a))
    write_timeline(two_rank_result(), str(b))
    assert a.read_bytes() == b.read_bytes()
    assert json.loads(a.read_text()) == timeline_events(two_rank_result())


def test_format_bytes_uses_binary_prefixes() -> None:
    """Sizes print with B, KiB, MiB, GiB and three significant digits."""
    assert format_bytes(0) == "0 B"
    assert format_bytes(512) == "512 B"
    assert format_bytes(64 * 2**20) == "64 MiB"
    assert format_bytes(1.5 * 2**30) == "1.5 GiB"
    assert format_bytes(300 * 2**30) == "300 GiB"


def render(table: object) -> str:
    """A rich renderable as plain text."""
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(table)
    return console.export_text()


def test_tables_show_times_bubble_and_per_rank_memory() -> None:
    """The summary, per-rank and comparison tables carry the result's numbers."""
    result = two_rank_result()
    summary = render(summary_table(result))
    assert "10" in summary and "40.0%" in summary and "90.0%" in summary
    ranks = render(rank_table(result))
    assert "128 B" in ranks and "64 B" in ranks and "60.0%" in ranks
    compare = render(comparison_table([("one", result), ("two", chain_result(2, 2))]))
    assert "one" in compare and "two" in compare and "peak B/rank" in compare and "128/64" in compare


def test_comparison_table_uses_one_unit_and_summarizes_many_ranks() -> None:
    """Memory prints in the unit of the largest peak; past 8 ranks only max and min are shown."""
    mib = float(2**20)
    small = dataclasses.replace(two_rank_result(), per_rank=(RankStats(1, 0, 1, 300 * mib), RankStats(1, 0, 1, 512.0)))
    many = dataclasses.replace(chain_result(10, 1), per_rank=tuple(RankStats(1, 0, 1, (i + 1) * 2048 * mib) for i in range(10)))
    text = render(comparison_table([("small", small), ("many", many)]))
    assert "peak GiB/rank" in text
    assert "0.293/<0.01" in text
    assert "20 max, 2 min" in text


def test_tables_piped_to_a_file_are_at_least_120_columns_wide(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a terminal or COLUMNS rich assumes 80 columns and wraps compare's table; wide_console does not."""
    monkeypatch.delenv("COLUMNS", raising=False)
    assert Console().width == 80
    assert wide_console().width == 120
    assert wide_console(140).width == 140
    monkeypatch.setenv("COLUMNS", "200")
    assert wide_console().width == 200
