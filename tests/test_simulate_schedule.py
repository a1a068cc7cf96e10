"""Tests of cli/simulate_schedule.py: `simulate NAME` with the synthetic costs of its flags, as the library gives them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cli_runner import run, simulate_json
from pipeplan.io.bandwidth_trace_json import read_bandwidth_trace
from pipeplan.schedules import make_schedule
from pipeplan.sim import simulate, uniform_costs


def library_json(name: str, p: int, m: int, k: int = 1, chunks: int = 1, trace: object = None, **costs: Any) -> dict[str, Any]:
    """What the library gives for the same schedule and costs, through JSON as the CLI prints it."""
    schedule = make_schedule(name, p, m, k=k, chunks=chunks)
    result = simulate(schedule, uniform_costs(schedule, **{"fwd": 1.0, "bwd": 2.0, **costs}), trace=trace)
    return json.loads(json.dumps(result.to_json()))


def test_json_equals_the_library_for_uniform_costs() -> None:
    """--json prints exactly SimResult.to_json() of the same schedule and costs."""
    got = simulate_json("1f1b", "-p", "4", "-m", "8", "--fwd", "1", "--bwd", "2", "--comm", "0.5", "--act-bytes", "100")
    assert got == library_json("1f1b", 4, 8, comm=0.5, act_bytes=100.0)
    assert got["per_rank"][0]["peak_memory_bytes"] == 4 * 100.0


def test_act_bytes_takes_size_suffixes() -> None:
    """--act-bytes 64M is 64e6 bytes, 1.5Gi is 1.5 * 2**30; a list may mix them (one per stage)."""
    got = simulate_json("1f1b", "-p", "2", "-m", "4", "--act-bytes", "64M,1.5Gi")
    assert [r["peak_memory_bytes"] for r in got["per_rank"]] == [2 * 64e6, 1 * 1.5 * 2**30]
    assert got == library_json("1f1b", 2, 4, act_bytes=[64e6, 1.5 * 2**30])


def test_defaults_are_fwd_1_bwd_2_no_transfer_time() -> None:
    """Without cost flags, gpipe takes (m + p - 1)(1 + 2) ms."""
    got = simulate_json("gpipe", "--stages", "3", "--microbatches", "5")
    assert got["iteration_time"] == pytest.approx((5 + 3 - 1) * 3.0)
    assert got["bubble_fraction"] == pytest.approx(2 / 7)


def test_lists_give_one_value_per_stage_and_per_boundary() -> None:
    """Comma lists set each stage's F and B and each boundary's transfer time."""
    got = simulate_json("kfkb", "-p", "3", "-m", "6", "--k", "2", "--fwd", "1,2,1", "--bwd", "2,3,2", "--comm", "0.25,0.5")
    assert got == library_json("kfkb", 3, 6, k=2, fwd=[1.0, 2.0, 1.0], bwd=[2.0, 3.0, 2.0], comm=[0.25, 0.5])


def test_interleaved_single_numbers_are_split_over_the_chunks() -> None:
    """For interleaved-1f1b, one --fwd/--bwd/--act-bytes number is a full stage's: each of v chunks gets 1/v."""
    got = simulate_json("interleaved-1f1b", "-p", "4", "-m", "8", "-v", "2", "--fwd", "2", "--bwd", "4", "--act-bytes", "64")
    assert got == library_json("interleaved-1f1b", 4, 8, chunks=2, fwd=1.0, bwd=2.0, act_bytes=32.0)
    # Closed form with per-full-stage f = 2, b = 4 and no transfer time: (m + (p - 1) / v)(f + b).
    assert got["iteration_time"] == pytest.approx((8 + 3 / 2) * 6.0)


def test_interleaved_lists_give_one_value_per_chunk_stage() -> None:
    """A list for interleaved-1f1b has p * v entries, one per chunk-stage."""
    fwd = [0.5, 0.5, 0.5, 0.5, 1.0, 1.0, 1.0, 1.0]
    got = simulate_json("interleaved-1f1b", "-p", "4", "-m", "4", "-v", "2", "--fwd", ",".join(map(str, fwd)), "--comm", "0.1")
    assert got == library_json("interleaved-1f1b", 4, 4, chunks=2, fwd=fwd, bwd=1.0, comm=0.1)


def test_zero_bubble_takes_the_input_weight_split() -> None:
    """--bwd-input and --bwd-weight reach the simulator for zb-h1."""
    got = simulate_json("zb-h1", "-p", "4", "-m", "8", "--bwd-input", "1.5", "--bwd-weight", "0.5")
    assert got == library_json("zb-h1", 4, 8, bwd_input=1.5, bwd_weight=0.5)


def test_bandwidth_trace_slows_transfers(tmp_path: Path) -> None:
    """A trace halving every link from t=0 gives the library's result under the same trace, slower than without."""
    path = tmp_path / "bw.json"
    path.write_text(json.dumps([{"t_ms": 0, "link": "all", "factor": 0.5}]))
    got = simulate_json("1f1b", "-p", "3", "-m", "4", "--comm", "1", "--bandwidth-trace", str(path))
    assert got == library_json("1f1b", 3, 4, comm=1.0, trace=read_bandwidth_trace(path))
    assert got["iteration_time"] > library_json("1f1b", 3, 4, comm=1.0)["iteration_time"]


