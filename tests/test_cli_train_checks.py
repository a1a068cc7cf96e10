"""Tests of api.train.train_setup through cli.train_cmd: every `train` option with a bad value is refused by the launcher,
exit 2, one line printed once, before any process starts (launch_local is replaced by one that records it was called)."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest

from cli_runner import run
from pipeplan.cli import train_cmd

pytest.importorskip("torch")
pytestmark = pytest.mark.torch  # the launcher's model checks import torch (make test-fast leaves them out)

BASE = ["train", "--local", "2", "--schedule", "1f1b", "--steps", "1"]
"""A job the launcher accepts: the cases below change one thing each."""

BAD: dict[str, list[list[str]]] = {
    "plan": [["--plan", "no-such-plan.json"]],
    "schedule": [["--schedule", "no-such-schedule"]],
    "lr_reschedule": [["--schedule", "pipemare", "--lr-reschedule", "0"], ["--lr-reschedule", "5"]],
    "discrepancy_decay": [["--schedule", "pipemare", "--discrepancy-decay", "1.5"],
                          ["--schedule", "pipemare", "--discrepancy-decay", "nan"]],
    "sync_warmup": [["--schedule", "pipemare", "--sync-warmup", "-1"], ["--schedule", "pipemare", "--sync-warmup", "5"]],
    "weight_prediction": [["--weight-prediction"]],
    "stages": [["-p", "0"], ["-p", "-2"], ["-p", "3"]],
    "microbatches": [["-m", "0"], ["-m", "-1"]],
    "k": [["--schedule", "kfkb", "--k", "0"], ["--k", "2"]],
    "chunks": [["--schedule", "interleaved-1f1b", "-v", "0"]],
    "replicas": [["--replicas", "a,b"], ["--replicas", "1,0"], ["--replicas", "1,1,1"]],
    "module": [["--module", "no-such-model"], ["--module", "no_such_module_here:build"], ["--module", ""]],
    "options": [["--opt", "no_such_option=3"], ["--opt", "hidden=abc"], ["--opt", "hidden"], ["--opt", "=3"]],
    "dataset": [["--dataset", "no-such-data"], ["--module", "transformer", "--dataset", "digits"],
                ["--dataset", "pysource"]],
    "dtype": [["--dtype", "float16"]],
    "precision": [["--precision", "fp8"], ["--dtype", "float64", "--precision", "bf16"],
                  ["--schedule", "pipemare", "--precision", "fp16"]],
    "data": [["--data", "no_such_data_here:build"], ["--data", "nocolon"], ["--data", "json:nope"],
             ["--data", "json:dumps"]],
    "loss": [["--loss", "no_such_loss_here:fn"], ["--loss", "json:JSONDecoder.nope"]],
    "eval_fraction": [["--eval-fraction", "1.5"], ["--eval-fraction", "-0.1"], ["--eval-fraction", "0.2"]],
    "batch_size": [["-b", "0"], ["-b", "-4"], ["-b", "6"], ["-b", "100000000"]],
    "steps": [["--steps", "0"], ["--steps", "-3"]],
    "epochs": [["--epochs", "0"], ["--steps", "2", "--epochs", "1"]],
    "evaluate": [["--eval", "--schedule", "no-such-schedule"]],
    "lr": [["--lr", "nan"], ["--lr", "inf"], ["--lr", "-0.1"]],
    "lr_schedule": [["--lr-schedule", "linear"]],
    "optimizer": [["--optimizer", "adagrad"]],
    "seed": [["--seed", "-1"], ["--seed", str(2**40)]],
    "checkpoint_dir": [["--checkpoint-dir", "ck"]],
    "checkpoint_every": [["--checkpoint-every", "-1"], ["--checkpoint-every", "2"]],
    "keep_last": [["--keep-last", "-1"]],
    "resume": [["--resume"]],
    "timeline": [["--timeline", "no-such-folder/t.json"], ["--timeline", "."]],
    "trace_out": [["--trace", "no-such-folder/t.json"], ["--timeline", "t.json", "--trace", "u.json"]],
    "png": [["--png", "t.txt"], ["--png", "no-such-folder/t.png"]],
    "predict": [["--schedule", "pipemare", "--predict"]],
    "profile": [["--profile", "dapple/bert-48"]],
    "cluster": [["--cluster", "v100-8x1"]],
    "batch_scaling": [["--batch-scaling", "fast"]],
    "warmup_steps": [["--warmup-steps", "-1"]],
    "timeout": [["--timeout", "0"], ["--timeout", "nan"], ["--timeout", "inf"], ["--timeout", "-5"]],
    "threads": [["--threads", "0"], ["--threads", "100000"]],
    "bandwidth_trace": [["--bandwidth-trace", "no-such-trace.json"]],
    "emulate_gb_per_s": [["--emulate-gb-per-s", "-1"], ["--emulate-gb-per-s", "nan"]],
    "allreduce_bucket_mb": [["--allreduce-bucket-mb", "0"], ["--allreduce-bucket-mb", "nan"], ["--allreduce-bucket-mb", "-25"]],
    "adaptive": [["--adaptive"]],
    "memory_budget": [["--memory-budget", "lots"], ["--memory-budget", "0"], ["--memory-budget", "1GiB"],
                      ["--schedule", "kfkb", "--adaptive", "--memory-budget", "-1"]],
    "local": [["--local", "0"], ["--local", "100000"]],
    "backend": [["--backend", "mpi"]],
    "save_grads": [["--save-grads", "g.pt"], ["--save-grads", "no-such-folder/g"]],
    "as_json": [["--json", "--steps", "0"]],
    "quiet": [["--quiet", "--steps", "0"]],
}  # fmt: skip
"""Each option of `train` (its parameter's name) with command-line pieces that make the job bad because of it; a
switch with no bad value of its own is paired with a bad neighbour, to show it changes nothing."""

CASES = [(option, args) for option, cases in BAD.items() for args in cases]


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[list[str]]:
    """launch_local replaced by one that records its command and starts nothing; the test runs in a fresh folder."""
    from pipeplan.runtime.training import launch

    started: list[list[str]] = []

    def record(nprocs: int, argv: list[str], *args: object, **kwargs: object) -> int:
        started.append(list(argv))
        return 0

    monkeypatch.setattr(launch, "launch_local", record)
    monkeypatch.chdir(tmp_path)
    return started


def test_every_train_option_has_a_bad_case() -> None:
    """BAD names every parameter of the train command, and only those."""
    assert set(BAD) == set(inspect.signature(train_cmd.train).parameters)


def test_the_base_job_reaches_the_launch(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], launches: list[list[str]]
) -> None:  # fmt: skip
    """The job every case changes passes the launcher's checks and starts its processes once."""
    code, _, err = run(monkeypatch, capsys, *BASE)
    assert (code, err, len(launches)) == (0, "", 1)


@pytest.mark.parametrize(("option", "args"), CASES, ids=[f"{o}-{' '.join(a)}" for o, a in CASES])
def test_a_bad_option_is_refused_before_any_process_starts(
    option: str, args: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    launches: list[list[str]], tmp_path: Path,
) -> None:  # fmt: skip
    """Exit 2 with one line on stderr, printed once, no process started, nothing written."""
    base = BASE[:3] + BASE[5:] if "--plan" in args else BASE
    code, out, err = run(monkeypatch, capsys, *base, *args)
    lines = err.splitlines()
    assert (code, launches) == (2, []), err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert out == ""
    assert list(tmp_path.iterdir()) == []


def test_a_module_from_the_command_line_is_named_with_its_flag(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], launches: list[list[str]]
) -> None:  # fmt: skip
    """--module, --opt and --dataset are each named in their refusal (MODULE_SPEC, the option), with the value."""
    for args, text in ((["--module", "nosuch"], "ProfileError: MODULE_SPEC 'nosuch' is neither"),
                       (["--opt", "hiden=3"], "MODULE_SPEC 'mlp' has no option 'hiden'"),
                       (["--opt", "hidden=abc"], "'hidden' must be a int, got 'abc'"),
                       (["--dataset", "nope"], "--dataset must be one of auto"),
                       (["-b", "0"], "--batch-size must be an integer >= 1"),
                       (["--batch-scaling", "x"], "--batch-scaling must be one of")):  # fmt: skip
        code, _, err = run(monkeypatch, capsys, *BASE, *args)
        assert code == 2 and text in err, err
    assert launches == []


