"""Tests of `pipeplan simulate` as a command: tables, timeline files, outputs checked first, one-line errors (NAME:
test_simulate_schedule, --plan: test_simulate_plan_file)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli_runner import run
from pipeplan.cli import app


def test_default_output_is_a_table_with_one_row_per_rank() -> None:
    """Without --json the command prints the summary and per-rank tables."""
    result = CliRunner().invoke(app, ["simulate", "1f1b", "-p", "4", "-m", "8"])
    assert result.exit_code == 0
    assert "1f1b, p=4, m=8" in result.stdout
    assert "iteration time (ms)" in result.stdout and "33" in result.stdout and "27.3%" in result.stdout
    assert sum(1 for line in result.stdout.splitlines() if line.startswith("│    ")) == 4


def test_png_and_timeline_are_written_and_json_stays_clean(tmp_path: Path) -> None:
    """--png and --timeline write their files; with --json stdout holds only the JSON and the notes go to stderr."""
    png, trace = tmp_path / "t.png", tmp_path / "t.json"
    args = ["simulate", "zb-h1", "-p", "4", "-m", "8", "--json", "--png", str(png), "--timeline", str(trace)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0
    assert json.loads(result.stdout)["iteration_time"] > 0
    assert str(png) in result.stderr and str(trace) in result.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    events = json.loads(trace.read_text())["traceEvents"]
    assert sum(1 for e in events if e["ph"] == "X" and e["tid"] == 0) == 4 * 8 * 3


def test_trace_is_the_hidden_old_name_of_timeline(tmp_path: Path) -> None:
    """--trace (the old name, hidden from --help) writes the same bytes as --timeline and says "trace" as it did
    (both at once: refused below)."""
    files = {flag: tmp_path / f"{flag[2:]}.json" for flag in ("--timeline", "--trace")}
    said = {}
    for flag, path in files.items():
        result = CliRunner().invoke(app, ["simulate", "1f1b", "-p", "2", "-m", "2", flag, str(path)])
        assert result.exit_code == 0
        said[flag] = result.stdout.splitlines()[-1]
    assert files["--timeline"].read_bytes() == files["--trace"].read_bytes()
    assert said == {flag: f"wrote Perfetto {flag[2:]} {path} (open in ui.perfetto.dev)" for flag, path in files.items()}
    assert "--trace" not in CliRunner().invoke(app, ["simulate", "--help"]).stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["1f1b", "-p", "4"], "needs --microbatches"),
        (["-p", "4", "-m", "4"], "needs a schedule NAME"),
        (["nope", "-p", "4", "-m", "4"], "unknown schedule 'nope'"),
        (["1f1b", "-p", "0", "-m", "4"], "stages must be an integer >= 1, got 0"),
        (["1f1b", "-p", "abc", "-m", "4"], "Invalid value for '--stages'"),
        (["1f1b", "-p", "2", "-m", "4", "--bogus"], "No such option: --bogus"),
        (["1f1b", "-p", "4", "-m", "4", "--fwd", "-1"], "--fwd values must be finite and >= 0, got '-1'"),
        (["1f1b", "-p", "4", "-m", "4", "--bwd", "nan"], "--bwd values must be finite"),
        (["1f1b", "-p", "4", "-m", "4", "--act-bytes", "64X"], "--act-bytes must be a byte size (e.g. 64M, 1.5GiB)"),
        (["1f1b", "-p", "4", "-m", "4", "--fwd", "1M"], "--fwd must be a number or a comma-separated list"),
        (["1f1b", "-p", "4", "-m", "4", "--fwd", "1,2"], "--fwd needs one number or 4 (one per stage), got 2"),
        (["1f1b", "-p", "4", "-m", "4", "--comm", "1,2,3,4"], "--comm needs one number or 3 (one per stage boundary)"),
        (["interleaved-1f1b", "-p", "4", "-m", "8", "-v", "2", "--bwd", "1,2,3,4"], "4 ranks x 2 chunks"),
        (["interleaved-1f1b", "-p", "4", "-m", "6", "-v", "2"], "a multiple of stages (p), got m=6, p=4"),
        (["1f1b", "-p", "4", "-m", "4", "--profile", "x"], "--profile applies only with --plan"),
        (["1f1b", "--plan", "p.json"], "NAME or --plan, not both"),
        (["--plan", "p.json", "--stages", "4"], "--stages does not apply to --plan"),
        (["--plan", "/no/such/plan.json"], "/no/such/plan.json: cannot read plan: does not exist"),
        (["1f1b", "-p", "2", "-m", "2", "--bandwidth-trace", "/no/such/trace.json"], "cannot read bandwidth trace"),
        (["1f1b", "-p", "2", "-m", "2", "--timeline", "/no/a.json", "--trace", "/b.json"], "--trace is the old name of"),
        (["1f1b", "-p", "4", "-m", "100000000"], "too large: 800,000,000 actions, the limit is 4,000,000 actions, because"),
        (["zb-h1", "-p", "100000", "-m", "100"], "zb-h1 with stages=100000, microbatches=100 too large: 30,000,000 actions"),
        (["/no/such/schedule.csv"], "/no/such/schedule.csv: cannot read schedule: does not exist"),
    ],
)
def test_bad_input_exits_2_with_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    """Each bad input exits with code 2 and one line on stderr that names the value."""
    code, _, err = run(monkeypatch, capsys, "simulate", *args)
    assert code == 2
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: ") and message in err


@pytest.mark.slow
def test_bad_input_in_a_real_process_has_no_traceback() -> None:
    """The installed command exits 2 on a bad cost list and prints no traceback."""
    proc = subprocess.run(
        [sys.executable, "-c", "from pipeplan.cli import main; main()", "simulate", "1f1b", "-p", "4", "-m", "4", "--fwd", "x"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip() == "error: CostError: --fwd must be a number or a comma-separated list of numbers, got 'x'"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--png", "timeline.xyz"], "--png 'timeline.xyz' must end with .png"),
        (["--trace", "/no/such/folder/t.json"], "--trace '/no/such/folder/t.json': folder '/no/such/folder' does not exist"),
    ],
)
def test_outputs_are_checked_before_simulating(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    """A bad output path is an error naming the option before any work (and no matplotlib traceback)."""
    code, _, err = run(monkeypatch, capsys, "simulate", "1f1b", "-p", "2", "-m", "2", *args)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert message in err


def test_a_trace_naming_a_device_the_pipeline_lacks_is_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Link [0, 9] on a 4-rank pipeline: exit 2 naming the step, the link and the device count."""
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps([{"t_ms": 0, "link": [0, 1], "factor": 0.5}, {"t_ms": 5, "link": [0, 9], "factor": 0.5}]))
    code, _, err = run(monkeypatch, capsys, "simulate", "1f1b", "-p", "4", "-m", "4", "--bandwidth-trace", str(trace))
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "bandwidth trace step 1: link [0, 9] names device 9, but 1f1b with p=4 (one device per rank) has 4 devices" in err
