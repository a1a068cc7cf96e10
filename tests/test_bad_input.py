"""One table of bad inputs, every command: each exits 2 with one line naming the flag, field or value, no traceback.

The cases are the ones found by trying pipeplan as a new user would (issue "Fast and unbreakable where a user
touches it"); the slower ones that need processes (signals, checkpoints mid-run) live in test_runtime_launch.py
and test_runtime_faults.py, and each module's own tests hold more of its errors.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_runner import run

BERT = ["--profile", "dapple/bert-48", "--cluster", "v100-8x1", "--global-batch", "64"]
TRAIN = ["train", "--local", "2", "--schedule", "1f1b", "-p", "2", "-m", "4"]
PLAN_WITHOUT_K = {
    "format": "pipeplan.plan/1", "profile": "dapple/bert-48", "cluster": "v100-8x1", "pipeline_replicas": 1,
    "microbatches": 4, "microbatch_size": 2, "schedule": "1f1b", "chunks": 1, "order": None,
    "stages": [{"first_layer": 0, "last_layer": 52, "devices": [0]}],
}  # fmt: skip

CASES: list[tuple[str, list[str], str]] = [
    # sizes that would not fit: refused before any work, with the size needed
    ("too many microbatches", ["simulate", "1f1b", "-p", "4", "-m", "100000000"], "800,000,000 actions"),
    ("huge global batch", ["plan", *BERT[:4], "--global-batch", "1000000000"], "give a larger --microbatch-size"),
    ("exact on a large instance", ["plan", "--planner", "exact", *BERT], "planner 'exact' handles at most"),
    # outputs checked before the work
    ("unwritable plan --out", ["plan", *BERT, "--out", "/nonexistent/x.json"], "--out '/nonexistent/x.json'"),
    ("unwritable simulate --trace", ["simulate", "1f1b", "-p", "4", "-m", "8", "--trace", "/nonexistent/t.json"], "--trace"),
    ("--png with another suffix", ["simulate", "1f1b", "-p", "4", "-m", "8", "--png", "out.xyz"], "must end with .png"),
    ("unwritable profile -o", ["profile", "mlp", "-b", "8", "-o", "/nonexistent/p.json"], "--out '/nonexistent/p.json'"),
    # names: suggestions for typos, every flag's own values
    ("profile typo", ["plan", "--profile", "dapple/bert-4", *BERT[2:]], "did you mean dapple/bert-48"),
    ("cluster typo", ["plan", *BERT[:2], "--cluster", "v100-8x9", *BERT[4:]], "did you mean v100-8x1"),
    ("no planner named", ["compare", *BERT, "--planners", ","], "--planners ',': no planner named"),
    ("unknown replication", ["plan", *BERT, "--replication", "x"], "--replication must be one of any, pipelines, none"),
    ("negative optimizer factor", ["plan", *BERT, "--optimizer-factor", "-1"], "--optimizer-factor must be"),
    ("schedule --format", ["schedule", "1f1b", "-p", "4", "-m", "8", "--format", "xml"], "--format must be text, json or csv"),
    ("schedule file with sizes", ["schedule", "PLAN_WITHOUT_K", "-p", "4"], "--stages does not apply to the schedule file"),
    # files: the field is named
    ("plan file without k", ["simulate", "--plan", "PLAN_WITHOUT_K"], "missing field 'k'"),
    ("trace link beyond the devices", ["simulate", "1f1b", "-p", "4", "-m", "8", "--bandwidth-trace", "TRACE"], "link [0, 9]"),
    # train and probe: checked once, before any process starts
    ("--local 0", ["train", "--local", "0", *TRAIN[3:]], "--local must be >= 1, got 0"),
    ("probe --local 0", ["probe", "--local", "0", "-o", "x.json"], "--local must be >= 1, got 0"),
    ("--steps 0", [*TRAIN, "--steps", "0"], "--steps must be >= 1, got 0"),
    ("--lr nan", [*TRAIN, "--lr", "nan"], "--lr must be a finite number >= 0"),
    ("--lr -1", [*TRAIN, "--lr", "-1"], "--lr must be a finite number >= 0"),
    ("--lr-schedule typo", [*TRAIN, "--lr-schedule", "cosin"], "--lr-schedule must be one of constant, cosine"),
    ("train plan file without k", ["train", "--local", "2", "--plan", "PLAN_WITHOUT_K"], "missing field 'k'"),
    ("pipemare switch without pipemare", [*TRAIN, "--lr-reschedule", "4"], "--lr-reschedule applies only to --schedule pipemare"),
    ("discrepancy decay 1", ["train", "--local", "2", "--schedule", "pipemare", "-p", "2", "-m", "4", "--discrepancy-decay", "1"],
     "--discrepancy-decay must be a number in [0, 1)"),
    ("warm-up beyond the run", ["train", "--local", "2", "--schedule", "pipemare", "-p", "2", "-m", "4", "--steps", "4",
                                "--sync-warmup", "9"], "--sync-warmup 9 is beyond the run"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "argv", "fragment"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_exits_2_with_one_line(
    case: str, argv: list[str], fragment: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 2, a single `error:` line holding the fragment, no traceback, nothing written."""
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(PLAN_WITHOUT_K))
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"steps": [{"t_ms": 0, "link": [0, 9], "factor": 0.5}]}))
    files = {"PLAN_WITHOUT_K": str(plan), "TRACE": str(trace)}
    monkeypatch.chdir(tmp_path)
    code, out, err = run(monkeypatch, capsys, *[files.get(a, a) for a in argv])
    assert code == 2, (case, out, err)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), (case, err)
    assert fragment in lines[0], (case, lines[0])
    assert "Traceback" not in out + err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json", "trace.json"], case


