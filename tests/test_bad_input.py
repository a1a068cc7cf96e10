"""One table of bad inputs, every command: each exits 2 with one line naming the flag, field or value, no traceback.

The cases are the ones found by trying pipeplan as a new user would (issue "Fast and unbreakable where a user
touches it"); the slower ones that need processes (signals, checkpoints mid-run) live in test_runtime_launch.py
and test_runtime_faults.py, and each module's own tests hold more of its errors.
"""

from __future__ import annotations

import json
import os
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
    ("exact on a large instance", ["plan", "--planner", "exact", *BERT[:2], "--cluster", "v100-8x2-25g", *BERT[4:]],
     "planner 'exact' handles at most"),
    # outputs checked before the work
    ("unwritable plan --out", ["plan", *BERT, "--out", "/nonexistent/x.json"], "--out '/nonexistent/x.json'"),
    ("unwritable simulate --timeline", ["simulate", "1f1b", "-p", "4", "-m", "8", "--timeline", "/nonexistent/t.json"],
     "--timeline"),
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


NEEDS_TORCH = {"unwritable profile -o", "model weights", "latest.json names a step that is gone", "hostile checkpoint"}
"""Cases that need torch before they refuse: profile's batch sizes come from the torch profiler, a model is built,
train reads a checkpoint."""
SLOW = {"huge global batch"}
"""Cases that plan before they refuse (the search itself finds that no microbatch size fits)."""


def _marked(case: tuple[str, list[str], str]) -> object:
    """The case with its `torch` / `slow` marks (NEEDS_TORCH, SLOW)."""
    marks = [mark for names, mark in ((NEEDS_TORCH, pytest.mark.torch), (SLOW, pytest.mark.slow)) if case[0] in names]
    return pytest.param(*case, marks=marks) if marks else case


@pytest.mark.parametrize(
    ("case", "argv", "fragment"),
    [_marked(c) for c in CASES],
    ids=[c[0] for c in CASES],
)
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


# ---------------------------------------------------------------------------------------------------------------------
# Issue 19, classes 2, 3, 7 and 8: outputs that would destroy a file, train's checks before any process starts, and
# smaller silent acceptances. Every case: exit 2, one line naming the flag or field and the value, before any work,
# and every file of the folder unchanged (bytes, mtime, kind). tests/test_cli_outputs.py runs the output guard over
# every command's outputs; tests/test_runtime_launch.py kills a real launcher and fills a disk at the end of a run.
# ---------------------------------------------------------------------------------------------------------------------

BERT_PLAN = {**PLAN_WITHOUT_K, "k": 1}
ISSUE_19_FILES: dict[str, object] = {
    "HUGE_PLAN": {**BERT_PLAN, "microbatches": 1, "microbatch_size": 4096},
    "PLAN_MISSING_A_LAYER": {**BERT_PLAN, "stages": [{"first_layer": 0, "last_layer": 51, "devices": [0]}]},
    "PLAN_K_ON_1F1B": {**BERT_PLAN, "k": 2},
    "PLAN_KFKB_K9": {**BERT_PLAN, "schedule": "kfkb", "k": 9},
    "PROFILE_JSON": None,  # a real profile file, written by the test
    "CKPT_LATEST_GONE": None,  # a checkpoint folder whose latest.json names step 12, with no step-000012 folder
    "FIFO": None,
    "LINK": None,
}
TRAIN_1F1B = ["train", "--local", "2", "--schedule", "1f1b", "-p", "2", "-m", "4"]
TRAIN_PLAN = ["train", "--local", "1", "--plan"]