def test_nccl_without_cuda_is_refused_in_the_launcher(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], launches: list[list[str]]
) -> None:  # fmt: skip
    """--backend nccl where torch sees no CUDA device, or fewer than --local N: one line naming --backend, before any
    process starts."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, _, err = run(monkeypatch, capsys, *BASE, "--backend", "nccl")
    assert (code, launches) == (2, []) and err.startswith("error: TrainConfigError: --backend nccl needs a CUDA device")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    code, _, err = run(monkeypatch, capsys, *BASE, "--backend", "nccl")
    assert (code, launches) == (2, []) and "--local 2 needs 2 devices, torch sees 1" in err, err


def test_under_torchrun_the_sizes_are_checked_against_world_size(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], launches: list[list[str]]
) -> None:  # fmt: skip
    """Without --local (torchrun), a process refuses sizes WORLD_SIZE cannot hold before it joins a process group."""
    from pipeplan.api.train import training

    joined: list[object] = []
    monkeypatch.setattr(training, "run_part", lambda *args: joined.append(args))
    monkeypatch.setenv("WORLD_SIZE", "3")
    code, _, err = run(monkeypatch, capsys, "train", "--schedule", "1f1b", "--steps", "1")
    assert (code, joined) == (2, []) and "3 processes cannot hold whole pipelines of 2 devices" in err
    monkeypatch.setenv("WORLD_SIZE", "2")
    code, _, err = run(monkeypatch, capsys, "train", "--schedule", "1f1b", "--steps", "1", "-b", "0")
    assert (code, joined) == (2, []) and "--batch-size must be an integer >= 1" in err


def test_a_plan_job_checks_its_model_flags_too(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], launches: list[list[str]], tmp_path: Path
) -> None:  # fmt: skip
    """With --plan, --opt is checked against the plan's model before any process starts."""
    from pipeplan import api

    plan = api.plan("pipedream/alexnet", "v100-8x1", 64, schedule="1f1b").plan
    api.save_plan(plan, str(tmp_path / "p.json"), "pipedream/alexnet", "v100-8x1")
    before = json.loads((tmp_path / "p.json").read_text())
    devices = str(len(plan.all_devices))
    code, _, err = run(monkeypatch, capsys, "train", "--local", devices, "--plan", "p.json", "--module", "mlp",
                       "--opt", "hiden=3")  # fmt: skip
    assert (code, launches) == (2, []) and "MODULE_SPEC 'mlp' has no option 'hiden'" in err, err
    assert json.loads((tmp_path / "p.json").read_text()) == before