# --- issue 20, Ada-Grouper (simulated side): bandwidth traces, `pipeplan trace`, `adapt`, `simulate --iterations` ---

ADAPT_PLAN = {
    "format": "pipeplan.plan/1", "profile": "dapple/bert-48", "cluster": "v100-8x2-25g", "pipeline_replicas": 1,
    "microbatches": 8, "microbatch_size": 2, "schedule": "1f1b", "k": 1, "chunks": 1, "order": None,
    "stages": [{"first_layer": 0, "last_layer": 26, "devices": [7]}, {"first_layer": 27, "last_layer": 52, "devices": [8]}],
}  # fmt: skip
ADAPT_FILES = {
    "unsorted.json": '{"steps": [{"t_ms": 5, "link": "all", "factor": 1}, {"t_ms": 2, "link": "all", "factor": 0.5}]}',
    "negative.json": '[{"t_ms": 0, "link": [7, 8], "factor": -0.5}]',
    "nan.json": '[{"t_ms": 0, "link": [7, 8], "factor": NaN}]',
    "beyond.json": '[{"t_ms": 0, "link": [7, 99], "factor": 0.5}]',
    "unused.json": '[{"t_ms": 0, "link": [0, 1], "factor": 0.5}]',
    "good.json": '[{"t_ms": 0, "link": [7, 8], "factor": 0.5}]',
    "unsorted.csv": "time_s,v\n0,1\n2,1\n1,1\n",
    "negative.csv": "time_s,v\n0,1\n1,-1\n",
    "nan.csv": "time_s,v\n0,1\n1,nan\n",
    "good.csv": "time_s,v\n0,1\n1,2\n",
    "plan.json": json.dumps(ADAPT_PLAN),
}
ADAPT = ["adapt", "--plan", "plan.json", "--iterations", "3", "--bandwidth-trace"]
PERIODIC = [
    "trace",
    "periodic",
    "--period-ms",
    "10",
    "--duty",
    "0.5",
    "--factor",
    "0.5",
    "--duration-ms",
    "100",
    "--out",
    "t.json",
]
MARKOV = [
    "trace",
    "markov",
    "--seed",
    "1",
    "--mean-slow-ms",
    "5",
    "--mean-fast-ms",
    "5",
    "--duration-ms",
    "100",
    "--out",
    "t.json",
]
REPLAY = ["trace", "replay", "--nominal", "2", "--out", "t.json"]
ADAPT_CASES: list[tuple[str, list[str], str]] = [
    ("adapt: unsorted trace", [*ADAPT, "unsorted.json"], "t_ms 2.0 is before the previous entry's 5.0"),
    ("adapt: negative factor", [*ADAPT, "negative.json"], "factor must be a finite number > 0, got -0.5"),
    ("adapt: NaN factor", [*ADAPT, "nan.json"], "factor must be a finite number > 0, got nan"),
    ("adapt: link beyond the cluster", [*ADAPT, "beyond.json"], "link [7, 99] names device 99, but cluster v100-8x2-25g"),
    ("adapt: link the plan does not use", [*ADAPT, "unused.json"],
     "no step names a link the plan's transfers use, so it would change nothing (the plan's links: 7-8, 8-7)"),
    ("adapt: --iterations 0", ["adapt", "--plan", "plan.json", "--iterations", "0", "--bandwidth-trace", "good.json"],
     "--iterations must be an integer >= 1, got 0"),
    ("adapt: --png suffix", [*ADAPT, "good.json", "--png", "x.jpg"], "--png 'x.jpg' must end with .png"),
    ("simulate: --iterations 0", ["simulate", "1f1b", "-p", "2", "-m", "4", "--iterations", "0"],
     "--iterations must be an integer >= 1"),
    ("simulate: unsorted trace", ["simulate", "1f1b", "-p", "2", "-m", "4", "--bandwidth-trace", "unsorted.json"],
     "steps must be sorted"),
    ("trace: duty above 1", [*PERIODIC, "--duty", "1.5"], "duty must be a finite number > 0 and <= 1, got 1.5"),
    ("trace: factor 0", [*PERIODIC, "--factor", "0"], "factor must be a finite number > 0, got 0.0"),
    ("trace: a link to itself", [*PERIODIC, "--links", "1-1"], '--links must be "all" or a list of a-b / a=b'),
    ("trace: factor range reversed", [*MARKOV, "--factor-range", "0.5,0.2"], "factor range must be low <= high, got 0.5,0.2"),
    ("trace: factor range not numbers", [*MARKOV, "--factor-range", "x"], "--factor-range must be two numbers LOW,HIGH"),
    ("trace: negative seed", [*MARKOV, "--factor-range", "0.1,0.2", "--seed", "-3"], "seed must be an integer >= 0, got -3"),
    ("trace: replay unsorted", [*REPLAY, "unsorted.csv"], "line 4: time 1 s is not after the previous row's 2 s"),
    ("trace: replay negative", [*REPLAY, "negative.csv"], "line 3: value must be a finite number >= 0, got '-1'"),
    ("trace: replay NaN", [*REPLAY, "nan.csv"], "line 3: value must be a finite number >= 0, got 'nan'"),
    ("trace: replay nominal 0", [*REPLAY, "good.csv", "--nominal", "0"], "nominal must be a finite number > 0, got 0.0"),
    ("trace: --out suffix", [*PERIODIC[:-1], "t.txt"], "--out 't.txt' must end with .json"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "argv", "fragment"), ADAPT_CASES, ids=[c[0] for c in ADAPT_CASES])