ISSUE_19_CASES: list[tuple[str, list[str], str]] = [
    # class 2: an output never destroys an input, another output, or what is not a regular file
    ("plan --out is its --profile", ["plan", "--profile", "PROFILE_JSON", "--cluster", "v100-8x1", "--global-batch", "8",
                                     "--out", "PROFILE_JSON"], "is the input --profile"),
    ("simulate --timeline is its --plan", ["simulate", "--plan", "BERT_PLAN", "--timeline", "BERT_PLAN"], "is the input --plan"),
    ("two outputs on one path", ["simulate", "1f1b", "-p", "2", "-m", "4", "--timeline", "t.png", "--png", "./t.png"],
     "--png './t.png' and --timeline 't.png' name the same path"),
    ("--trace on a FIFO", ["simulate", "1f1b", "-p", "2", "-m", "4", "--trace", "FIFO"], "is a named pipe (FIFO), not a regular"),
    ("train --timeline on a symlink", [*TRAIN_1F1B, "--timeline", "LINK"], "is a symbolic link (to "),
    ("demo --out on a file", ["demo", "--out", "BERT_PLAN"], "is a file, not a folder"),
    ("show --png in a missing folder", ["show", "cluster", "v100-8x1", "--png", "nodir/c.png"], "folder"),
    ("--save-grads nodir/g.pt", [*TRAIN_1F1B, "--save-grads", "nodir/g.pt"], "ends with '.pt' like a file: give a folder name"),
    ("--save-grads in a missing folder", [*TRAIN_1F1B, "--save-grads", "nodir/grads"], "does not exist"),
    ("--timeline and --save-grads on one path", [*TRAIN_1F1B, "--timeline", "g", "--save-grads", "g"], "name the same path"),
    # class 3: train checks everything simulate --plan checks, once, before any process starts
    ("train a plan that does not fit", [*TRAIN_PLAN, "HUGE_PLAN"], "does not fit: stage 0 needs 428.77 GiB on device 0"),
    ("train a plan missing a layer", [*TRAIN_PLAN, "PLAN_MISSING_A_LAYER"], "has 53: layer 52 is in no stage"),
    ("--local beyond the machine", ["train", "--local", "1000", "--schedule", "1f1b"], "--local 1000 is too many processes"),
    ("probe --local beyond the machine", ["probe", "--local", "1000", "-o", "c.json"], "--local 1000 is too many processes"),
    ("-b beside --plan", [*TRAIN_PLAN, "BERT_PLAN", "-b", "32"], "--batch-size 32 does not apply with --plan"),
    ("-p beside --plan", [*TRAIN_PLAN, "BERT_PLAN", "-p", "2"], "--stages 2 does not apply with --plan"),
    ("-m beside --plan", [*TRAIN_PLAN, "BERT_PLAN", "-m", "8"], "--microbatches 8 does not apply with --plan"),
    ("--k beside --plan", [*TRAIN_PLAN, "BERT_PLAN", "--k", "2"], "--k 2 does not apply with --plan"),
    ("-v beside --plan", [*TRAIN_PLAN, "BERT_PLAN", "-v", "2"], "--chunks 2 does not apply with --plan"),
    ("--replicas beside --plan", [*TRAIN_PLAN, "BERT_PLAN", "--replicas", "1"], "--replicas 1 does not apply with --plan"),
    # class 8: each works as meant or is refused with the reason
    ("schedule kfkb k > m", ["schedule", "kfkb", "-p", "2", "-m", "4", "--k", "9"], "kfkb with k=9 > microbatches=4"),
    ("simulate kfkb k > m", ["simulate", "kfkb", "-p", "2", "-m", "4", "--k", "9"], "kfkb with k=9 > microbatches=4"),
    ("train kfkb k > m", ["train", "--local", "2", "--schedule", "kfkb", "-p", "2", "-m", "4", "--k", "9"],
     "kfkb with k=9 > microbatches=4"),
    ("plan file kfkb k > m", ["simulate", "--plan", "PLAN_KFKB_K9"], "kfkb with k=9 > microbatches=4"),
    ("--k on 1f1b", ["schedule", "1f1b", "-p", "2", "-m", "4", "--k", "2"], "k=2 applies only to kfkb; schedule '1f1b'"),
    ("-v on gpipe", ["simulate", "gpipe", "-p", "2", "-m", "4", "-v", "2"], "chunks=2 applies only to interleaved-1f1b"),
    ("train --k on 1f1b", [*TRAIN_1F1B, "--k", "2"], "k=2 applies only to kfkb; schedule '1f1b' takes no k"),
    ("train -v on pipemare", ["train", "--local", "2", "--schedule", "pipemare", "-p", "2", "-m", "4", "-v", "2"],
     "chunks=2 applies only to interleaved-1f1b; schedule 'pipemare'"),
    ("plan file k on 1f1b", ["simulate", "--plan", "PLAN_K_ON_1F1B"], "PLAN_K_ON_1F1B: k=2 applies only to kfkb"),
    ("train plan file k on 1f1b", [*TRAIN_PLAN, "PLAN_K_ON_1F1B"], "k=2 applies only to kfkb; schedule '1f1b'"),
    ("--planners twice", ["compare", *BERT, "--planners", "pipeplan,pipeplan"], "planner 'pipeplan' is named twice"),
    ("--checkpoint-dir alone", [*TRAIN_1F1B, "--checkpoint-dir", "ckpt"], "without --checkpoint-every writes no checkpoint"),
    ("latest.json names a step that is gone", [*TRAIN_1F1B, "--checkpoint-dir", "CKPT_LATEST_GONE", "--resume"],
     "names step 12, but"),
]  # fmt: skip


