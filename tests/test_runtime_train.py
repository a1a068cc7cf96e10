"""Runtime end to end: `pipeplan train --local N` learns scikit-learn's digits and reports a measured timeline."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipeplan.core.schedule import Action

pytest.importorskip("torch")
pytest.importorskip("sklearn")

from runtime_cli import BOOT, run_train

pytestmark = pytest.mark.torch  # every test here needs torch (make test-fast leaves them out)


def assert_learns(losses: list[float]) -> None:
    """The mean loss of the last 10 iterations is well below that of the first 10 (digits starts near ln 10 = 2.30)."""
    first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
    assert first > 2.0, losses
    assert last < first - 0.5, f"loss did not decrease enough: first 10 mean {first:.3f}, last 10 mean {last:.3f}: {losses}"


@pytest.mark.slow
def test_interleaved_1f1b_on_four_processes_learns_digits() -> None:
    """Four processes with two chunks each train an MLP on digits for 50 iterations with decreasing loss."""
    args = ["--local", "4", "--schedule", "interleaved-1f1b", "-p", "4", "-m", "4", "--chunks", "2", "--opt", "hidden=64",
            "--opt", "blocks=7", "--steps", "50", "--batch-size", "64", "--lr", "5e-3", "--json", "--no-predict"]  # fmt: skip
    done = run_train(args)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["schedule"] == "interleaved-1f1b"
    assert len(out["losses"]) == 50
    assert_learns(out["losses"])
    # every process's optimizer step per iteration, process 0's being the one `optimizer_ms` reports
    by_process = out["optimizer_ms_by_process"]
    assert len(by_process) == 50 and all(len(row) == 4 and min(row) > 0 for row in by_process)
    assert [row[0] for row in by_process] == out["optimizer_ms"]


@pytest.mark.slow
def test_zb_h1_learns_digits_and_writes_the_measured_timeline(tmp_path: Path) -> None:
    """A zero-bubble run learns, its trace holds every F, I and W of the last iteration, and a prediction is reported."""
    trace = tmp_path / "zb.json"
    args = ["--local", "4", "--schedule", "zb-h1", "-p", "4", "-m", "8", "--opt", "hidden=64", "--opt", "blocks=7",
            "--steps", "50", "--batch-size", "64", "--lr", "5e-3", "--json", "--timeline", str(trace), "--predict"]  # fmt: skip
    done = run_train(args)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert_learns(out["losses"])
    events = [e for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X" and e["tid"] == 0]
    assert sorted({e["name"][1] for e in events}) == ["F", "I", "W"]
    assert len(events) == 4 * 8 * 3
    assert sorted({e["pid"] for e in events}) == [0, 1, 2, 3]
    assert out["predicted_ms"] > 0 and out["measured_ms"] > 0
    assert out["link"]["latency_us"] > 0


@pytest.mark.slow
def test_train_rejects_a_world_size_that_does_not_hold_the_pipeline() -> None:
    """Three processes cannot run a two-stage pipeline with no replicas: exit 2 with a one-line reason."""
    done = run_train(["--local", "3", "--schedule", "1f1b", "-p", "2", "-m", "4", "--steps", "1", "--no-predict"])
    assert done.returncode == 2
    assert "3 processes cannot hold whole pipelines of 2 devices" in done.stderr
    assert "Traceback" not in done.stderr


BASE = ["--schedule", "1f1b", "-p", "2", "-m", "4", "--no-predict"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--local", "0"], "--local must be >= 1, got 0"),
        (["--local", "2", "--steps", "0"], "--steps must be >= 1, got 0"),
        (["--local", "2", "--lr", "nan"], "--lr must be a finite number >= 0 (0 trains nothing), got nan"),
        (["--local", "2", "--lr", "-1"], "--lr must be a finite number >= 0 (0 trains nothing), got -1.0"),
        (["--local", "2", "--timeout", "inf"], "--timeout must be a finite number of seconds > 0, got inf"),
        (["--local", "2", "--keep-last", "-1"], "--keep-last must be >= 0, got -1"),
        (["--local", "2", "--png", "out.xyz"], "--png 'out.xyz' must end with .png"),
        (["--local", "2", "--timeline", "/no/such/folder/t.json"], "--timeline '/no/such/folder/t.json': folder"),
        (["--local", "2", "--resume"], "--checkpoint-every and --resume need --checkpoint-dir"),
        (["--local", "2", "--optimizer", "lamb"], "--optimizer must be one of adam, sgd, sgd_momentum, got 'lamb'"),
    ],
)
def test_train_checks_its_options_once_before_any_process_starts(args: list[str], message: str) -> None:
    """Each bad option: exit 2, one line naming the flag and the value, printed by the launcher (no rank prefix)."""
    done = run_train([*BASE, *args], timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(("error: TrainConfigError: ", "error: OutputError: ")) and message in lines[0]
    assert "rank " not in done.stderr


@pytest.mark.slow
def test_train_refuses_to_overwrite_checkpoints_and_says_when_a_resumed_run_is_done(tmp_path: Path) -> None:
    """A folder holding a checkpoint: without --resume, exit 2 naming it; with --resume at --steps, a note, exit 0."""
    (tmp_path / "step-000004").mkdir()
    (tmp_path / "latest.json").write_text(json.dumps({"format": "pipeplan.checkpoint/1", "step": 4}))
    common = [*BASE, "--local", "2", "--checkpoint-dir", str(tmp_path)]
    done = run_train([*common, "--checkpoint-every", "2", "--steps", "4"], timeout=120)
    assert done.returncode == 2
    assert f"--checkpoint-dir {str(tmp_path)!r} already holds checkpoints (step 4); add --resume" in done.stderr
    finished = run_train([*common, "--resume", "--steps", "4"], timeout=120)
    assert finished.returncode == 0, finished.stderr
    assert "is at step 4, and --steps is 4: nothing left to run" in finished.stderr


@pytest.mark.slow
def test_train_without_a_launcher_says_how_to_start_it() -> None:
    """Outside torchrun and without --local, train exits 2 and names the missing variables."""
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    done = subprocess.run([sys.executable, "-c", BOOT, "train", "--schedule", "gpipe", "--steps", "1"], capture_output=True,
                          text=True, timeout=120, env=env)  # fmt: skip
    assert done.returncode == 2
    assert "must run under torchrun or with --local N" in done.stderr


@pytest.mark.slow
def test_a_list_plan_file_with_a_replicated_stage_matches_unpipelined_gradients(tmp_path: Path) -> None:
    """`train --plan` runs a `list` plan (hand-made order, stage 0 on 2 devices) and its gradients match one process's."""
    import torch

    from pipeplan.core.plan import Plan, Stage
    from pipeplan.io.plan_json import write_plan
    from pipeplan.models.build import build_model
    from pipeplan.models.zoo.datasets import batch_indices

    order = (
        tuple(Action.parse(a) for a in ["0F0", "0F1", "0F2", "0B0", "0B1", "0F3", "0B2", "0B3"]),
        tuple(Action.parse(a) for a in ["1F0", "1I0", "1F1", "1I1", "1W0", "1F2", "1W1", "1I2", "1F3", "1I3", "1W2", "1W3"]),
    )
    plan = Plan((Stage(0, 1, (0, 1)), Stage(2, 3, (2,))), 1, 4, 3, "list", order=order)
    write_plan(plan, tmp_path / "plan.json", "mlp", "local")
    args = ["--local", "3", "--plan", str(tmp_path / "plan.json"), "--opt", "hidden=8", "--opt", "blocks=3",
            "--dtype", "float64", "--steps", "1", "--lr", "0", "--optimizer", "sgd", "--seed", "4",
            "--save-grads", str(tmp_path), "--no-predict", "--json"]  # fmt: skip
    done = run_train(args)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["schedule"] == "list"

    model = build_model("mlp", {"hidden": 8, "blocks": 3}, "digits", "float64", seed=4)
    idx = batch_indices(len(model.dataset), 12, 0, 4)
    model.loss_fn(torch.nn.Sequential(*model.layers)(model.dataset.inputs[idx]), model.dataset.targets[idx]).backward()
    expected = {f"{i}.{n}": p.grad for i, layer in enumerate(model.layers) for n, p in layer.named_parameters()}
    for rank, layers in ((0, (0, 1)), (1, (0, 1)), (2, (2, 3))):
        grads = torch.load(tmp_path / f"grads-rank-{rank}.pt")
        assert sorted({int(k.split(".")[0]) for k in grads}) == list(layers)
        for key, grad in grads.items():
            torch.testing.assert_close(grad, expected[key], rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_a_plan_for_another_model_names_the_plan_module_and_dataset(tmp_path: Path) -> None:
    """A 2-layer plan run with the mlp (more layers): exit 2 naming the plan file, --module, its options and --dataset."""
    from pipeplan.core.plan import Plan, Stage
    from pipeplan.io.plan_json import write_plan

    path = tmp_path / "two.json"
    write_plan(Plan((Stage(0, 0, (0,)), Stage(1, 1, (1,))), 1, 2, 16, "1f1b"), path, "nowhere.json", "nowhere.json")
    done = run_train(["--local", "2", "--plan", str(path), "--module", "mlp", "--opt", "blocks=3", "--steps", "1",
                      "--no-predict"], timeout=180)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert f"plan {path} covers 2 layers but --module mlp (options blocks=3) with --dataset" in done.stderr
    assert "the plan was made for another model" in done.stderr and "Traceback" not in done.stderr