def test_adapt_and_trace_bad_input_exits_2_with_one_line(
    case: str, argv: list[str], fragment: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Traces that are unsorted, negative, NaN or name unknown links, a zero iteration count and bad trace parameters:
    exit 2, one `error:` line holding the fragment, nothing written."""
    for name, text in ADAPT_FILES.items():
        (tmp_path / name).write_text(text)
    monkeypatch.chdir(tmp_path)
    code, out, err = run(monkeypatch, capsys, *argv)
    assert code == 2, (case, out, err)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), (case, err)
    assert fragment in lines[0], (case, lines[0])
    assert "Traceback" not in out + err
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(ADAPT_FILES), case


# ---- issue 20, the runtime: --adaptive and an emulated network (train checks them before any process starts) ----

KFKB = ["train", "--local", "2", "--schedule", "kfkb", "-p", "2", "-m", "4"]
NETWORK_CASES: list[tuple[str, list[str], str]] = [
    ("--adaptive with 1f1b", [*TRAIN, "--adaptive"], "schedule '1f1b' has no k to adapt"),
    ("--adaptive with pipemare", [*KFKB[:4], "pipemare", *KFKB[5:], "--adaptive"], "--adaptive is not supported with"),
    ("--adaptive with pipeline copies", ["train", "--local", "4", *KFKB[3:], "--adaptive"], "one process per stage"),
    ("--adaptive with a 1f1b plan", ["train", "--local", "1", "--plan", "PLAN", "--adaptive"], "has no k to adapt"),
    ("trace without a rate", [*KFKB, "--bandwidth-trace", "SLOW"], "needs a rate to emulate: give --emulate-gb-per-s"),
    ("trace naming a device outside the job", [*KFKB, "--emulate-gb-per-s", "1", "--bandwidth-trace", "TRACE"],
     "link [0, 9] names device 9, which this job does not run on (its devices: [0, 1])"),
    ("unsorted trace", [*KFKB, "--emulate-gb-per-s", "1", "--bandwidth-trace", "UNSORTED"], "sorted"),
    ("negative factor", [*KFKB, "--emulate-gb-per-s", "1", "--bandwidth-trace", "NEGATIVE"], "factor must be"),
    ("zero emulated rate", [*KFKB, "--emulate-gb-per-s", "0"], "--emulate-gb-per-s must be a finite number of GB/s > 0"),
    ("NaN emulated rate", [*KFKB, "--emulate-gb-per-s", "nan"], "--emulate-gb-per-s must be a finite number"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "argv", "fragment"), NETWORK_CASES, ids=[c[0] for c in NETWORK_CASES])
def test_bad_adaptive_or_network_input_exits_2_with_one_line(
    case: str, argv: list[str], fragment: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 2, one `error:` line holding the fragment, before any process starts and with nothing written."""
    files = {
        "PLAN": {**PLAN_WITHOUT_K, "k": 1},
        "SLOW": [{"t_ms": 0, "link": "all", "factor": 0.1}],
        "TRACE": [{"t_ms": 0, "link": [0, 9], "factor": 0.5}],
        "UNSORTED": [{"t_ms": 5, "link": "all", "factor": 0.5}, {"t_ms": 1, "link": "all", "factor": 0.5}],
        "NEGATIVE": [{"t_ms": 0, "link": "all", "factor": -0.5}],
    }
    for name, content in files.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(content))
    monkeypatch.chdir(tmp_path)
    code, out, err = run(monkeypatch, capsys, *[f"{a}.json" if a in files else a for a in argv])
    assert code == 2, (case, out, err)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), (case, err)
    assert fragment in lines[0], (case, lines[0])
    assert "Traceback" not in out + err
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{name}.json" for name in files), case