def test_a_schedule_file_simulates_as_its_generator_does(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A torch-format CSV of 1f1b (p=3, m=5) simulates exactly as `simulate 1f1b -p 3 -m 5`, named by its file; sizes
    given beside a file are refused."""
    from pipeplan.io.schedule_io import write_schedule_csv

    path = tmp_path / "mine.csv"
    write_schedule_csv(make_schedule("1f1b", 3, 5), path)
    from_file = simulate_json(str(path), "--fwd", "1,2,1", "--comm", "0.5")
    generated = simulate_json("1f1b", "-p", "3", "-m", "5", "--fwd", "1,2,1", "--comm", "0.5")
    assert from_file["schedule"] == "mine"
    assert {**from_file, "schedule": "1f1b"} == generated
    code, _, err = run(monkeypatch, capsys, "simulate", str(path), "-m", "5")
    assert code == 2 and "--microbatches does not apply to the schedule file" in err


def test_pipemare_reports_its_steady_state_delays_and_weight_copies() -> None:
    """`simulate pipemare --json`: the usual timings plus utilization over the steady window (1.0 for equal stages),
    the delays the order gives (ceil((p - s - 1) / m)), and two weight copies per stage against stashing's count."""
    got = simulate_json("pipemare", "-p", "4", "-m", "2")
    assert got["schedule"] == "pipemare" and got["iteration_time"] > 0
    mare = got["pipemare"]
    assert mare["utilization"] == pytest.approx(1.0)
    assert mare["delays"] == [2, 1, 1, 0]
    assert mare["memory"] == {"weight_copies": [2, 2, 2, 2], "weight_stashing_copies": [3, 2, 2, 1]}
    longer = simulate_json("pipemare", "-p", "4", "-m", "2", "--minibatches", "20")
    assert longer["pipemare"]["delays"] == mare["delays"] and longer["iteration_time"] > got["iteration_time"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["1f1b", "-p", "2", "-m", "2", "--minibatches", "4"], "--minibatches applies only to pipemare"),
        (["pipemare", "-p", "4", "-m", "2", "--minibatches", "5"], "a steady window needs at least 6"),
        (["pipemare", "-p", "4", "-m", "2", "--minibatches", "0"], "minibatches must be an integer >= 1, got 0"),
    ],
)
def test_bad_pipemare_options_are_one_line_errors(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    """--minibatches on a synchronous schedule, too few for a steady window, or below 1: exit 2, one line."""
    code, _, err = run(monkeypatch, capsys, "simulate", *args)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert message in err


def test_iterations_beyond_the_work_limit_are_refused_before_the_schedule_is_made(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """simulate --iterations 1,000,000,000: exit 2, one line naming the flag, the events and the most that fit, before
    any schedule is generated or iteration simulated; the largest count it names runs."""
    import pipeplan.presets.resolve as resolve

    real = resolve.load_schedule
    monkeypatch.setattr(resolve, "load_schedule", lambda *a, **k: pytest.fail("generated a schedule"))
    code, out, err = run(monkeypatch, capsys, "simulate", "1f1b", "-p", "4", "-m", "8", "--iterations", "1000000000")
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ScheduleTooLargeError: simulating 1f1b with p=4, m=8 (--iterations")
    assert "the limit is 24,000,000 events" in lines[0]
    most = int(lines[0].rsplit("use --iterations ", 1)[1].split(" ")[0].replace(",", ""))
    code, _, err = run(monkeypatch, capsys, "simulate", "1f1b", "-p", "4", "-m", "8", "--iterations", str(most + 1))
    assert code == 2 and f"use --iterations {most:,} or fewer" in err
    monkeypatch.setattr(resolve, "load_schedule", real)
    import pipeplan.sim.engine.iterations as iterations_module

    monkeypatch.setattr(iterations_module, "simulate_iterations", lambda *a, **k: None)  # priced, not run
    assert run(monkeypatch, capsys, "simulate", "1f1b", "-p", "4", "-m", "8", "--iterations", str(most))[0] != 2


def test_a_schedule_file_is_priced_once_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A schedule file's size is known once it is read: its iterations are refused then, before any simulation."""
    import pipeplan.sim.engine.iterations as iterations_module

    path = tmp_path / "s.json"
    code, out, _ = run(monkeypatch, capsys, "schedule", "gpipe", "-p", "2", "-m", "2", "--format", "json")
    assert code == 0
    path.write_text(out)
    monkeypatch.setattr(iterations_module, "simulate_iterations", lambda *a, **k: pytest.fail("simulated"))
    code, _, err = run(monkeypatch, capsys, "simulate", str(path), "--iterations", "10000000000")
    assert code == 2 and "--iterations 10,000,000,000) too large" in err and len(err.strip().splitlines()) == 1