def write_issue_19_files(folder: Path) -> dict[str, str]:
    """The files the cases name, written in `folder`; returns placeholder -> path."""
    from pipeplan.io.profile_json import write_profile_json
    from pipeplan.presets.resolve import load_profile

    paths = {"BERT_PLAN": str(folder / "BERT_PLAN.json")}
    (folder / "BERT_PLAN.json").write_text(json.dumps(BERT_PLAN))
    for name, content in ISSUE_19_FILES.items():
        paths[name] = str(folder / f"{name}.json")
        if isinstance(content, dict):
            (folder / f"{name}.json").write_text(json.dumps(content))
    write_profile_json(load_profile("dapple/vgg-19"), folder / "PROFILE_JSON.json")
    paths["CKPT_LATEST_GONE"] = str(folder / "ckpt-old")
    (folder / "ckpt-old").mkdir()
    (folder / "ckpt-old" / "latest.json").write_text(json.dumps({"format": "pipeplan.checkpoint/1", "step": 12}))
    paths["FIFO"] = str(folder / "fifo")
    os.mkfifo(folder / "fifo")
    paths["LINK"] = str(folder / "link.json")
    (folder / "link.json").symlink_to(folder / "BERT_PLAN.json")
    return paths


@pytest.mark.parametrize(("case", "argv", "fragment"), [_marked(c) for c in ISSUE_19_CASES], ids=[c[0] for c in ISSUE_19_CASES])
def test_issue_19_refusals_exit_2_with_one_line_and_change_nothing(
    case: str, argv: list[str], fragment: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 2, a single `error:` line holding the fragment, no traceback, every file as it was and nothing new."""
    from file_kinds import snapshot

    paths = write_issue_19_files(tmp_path)
    fragment = fragment.replace("PLAN_K_ON_1F1B", paths["PLAN_K_ON_1F1B"])
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    code, out, err = run(monkeypatch, capsys, *[paths.get(a, a) for a in argv])
    assert code == 2, (case, out, err)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), (case, err)
    assert fragment in lines[0], (case, lines[0])
    assert "Traceback" not in out + err
    assert snapshot(tmp_path) == before, case


def test_train_refuses_a_plan_that_does_not_fit_with_simulates_own_words(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`train --plan` and `simulate --plan` give the same diagnosis (need, capacity, excess) for a plan too large."""
    path = tmp_path / "huge.json"
    path.write_text(json.dumps(ISSUE_19_FILES["HUGE_PLAN"]))
    _, _, simulated = run(monkeypatch, capsys, "simulate", "--plan", str(path))
    _, _, trained = run(monkeypatch, capsys, *TRAIN_PLAN, str(path))
    diagnosis = simulated.split("does not fit: ", 1)[1].split("; ", 1)[0]
    assert "needs 428.77 GiB on device 0 (V100, 16.00 GiB): 412.77 GiB too much" in diagnosis
    assert f"plan {path} does not fit: {diagnosis}; train would run out of memory" in trained


# ======================================================================================================================
# Issue 19, classes 1, 4, 5 and 6: checkpoints are data, size limits, one reader for every file, finite values.
# Each case names its input files by a key of _INPUTS (made in tmp_path before the run); the refusal is exit 2, one
# line naming the option or field and the value, before any work, and nothing is written (the folder is unchanged).
# ======================================================================================================================

_PROFILE = {"format": "pipeplan.profile/1", "name": "p", "batch_size": 8, "reference_device": "V100"}
_LAYER = {"name": "l", "fwd_ms": 1.0, "bwd_ms": 2.0, "activation_bytes": 1e6, "param_bytes": 1e6}
_CLUSTER = {
    "format": "pipeplan.cluster/1", "name": "c", "nodes": 2, "gpus_per_node": 2, "device": {"kind": "V100"},
    "intra_node_gb_per_s": 100, "inter_node_gb_per_s": 10, "latency_us": 5,
}  # fmt: skip


def _layers(count: int, **changes: object) -> dict[str, object]:
    """A profile of `count` layers, the first one changed."""
    return _PROFILE | {"layers": [_LAYER | {"name": f"l{i}"} | (changes if i == 0 else {}) for i in range(count)]}


def _hostile_checkpoint(root: Path) -> None:
    """A checkpoint at step 2 whose rank files would run `touch MARKER` if unpickled unsafely."""
    import os
    import pickle

    class Hostile:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return os.system, (f"touch {root.parent / 'MARKER'}",)

    import hashlib

    files = {}
    from checkpoint_files import cli_fingerprint

    job = cli_fingerprint()  # the job's own: the launcher compares it before reading any tensor
    for rank in (0, 1):
        folder = root / "step-000002"
        folder.mkdir(parents=True, exist_ok=True)
        meta = {"format": "pipeplan.checkpoint/2", "step": 2, "samples_seen": 128, "fingerprint": job,
                "python_rng": [3, [0] * 624 + [624], None]}  # fmt: skip
        for name, data in (
            (f"rank-{rank}.pt", pickle.dumps({"stages": Hostile()})),
            (f"rank-{rank}.json", json.dumps(meta).encode()),
        ):
            (folder / name).write_bytes(data)
            files[name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}  # recorded as written
    index = {"format": "pipeplan.checkpoint/2", "step": 2, "writing": None, "checkpoints": {"2": files}}
    (root / "latest.json").write_text(json.dumps(index))


def _fifo(path: Path) -> None:
    """A FIFO at path (reading it would wait for a writer forever)."""
    import os

    os.mkfifo(path)


def _loop(path: Path) -> None:
    """Two symlinks pointing at each other."""
    path.symlink_to(path.name + ".other")
    path.with_name(path.name + ".other").symlink_to(path.name)


_INPUTS: dict[str, object] = {
    # name in argv: JSON to write, text (str), or a function making the thing at the path
    "NODES.json": _CLUSTER | {"nodes": 10**9, "gpus_per_node": 8},
    "SLOW.json": _CLUSTER | {"device": {"kind": "V100", "speed": 1e-308}},
    "THIN.json": _CLUSTER | {"inter_node_gb_per_s": 1e-300},
    "DEEP20001.json": _layers(20_001),
    "HUGE_TIME.json": _layers(4, fwd_ms=1e308),
    "NAN.json": '{"format": "pipeplan.profile/1", "name": "p", "batch_size": NaN, "layers": []}',
    "DIGITS.json": '{"format": "pipeplan.plan/1", "microbatches": ' + "9" * 5000 + "}",
    "NESTED.json": "[" * 100_000 + "]" * 100_000,
    "TWICE.json": '{"format": "pipeplan.cluster/1", "name": "a", "name": "b"}',
    "RANKS.csv": "\n".join(f"{r}F0,{r}B0" for r in range(100_000)) + "\n",
    "STAGE.csv": "0F0,0B0\n999999999999F0,999999999999B0\n",
    "SLOWLINK.json": {"steps": [{"t_ms": 0, "link": "all", "factor": 1e-300}]},
    "GRAPH-pbs-1.txt": "node1 -- Linear -- forward_compute_time=1e300, backward_compute_time=1, activation_size=1, "
    "parameter_size=1\n",
    "FIFO": _fifo,
    "DIR.json": Path.mkdir,
    "LOOP.json": _loop,
    "CKPT": _hostile_checkpoint,
}
_SIM = ["simulate", "1f1b", "-p", "4", "-m", "8"]
_PLAN = ["plan", "--cluster", "v100-8x1", "--global-batch", "64", "--profile"]
_LOCAL = ["train", "--local", "2", "--schedule", "1f1b", "-p", "2", "-m", "4"]

LIMIT_CASES: list[tuple[str, list[str], str]] = [
    # class 4: sizes
    ("pipemare minibatches", ["simulate", "pipemare", "-p", "4", "-m", "4", "--minibatches", "100000000"],
     "pipemare with p=4, m=4 x 100000000 minibatches too large: 3,600,000,000 actions, the limit is 1,000,000 actions"),
    ("a billion nodes", ["show", "cluster", "NODES.json"], "nodes x gpus_per_node (1,000,000,000 x 8) too large: "
     "8,000,000,000 devices, the limit is 131,072 devices, because"),
    ("profile -b", ["profile", "mlp", "-b", "100000000", "-o", "p.json"],
     "--batch-size too large: 100,000,000 samples, the limit is 65,536 samples, because"),
    ("20,001 layers", [*_PLAN, "DEEP20001.json"], "field 'layers' too large: 20,001 layers, the limit is 20,000 layers"),
    ("100,000-rank table", ["simulate", "RANKS.csv"], "RANKS.csv: schedule too large: 4,097 ranks, the limit is 4,096 ranks"),
    ("100,000 generated ranks", ["schedule", "1f1b", "-p", "100000", "-m", "1"], "too large: 100,000 ranks, the limit is 4,096"),
    ("stage 10^12", ["simulate", "STAGE.csv"], "stage too large: 999,999,999,999, the limit is 3,999,999, because"),
    ("timeline", ["simulate", "1f1b", "-p", "16", "-m", "100000", "--png", "t.png"],
     "the timeline of 1f1b with p=16, m=100000 too large: 3,200,000 actions, the limit is 1,000,000 actions"),
    ("model weights", ["profile", "mlp", "--opt", "hidden=1000000", "-b", "1", "-o", "p.json"],
     "weights too large: 28,000,288,000,000 bytes, the limit is 34,359,738,368 bytes"),
    ("train -b", [*_LOCAL, "-b", "100000000"], "--batch-size too large: 100,000,000 samples, the limit is 65,536"),
    ("train --threads", [*_LOCAL, "--threads", "100000"], "--threads too large: 100,000 threads, the limit is 1,024"),
    ("profile --threads", ["profile", "mlp", "-b", "8", "--threads", "100000", "-o", "p.json"], "--threads too large"),
    ("train --timeout", [*_LOCAL, "--timeout", "1e300"], "--timeout too large: 1e+300 s, the limit is 1,000,000 s"),
    ("global batch", [*_PLAN, "dapple/bert-48", "--global-batch", "4294967296"],
     "--global-batch too large: 4,294,967,296 samples, the limit is 1,073,741,824 samples"),
    ("optimizer factor", [*_PLAN, "dapple/bert-48", "--optimizer-factor", "1e300"], "--optimizer-factor too large: 1e+300"),
    ("train --seed", [*_LOCAL, "--seed", "100000000000000000000000"], "--seed too large: 100,000,000,000,000,000,000,000"),
    # class 6: finite values, the input named
    ("--fwd 1e308", [*_SIM, "--fwd", "1e308"], "--fwd too large: 1e+308 ms, the limit is 1,000,000,000 ms, because"),
    ("--act-bytes 1e300", [*_SIM, "--act-bytes", "1e300"], "--act-bytes too large: 1e+300 bytes, the limit is 1e+18"),
    ("profile time 1e308", [*_PLAN, "HUGE_TIME.json"], "HUGE_TIME.json: layers[0]: field 'fwd_ms' too large: 1e+308 ms"),
    ("cluster speed 1e-308", ["plan", "--profile", "dapple/bert-48", "--cluster", "SLOW.json", "--global-batch", "64"],
     "SLOW.json: device: field 'speed' too small: 1e-308, the limit is 1e-06, because"),
    ("link 1e-300 GB/s", ["show", "cluster", "THIN.json"], "field 'inter_node_gb_per_s' too small: 1e-300 GB/s"),
    ("graph.txt time 1e300", ["show", "profile", "GRAPH-pbs-1.txt"],
     "GRAPH-pbs-1.txt:1: node node1 forward_compute_time too large"),
    ("trace factor 1e-300", [*_SIM, "--bandwidth-trace", "SLOWLINK.json"],
     "SLOWLINK.json: bandwidth trace entry 0: factor too small"),
    # class 5: one JSON reader, every file kind said as what it is
    ("NaN", ["show", "profile", "NAN.json"], "NAN.json: line 1 column 61, at batch_size: NaN is not a number JSON allows"),
    ("5,000 digits", ["simulate", "--plan", "DIGITS.json"], "at microbatches: integer too large: 5,000 digits, the limit is 30"),
    ("100,000 levels", ["show", "cluster", "NESTED.json"], "JSON nesting too deep: 33 levels, the limit is 32 levels"),
    ("duplicate key", ["show", "cluster", "TWICE.json"], "TWICE.json: line 1 column 47, at name: duplicate key 'name'"),
    ("FIFO --plan", ["simulate", "--plan", "FIFO"], "FIFO: cannot read plan: is not a regular file (a FIFO)"),
    ("FIFO --bandwidth-trace", [*_SIM, "--bandwidth-trace", "FIFO"], "FIFO: cannot read bandwidth trace: is not a regular file"),
    ("FIFO --profile", [*_PLAN, "FIFO"], "FIFO: cannot read profile: is not a regular file (a FIFO)"),
    ("directory --plan", ["simulate", "--plan", "DIR.json"], "DIR.json: cannot read plan: is a directory"),
    ("/dev/zero --cluster", ["show", "cluster", "/dev/zero"], "/dev/zero: cannot read cluster: is not a regular file (a char"),
    ("symlink loop --profile", [*_PLAN, "LOOP.json"], "LOOP.json: cannot read profile: symlink loop"),
    # class 1: a checkpoint is data
    ("hostile checkpoint", [*_LOCAL, "--steps", "4", "--checkpoint-dir", "CKPT", "--checkpoint-every", "2", "--resume"],
     "CKPT/step-000002/rank-0.pt cannot be read as data, refused: "),
]  # fmt: skip


@pytest.mark.parametrize(("case", "argv", "fragment"), [_marked(c) for c in LIMIT_CASES], ids=[c[0] for c in LIMIT_CASES])
def test_limits_and_readers_refuse_with_one_line_before_any_work(
    case: str, argv: list[str], fragment: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 2, one `error:` line holding the fragment, no traceback, no block (a 60 s alarm), nothing written."""
    import signal

    for name in {a for a in argv if a in _INPUTS}:
        made = _INPUTS[name]
        if callable(made):
            made(tmp_path / name)
        else:
            (tmp_path / name).write_text(made if isinstance(made, str) else json.dumps(made))
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    monkeypatch.chdir(tmp_path)
    signal.signal(signal.SIGALRM, lambda *_: pytest.fail(f"{case}: blocked"))
    signal.alarm(60)
    try:
        code, out, err = run(monkeypatch, capsys, *argv)
    finally:
        signal.alarm(0)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error:"), (case, code, err)
    assert fragment in lines[0], (case, lines[0])
    assert "Traceback" not in out + err
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before, case
    assert not (tmp_path / "MARKER").exists()


@pytest.mark.torch
def test_an_allocation_no_limit_foresaw_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """torch's allocator failing (a model's activations beyond memory: `profile transformer --opt seq_len=1000000` asks
    for 2 TB) is `out of memory` with the size, exit 2, no traceback, no profile written (the failure is injected:
    a real 2 TB request depends on the machine's overcommit setting)."""
    import pipeplan.profiler.curves as curves

    def fail(*args: object, **kwargs: object) -> None:
        raise RuntimeError(
            "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to "
            "allocate 2097152000000 bytes. Error code 12 (Cannot allocate memory)"
        )

    monkeypatch.setattr(curves, "profile_batch_sizes", fail)  # the measurement (profiler.session), after the model is built
    monkeypatch.chdir(tmp_path)
    code, out, err = run(monkeypatch, capsys, "profile", "mlp", "-b", "8", "-o", "p.json", "-q")
    assert (
        code == 2 and err == "error: out of memory: torch tried to allocate 2097152000000 bytes (see docs/troubleshooting.md)\n"
    )
    assert "Traceback" not in out + err and not list(tmp_path.iterdir())


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
    ("adapt: NaN factor", [*ADAPT, "nan.json"], "at [0].factor: NaN is not a number JSON allows"),
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
    refused_in(tmp_path, ADAPT_FILES, case, argv, fragment, monkeypatch, capsys)


def refused_in(
    folder: Path,
    files: dict[str, str],
    case: str,
    argv: list[str],
    fragment: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Run `argv` in `folder` holding `files` (name -> text): exit 2, one `error:` line holding `fragment`, no
    traceback, and nothing written beside the files."""
    for name, text in files.items():
        (folder / name).write_text(text)
    monkeypatch.chdir(folder)
    code, out, err = run(monkeypatch, capsys, *argv)
    assert code == 2, (case, out, err)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), (case, err)
    assert fragment in lines[0], (case, lines[0])
    assert "Traceback" not in out + err
    assert sorted(p.name for p in folder.iterdir()) == sorted(files), case


# ---- issue 20, the runtime: --adaptive and an emulated network (train checks them before any process starts) ----

KFKB = ["train", "--local", "2", "--schedule", "kfkb", "-p", "2", "-m", "4"]
NETWORK_CASES: list[tuple[str, list[str], str]] = [
    ("--adaptive with 1f1b", [*TRAIN, "--adaptive"], "schedule '1f1b' has no k to adapt"),
    ("--adaptive with pipemare", [*KFKB[:4], "pipemare", *KFKB[5:], "--adaptive"], "--adaptive is not supported with"),
    ("--adaptive with interleaved chunks", [*KFKB[:4], "interleaved-1f1b", *KFKB[5:], "--chunks", "2", "--adaptive"],
     "interleaves 2 chunks (virtual stages) per process, over which kFkB is not defined"),
    ("--adaptive with a 1f1b plan", ["train", "--local", "1", "--plan", "PLAN", "--adaptive"], "has no k to adapt"),
    ("trace without a rate", [*KFKB, "--bandwidth-trace", "SLOW"], "needs a rate to emulate: give --emulate-gb-per-s"),
    ("trace naming a device outside the job", [*KFKB, "--emulate-gb-per-s", "1", "--bandwidth-trace", "TRACE"],
     "link [0, 9] names device 9, which this job does not run on (its devices: [0, 1])"),
    ("unsorted trace", [*KFKB, "--emulate-gb-per-s", "1", "--bandwidth-trace", "UNSORTED"], "sorted"),
    ("negative factor", [*KFKB, "--emulate-gb-per-s", "1", "--bandwidth-trace", "NEGATIVE"], "factor must be"),
    ("zero emulated rate", [*KFKB, "--emulate-gb-per-s", "0"], "--emulate-gb-per-s must be a finite number of GB/s > 0"),
    ("NaN emulated rate", [*KFKB, "--emulate-gb-per-s", "nan"], "--emulate-gb-per-s must be a finite number"),
    ("zero bucket size", [*KFKB, "--allreduce-bucket-mb", "0"], "--allreduce-bucket-mb must be a number of MiB > 0"),
    ("NaN bucket size", [*KFKB, "--allreduce-bucket-mb", "nan"], "--allreduce-bucket-mb must be a number of MiB > 0"),
    ("buckets with pipemare", [*KFKB[:4], "pipemare", *KFKB[5:], "--allreduce-bucket-mb", "25"],
     "--allreduce-bucket-mb is not supported with --schedule pipemare"),
]  # fmt: skip


NETWORK_TORCH_CASES = {"trace without a rate", "trace naming a device outside the job", "unsorted trace", "negative factor",
                       "zero emulated rate", "NaN emulated rate"}  # fmt: skip
"""The cases train refuses with torch imported (the emulated network's checks): they carry the torch marker."""


@pytest.mark.parametrize(
    ("case", "argv", "fragment"),
    [pytest.param(*c, id=c[0], marks=[pytest.mark.torch] * (c[0] in NETWORK_TORCH_CASES)) for c in NETWORK_CASES],
)
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


# ---- issue 35: the memory budget and a plan's adaptive setting (plan, adapt, train refuse before any work) ----

BUDGET_PLAN = {**ADAPT_PLAN, "schedule": "kfkb", "adaptive": {"k": 1, "k_choices": [1, 2], "memory_budget_bytes": 1e12}}
"""ADAPT_PLAN (bert-48 on devices 7 and 8 of v100-8x2-25g) with an adaptive setting; its 1F1B peak is about 4.5 GiB."""
BUDGET_FILES = {
    "plan.json": BUDGET_PLAN,
    "small.json": {**BUDGET_PLAN, "adaptive": {**BUDGET_PLAN["adaptive"], "memory_budget_bytes": 1e9}},
    "onef.json": {**BUDGET_PLAN, "schedule": "1f1b"},
    "outside.json": {**BUDGET_PLAN, "k": 3, "adaptive": {**BUDGET_PLAN["adaptive"], "k": 3}},
    "t.json": [{"t_ms": 0, "link": [7, 8], "factor": 0.5}],
}
BUDGET_ADAPT = ["adapt", "--iterations", "3", "--bandwidth-trace", "t.json", "--plan"]
BUDGET_TRAIN = ["train", "--local", "2", "--plan"]
BUDGET_CASES: list[tuple[str, list[str], str]] = [
    ("plan: budget below 1F1B", [*_PLAN, "dapple/bert-48", "--adaptive", "--memory-budget", "1MiB", "--out", "p.json"],
     "--memory-budget 1 MiB is below 1F1B's peak: k=1 holds"),
    ("plan: --adaptive with gpipe", [*_PLAN, "dapple/bert-48", "--adaptive", "--schedule", "gpipe"],
     "--adaptive chooses kfkb's k between iterations; schedule 'gpipe' has no k to adapt"),
    ("plan: --adaptive with interleaved", [*_PLAN, "dapple/bert-48", "--adaptive", "--schedule", "interleaved-1f1b"],
     "schedule 'interleaved-1f1b' has no k to adapt"),
    ("plan: budget without --adaptive", [*_PLAN, "dapple/bert-48", "--memory-budget", "8GiB"],
     "--memory-budget 8GiB bounds an adaptive setting's k; give --adaptive"),
    ("plan: budget not a size", [*_PLAN, "dapple/bert-48", "--adaptive", "--memory-budget", "lots"],
     "--memory-budget must be a byte size such as 14GiB"),
    ("plan: budget 0", [*_PLAN, "dapple/bert-48", "--adaptive", "--memory-budget", "0"],
     "--memory-budget must be a byte size > 0"),
    ("adapt: budget below 1F1B", [*BUDGET_ADAPT, "plan.json", "--memory-budget", "2GiB"],
     "--memory-budget 2 GiB is below 1F1B's peak: k=1 holds"),
    ("adapt: the plan's budget below 1F1B", [*BUDGET_ADAPT, "small.json"],
     "plan small.json adaptive.memory_budget_bytes 954 MiB is below 1F1B's peak"),
    ("adapt: block on a 1f1b plan", [*BUDGET_ADAPT, "onef.json"],
     "an adaptive setting changes kfkb's k, but the plan's schedule is '1f1b'"),
    ("adapt: start k outside k_choices", [*BUDGET_ADAPT, "outside.json"], "adaptive.k 3 is not among adaptive.k_choices [1, 2]"),
    ("train: budget below 1F1B", [*BUDGET_TRAIN, "plan.json", "--memory-budget", "2GiB"],
     "--memory-budget 2 GiB is below 1F1B's peak"),
    ("train: the plan's budget below 1F1B", [*BUDGET_TRAIN, "small.json"],
     "plan small.json adaptive.memory_budget_bytes 954 MiB is below 1F1B's peak"),
    ("train: block on a 1f1b plan", [*BUDGET_TRAIN, "onef.json"], "but the plan's schedule is '1f1b'"),
    ("train: budget without --adaptive", [*KFKB, "--memory-budget", "1GiB"],
     "--memory-budget 1GiB bounds the k of an adaptive run; give --adaptive too"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "argv", "fragment"), BUDGET_CASES, ids=[c[0] for c in BUDGET_CASES])
def test_bad_budget_or_adaptive_setting_exits_2_with_one_line(
    case: str, argv: list[str], fragment: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A budget below 1F1B's peak (flag or plan), an adaptive block that contradicts its plan, --adaptive on a schedule
    with no k, a budget with nothing to bound: exit 2, one `error:` line holding the fragment, nothing written."""
    files = {name: json.dumps(content) for name, content in BUDGET_FILES.items()}
    refused_in(tmp_path, files, case, argv, fragment, monkeypatch, capsys)