@pytest.fixture
def bf16_plan(tmp_path: Path) -> Path:
    """A 2-stage 1f1b plan (p.json) over a profile of mlp measured under bf16 autocast (bf16.json), on two CPUs."""
    from pipeplan import api

    profile = api.profile_model("mlp", 4, options={"hidden": 8}, batch_sizes=[4], runs=1, warmup=0, precision="bf16")
    api.save_profile(profile, str(tmp_path / "bf16.json"))
    cluster = {"format": "pipeplan.cluster/1", "name": "two-cpus", "devices": [{"kind": "cpu", "memory_gb": 4}] * 2,
               "bandwidth_gb_per_s": [[0, 1], [1, 0]], "latency_us": [[0, 10], [10, 0]]}  # fmt: skip
    (tmp_path / "two.json").write_text(json.dumps(cluster))
    plan = api.plan(profile, str(tmp_path / "two.json"), 8, schedule="1f1b", replication="none").plan
    api.save_plan(plan, str(tmp_path / "p.json"), "bf16.json", "two.json")
    return tmp_path / "p.json"


@pytest.mark.parametrize(
    ("args", "names"),
    [(["--profile", "bf16.json"], ("bf16 autocast over float32", "trains in float32", "--dtype float32")),
     (["--predict", "--dtype", "float64"], ("bf16 autocast over float32", "trains in float64", "--dtype float64")),
     (["--profile", "bf16.json", "--precision", "fp16"], ("bf16 autocast", "trains in fp16 autocast", "--precision fp16"))],
)  # fmt: skip
def test_a_prediction_asked_in_other_numbers_is_refused_before_any_process_starts(
    bf16_plan: Path, args: list[str], names: tuple[str, ...], monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], launches: list[list[str]],
) -> None:  # fmt: skip
    """--profile (or --predict) measured in another dtype or precision than the run's: exit 2, one line naming both
    numbers and the option that measures the run's, no process started."""
    code, out, err = run(monkeypatch, capsys, "train", "--local", "2", "--plan", "p.json", "--steps", "1", *args)
    assert (code, launches, out) == (2, [], ""), err
    assert len(err.splitlines()) == 1 and err.startswith("error: ProfileError: profile "), err
    assert all(name in err for name in names) and "profile the model again with" in err, err


def test_the_plans_own_profile_in_other_numbers_predicts_nothing_and_the_run_starts(
    bf16_plan: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], launches: list[list[str]]
) -> None:  # fmt: skip
    """The plan's own profile, not asked for, in other numbers: the job starts, its launcher noting once why nothing is
    predicted (its workers run the config it built and check nothing again); in the profile's own numbers it starts
    with no note."""
    notes = []
    for extra in ([], ["--precision", "bf16"]):
        code, _, err = run(monkeypatch, capsys, "train", "--local", "2", "--plan", "p.json", "--steps", "1", *extra)
        assert code == 0, err
        notes.append(err)
    assert notes[0].startswith("note: no predicted step: profile") and len(notes[0].splitlines()) == 1, notes[0]
    assert notes[1] == ""
    assert len(launches) == 2


