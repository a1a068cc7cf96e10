"""Tests of `pipeplan simulate`: JSON equal to the library's, tables, files, --plan, and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from models import default_model, linear_model
from pipeplan.cli import app, main
from pipeplan.core.plan import Plan, Stage
from pipeplan.io.plan_json import write_plan
from pipeplan.presets.resolve import load_cluster, load_profile
from pipeplan.schedules import make_schedule
from pipeplan.sim import read_bandwidth_trace, simulate, uniform_costs
from pipeplan.sim.plan_sim import simulate_plan


def run_json(*args: str) -> dict[str, Any]:
    """Run `pipeplan simulate ... --json` in-process and parse its stdout."""
    result = CliRunner().invoke(app, ["simulate", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def library_json(name: str, p: int, m: int, k: int = 1, chunks: int = 1, trace: object = None, **costs: Any) -> dict[str, Any]:
    """What the library gives for the same schedule and costs, through JSON as the CLI prints it."""
    schedule = make_schedule(name, p, m, k=k, chunks=chunks)
    result = simulate(schedule, uniform_costs(schedule, **{"fwd": 1.0, "bwd": 2.0, **costs}), trace=trace)
    return json.loads(json.dumps(result.to_json()))


def test_json_equals_the_library_for_uniform_costs() -> None:
    """--json prints exactly SimResult.to_json() of the same schedule and costs."""
    got = run_json("1f1b", "-p", "4", "-m", "8", "--fwd", "1", "--bwd", "2", "--comm", "0.5", "--act-bytes", "100")
    assert got == library_json("1f1b", 4, 8, comm=0.5, act_bytes=100.0)
    assert got["per_rank"][0]["peak_memory_bytes"] == 4 * 100.0


def test_act_bytes_takes_size_suffixes() -> None:
    """--act-bytes 64M is 64e6 bytes, 1.5Gi is 1.5 * 2**30; a list may mix them (one per stage)."""
    got = run_json("1f1b", "-p", "2", "-m", "4", "--act-bytes", "64M,1.5Gi")
    assert [r["peak_memory_bytes"] for r in got["per_rank"]] == [2 * 64e6, 1 * 1.5 * 2**30]
    assert got == library_json("1f1b", 2, 4, act_bytes=[64e6, 1.5 * 2**30])


def test_defaults_are_fwd_1_bwd_2_no_transfer_time() -> None:
    """Without cost flags, gpipe takes (m + p - 1)(1 + 2) ms."""
    got = run_json("gpipe", "--stages", "3", "--microbatches", "5")
    assert got["iteration_time"] == pytest.approx((5 + 3 - 1) * 3.0)
    assert got["bubble_fraction"] == pytest.approx(2 / 7)


def test_lists_give_one_value_per_stage_and_per_boundary() -> None:
    """Comma lists set each stage's F and B and each boundary's transfer time."""
    got = run_json("kfkb", "-p", "3", "-m", "6", "--k", "2", "--fwd", "1,2,1", "--bwd", "2,3,2", "--comm", "0.25,0.5")
    assert got == library_json("kfkb", 3, 6, k=2, fwd=[1.0, 2.0, 1.0], bwd=[2.0, 3.0, 2.0], comm=[0.25, 0.5])


def test_interleaved_single_numbers_are_split_over_the_chunks() -> None:
    """For interleaved-1f1b, one --fwd/--bwd/--act-bytes number is a full stage's: each of v chunks gets 1/v."""
    got = run_json("interleaved-1f1b", "-p", "4", "-m", "8", "-v", "2", "--fwd", "2", "--bwd", "4", "--act-bytes", "64")
    assert got == library_json("interleaved-1f1b", 4, 8, chunks=2, fwd=1.0, bwd=2.0, act_bytes=32.0)
    # Closed form with per-full-stage f = 2, b = 4 and no transfer time: (m + (p - 1) / v)(f + b).
    assert got["iteration_time"] == pytest.approx((8 + 3 / 2) * 6.0)


def test_interleaved_lists_give_one_value_per_chunk_stage() -> None:
    """A list for interleaved-1f1b has p * v entries, one per chunk-stage."""
    fwd = [0.5, 0.5, 0.5, 0.5, 1.0, 1.0, 1.0, 1.0]
    got = run_json("interleaved-1f1b", "-p", "4", "-m", "4", "-v", "2", "--fwd", ",".join(map(str, fwd)), "--comm", "0.1")
    assert got == library_json("interleaved-1f1b", 4, 4, chunks=2, fwd=fwd, bwd=1.0, comm=0.1)


def test_zero_bubble_takes_the_input_weight_split() -> None:
    """--bwd-input and --bwd-weight reach the simulator for zb-h1."""
    got = run_json("zb-h1", "-p", "4", "-m", "8", "--bwd-input", "1.5", "--bwd-weight", "0.5")
    assert got == library_json("zb-h1", 4, 8, bwd_input=1.5, bwd_weight=0.5)


def test_bandwidth_trace_slows_transfers(tmp_path: Path) -> None:
    """A trace halving every link from t=0 gives the library's result under the same trace, slower than without."""
    path = tmp_path / "bw.json"
    path.write_text(json.dumps([{"t_ms": 0, "link": "all", "factor": 0.5}]))
    got = run_json("1f1b", "-p", "3", "-m", "4", "--comm", "1", "--bandwidth-trace", str(path))
    assert got == library_json("1f1b", 3, 4, comm=1.0, trace=read_bandwidth_trace(path))
    assert got["iteration_time"] > library_json("1f1b", 3, 4, comm=1.0)["iteration_time"]


def test_default_output_is_a_table_with_one_row_per_rank() -> None:
    """Without --json the command prints the summary and per-rank tables."""
    result = CliRunner().invoke(app, ["simulate", "1f1b", "-p", "4", "-m", "8"])
    assert result.exit_code == 0
    assert "1f1b, p=4, m=8" in result.stdout
    assert "iteration time (ms)" in result.stdout and "33" in result.stdout and "27.3%" in result.stdout
    assert sum(1 for line in result.stdout.splitlines() if line.startswith("│    ")) == 4


def test_png_and_trace_are_written_and_json_stays_clean(tmp_path: Path) -> None:
    """--png and --trace write their files; with --json stdout holds only the JSON and the notes go to stderr."""
    png, trace = tmp_path / "t.png", tmp_path / "t.json"
    args = ["simulate", "zb-h1", "-p", "4", "-m", "8", "--json", "--png", str(png), "--trace", str(trace)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0
    assert json.loads(result.stdout)["iteration_time"] > 0
    assert str(png) in result.stderr and str(trace) in result.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    events = json.loads(trace.read_text())["traceEvents"]
    assert sum(1 for e in events if e["ph"] == "X" and e["tid"] == 0) == 4 * 8 * 3


def write_vgg_plan(path: Path) -> Plan:
    """A 4-stage 1f1b plan of pipedream/vgg16 on v100-8x1 with even layer cuts."""
    layers = load_profile("pipedream/vgg16").num_layers
    cuts = [0, layers // 4, layers // 2, 3 * layers // 4, layers]
    plan = Plan(tuple(Stage(cuts[i], cuts[i + 1] - 1, (i,)) for i in range(4)), 1, 8, 32, "1f1b")
    write_plan(plan, path, "pipedream/vgg16", "v100-8x1")
    return plan


def test_plan_mode_equals_simulate_plan(tmp_path: Path) -> None:
    """simulate --plan prints simulate_plan's result; --profile/--cluster default to the names in the file."""
    path = tmp_path / "plan.json"
    plan = write_vgg_plan(path)
    profile, cluster = load_profile("pipedream/vgg16"), load_cluster("v100-8x1")
    expected = json.loads(json.dumps(simulate_plan(plan, default_model(profile, cluster)).to_json()))
    assert run_json("--plan", str(path), "--profile", "pipedream/vgg16", "--cluster", "v100-8x1") == expected
    assert run_json("--plan", str(path)) == expected
    linear = json.loads(json.dumps(simulate_plan(plan, linear_model(profile, cluster)).to_json()))
    assert run_json("--plan", str(path), "--batch-scaling", "linear") == linear
    assert linear["iteration_time"] < expected["iteration_time"]  # the floor adds the fixed costs a plain b/P drops


def run_main(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """Run pipeplan.cli.main() in-process with argv; return (exit code, stderr)."""
    monkeypatch.setattr(sys, "argv", ["pipeplan", *args])
    with pytest.raises(SystemExit) as exit_info:
        main()
    return int(exit_info.value.code or 0), capsys.readouterr().err


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
        (["1f1b", "-p", "4", "-m", "100000000"], "too large: 800,000,000 actions, the limit is 4,000,000 actions, because"),
        (["zb-h1", "-p", "100000", "-m", "100"], "zb-h1 with stages=100000, microbatches=100 too large: 30,000,000 actions"),
        (["/no/such/schedule.csv"], "/no/such/schedule.csv: cannot read schedule: does not exist"),
    ],
)
def test_bad_input_exits_2_with_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    """Each bad input exits with code 2 and one line on stderr that names the value."""
    code, err = run_main(monkeypatch, capsys, "simulate", *args)
    assert code == 2
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: ") and message in err


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


def test_a_plan_that_does_not_fit_is_an_error_unless_memory_is_ignored(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """vgg16 on devices of 0.5 GiB: exit 2 naming the plan, device, need and excess; --ignore-memory simulates it."""
    from pipeplan.io.cluster_json import cluster_to_json

    path = tmp_path / "plan.json"
    write_vgg_plan(path)
    small = cluster_to_json(load_cluster("v100-8x1"))
    for device in small["devices"]:
        device["memory_gb"] = 0.5
    (tmp_path / "small.json").write_text(json.dumps(small))
    code, err = run_main(monkeypatch, capsys, "simulate", "--plan", str(path), "--cluster", str(tmp_path / "small.json"))
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"plan {path} does not fit: stage " in err and "GiB too much" in err and "--ignore-memory" in err
    code, err = run_main(monkeypatch, capsys, "simulate", "--plan", str(path), "--cluster", str(tmp_path / "small.json"),
                         "--ignore-memory", "--json")  # fmt: skip
    assert code == 0, err


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
    code, err = run_main(monkeypatch, capsys, "simulate", "1f1b", "-p", "2", "-m", "2", *args)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert message in err


def test_a_trace_naming_a_device_the_pipeline_lacks_is_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Link [0, 9] on a 4-rank pipeline: exit 2 naming the step, the link and the device count."""
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps([{"t_ms": 0, "link": [0, 1], "factor": 0.5}, {"t_ms": 5, "link": [0, 9], "factor": 0.5}]))
    code, err = run_main(monkeypatch, capsys, "simulate", "1f1b", "-p", "4", "-m", "4", "--bandwidth-trace", str(trace))
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "bandwidth trace step 1: link [0, 9] names device 9, but 1f1b with p=4 (one device per rank) has 4 devices" in err


def test_a_schedule_file_simulates_as_its_generator_does(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A torch-format CSV of 1f1b (p=3, m=5) simulates exactly as `simulate 1f1b -p 3 -m 5`, named by its file; sizes
    given beside a file are refused."""
    from pipeplan.io.schedule_io import write_schedule_csv

    path = tmp_path / "mine.csv"
    write_schedule_csv(make_schedule("1f1b", 3, 5), path)
    from_file = run_json(str(path), "--fwd", "1,2,1", "--comm", "0.5")
    generated = run_json("1f1b", "-p", "3", "-m", "5", "--fwd", "1,2,1", "--comm", "0.5")
    assert from_file["schedule"] == "mine"
    assert {**from_file, "schedule": "1f1b"} == generated
    code, err = run_main(monkeypatch, capsys, "simulate", str(path), "-m", "5")
    assert code == 2 and "--microbatches does not apply to the schedule file" in err


def test_pipemare_reports_its_steady_state_delays_and_weight_copies() -> None:
    """`simulate pipemare --json`: the usual timings plus utilization over the steady window (1.0 for equal stages),
    the delays the order gives (ceil((p - s - 1) / m)), and two weight copies per stage against stashing's count."""
    got = run_json("pipemare", "-p", "4", "-m", "2")
    assert got["schedule"] == "pipemare" and got["iteration_time"] > 0
    mare = got["pipemare"]
    assert mare["utilization"] == pytest.approx(1.0)
    assert mare["delays"] == [2, 1, 1, 0]
    assert mare["memory"] == {"weight_copies": [2, 2, 2, 2], "weight_stashing_copies": [3, 2, 2, 1]}
    longer = run_json("pipemare", "-p", "4", "-m", "2", "--minibatches", "20")
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
    code, err = run_main(monkeypatch, capsys, "simulate", *args)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert message in err


def write_dag_plan(path: Path) -> Plan:
    """A 2-stage plan of pipedream/resnet50 on v100-8x1 cut at an antichain (two neighbours of the default order
    swapped at the cut), written to `path`."""
    from pipeplan.core.dag import inputs_of

    profile = load_profile("pipedream/resnet50")
    inputs, n = inputs_of(profile), profile.num_layers
    p = next(q for q in range(n // 5, n - 1) if q not in inputs[q + 1])
    order = list(range(n))
    order[p], order[p + 1] = order[p + 1], order[p]
    plan = Plan((Stage(0, p, (0,)), Stage(p + 1, n - 1, (1,))), 1, 4, 32, "1f1b", layer_order=tuple(order))
    write_plan(plan, path, "pipedream/resnet50", "v100-8x1", profile=profile)
    return plan


def test_a_dag_plan_file_simulates_like_the_library(tmp_path: Path) -> None:
    """simulate --plan on a plan whose stages name their layers prints simulate_plan's result for that plan."""
    path = tmp_path / "dag.json"
    plan = write_dag_plan(path)
    model = default_model(load_profile("pipedream/resnet50"), load_cluster("v100-8x1"))
    assert run_json("--plan", str(path)) == json.loads(json.dumps(simulate_plan(plan, model).to_json()))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("overlap", "stages 0 and 1 both hold layer"),
        ("missing", "no stage holds layer"),
        ("open", "but its input layer"),
    ],
)
def test_a_bad_dag_plan_exits_2_naming_the_stage_and_the_layer(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path, change: str, message: str
) -> None:
    """Stages that overlap, miss a layer, or hold a layer whose input is in a later stage exit 2 with one line naming
    the stage and the layer."""
    path = tmp_path / "dag.json"
    write_dag_plan(path)
    obj = json.loads(path.read_text())
    first, second = obj["stages"][0]["layers"], obj["stages"][1]["layers"]
    if change == "overlap":
        second.append(first[-1])
    elif change == "missing":
        second.pop()
    else:
        first.append(second.pop())  # the model's last layer, whose inputs stay in stage 1
    path.write_text(json.dumps(obj))
    code, err = run_main(monkeypatch, capsys, "simulate", "--plan", str(path))
    assert code == 2
    assert len(err.strip().splitlines()) == 1, err
    assert message in err and "dag.json" in err and "stage" in err and "node" in err