def test_a_worker_notes_once_why_the_plans_own_profile_predicts_nothing(
    bf16_plan: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:  # fmt: skip
    """prediction_numerics adds one note line saying why there is no prediction (said by train once every check
    passed); False."""
    from pipeplan.api.train.train_inputs import read_profile
    from pipeplan.api.train.train_setup import prediction_numerics

    monkeypatch.chdir(bf16_plan.parent)
    notes: list[str] = []
    assert not prediction_numerics(read_profile("bf16.json"), False, ("float64", "full"), notes)
    assert len(notes) == 1 and len(notes[0].splitlines()) == 1, notes
    assert notes[0].startswith("note: no predicted step: profile bf16.json was measured in bf16 autocast over float32, "
                               "but this run trains in float64"), notes  # fmt: skip
    assert prediction_numerics(read_profile("bf16.json"), True, ("float32", "bf16"), notes)
    assert len(notes) == 1 and capsys.readouterr().err == ""


def test_a_tensor_parallel_or_sharded_plan_is_refused_before_any_process_starts(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], launches: list[list[str]], tmp_path: Path
) -> None:  # fmt: skip
    """A plan whose tp > 1 stage (sequence-parallel or not) has an asynchronous schedule, or with zero 2 on one, gets
    one line naming the stage's setting (or zero) and the way out: the runtime runs tensor-parallel stages and
    sharded state on synchronous schedules only. (A tp stage with no transformer block, as mlp's, runs its layers
    whole on each TP rank, sequence-parallel or not: tests/test_runtime_tensor_parallel.)"""
    from pipeplan.core.plan import Plan, Stage
    from pipeplan.io.plan_json import write_plan

    plans = {
        "tp.json": (
            Plan((Stage(0, 2, (0, 1), tp=2, sequence_parallel=True),), 1, 2, 2, "pipemare"),
            "stage 0 has tp 2 and the plan schedule 'pipemare': the runtime runs tensor-parallel stages on a synchronous "
            "schedule with a fixed k; give the plan 1f1b, gpipe or kfkb without adaptive",
        ),
        "zero.json": (
            Plan((Stage(0, 2, (0, 1)),), 1, 2, 2, "pipemare", zero=2),
            "plan zero 2 and schedule 'pipemare': the runtime shards optimizer state on a synchronous schedule",
        ),
    }
    for name, (plan, text) in plans.items():
        path = tmp_path / name
        write_plan(plan, path, "mlp-3", "cpu-2")
        code, out, err = run(monkeypatch, capsys, "train", "--local", "2", "--plan", str(path), "--steps", "1")
        assert (code, out, launches) == (2, "", []), err
        assert err.count("\n") == 1 and f"TrainConfigError: plan {path}: {text}" in err, err


def test_trace_is_the_hidden_old_name_of_timeline(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:  # fmt: skip
    """train --trace PATH reaches the API as --timeline PATH would, and --help shows only --timeline."""
    from pipeplan.api.train import training

    seen: list[object] = []
    monkeypatch.setattr(training, "train", lambda flags, *args, **kwargs: seen.append(flags.timeline) or 0)
    for flag in ("--timeline", "--trace"):
        code, _, err = run(monkeypatch, capsys, *BASE, flag, "t.json")
        assert code == 0, err
    assert seen == ["t.json", "t.json"]
    _, out, _ = run(monkeypatch, capsys, "train", "--help")
    assert "--timeline" in out and "--trace" not in out


def test_a_local_worker_is_given_the_launcher_s_config_not_the_command_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:  # fmt: skip
    """train --local 2 starts its workers with api.train.training's boot and no arguments; the job it leaves in
    the rendezvous store (launch_local's `job`) holds the TrainConfig the launcher built (runtime.training.config_json)
    and the flags, without --local."""
    from pipeplan.api.train import train_workers
    from pipeplan.api.train.train_flags import TrainFlags
    from pipeplan.runtime.training import launch
    from pipeplan.runtime.training.config_json import config_from_json

    seen: list[tuple[str, tuple[object, ...], dict[str, object]]] = []

    def record(nprocs: int, code: str, *args: object, job: bytes, **kwargs: object) -> int:
        seen.append((code, args, json.loads(job)))
        return 0

    monkeypatch.setattr(launch, "launch_local", record)
    monkeypatch.chdir(tmp_path)
    code, _, err = run(monkeypatch, capsys, *BASE, "--lr", "0.25", "--timeline", "t.json")
    assert code == 0, err
    ((boot, args, job),) = seen
    assert (boot, args) == (train_workers.WORKER_BOOT, ())
    flags = TrainFlags.from_json(job["flags"])  # type: ignore[arg-type]
    assert (flags.local, flags.lr, flags.timeline, flags.steps, flags.schedule) == (None, 0.25, "t.json", 1, "1f1b")
    config = config_from_json(job["config"])  # type: ignore[arg-type]
    assert (config.lr, config.steps, config.timeline, config.plan) == (0.25, 1, True, None)
    assert config.layout is not None and (config.layout.name, config.layout.stages) == ("1f1b", 2)
