"""Bucketed gradient all-reduce in the runtime (runtime.execution.replicas with a bucket size, train's
--allreduce-bucket-mb): the buckets are the simulator's (sim.cost.grad_buckets), launched in order from gradient hooks
during the last backward, and `train` with them gives the plain loop's losses, sharded optimizer state included."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from cli_runner import run  # noqa: E402
from pipeplan.runtime.execution import replicas  # noqa: E402
from pipeplan.runtime.execution.replicas import GradSync, layer_buckets  # noqa: E402
from pipeplan.sim.cost.grad_buckets import fill_buckets  # noqa: E402
from plain_loops import charlm_losses  # noqa: E402
from runtime_cli import run_train  # noqa: E402

pytestmark = pytest.mark.torch

TOLERANCE = 1e-9
LR = 0.05
OPTIONS = {"d_model": 16, "heads": 4, "layers": 2, "seq_len": 8}


def _layers() -> list[nn.Module]:
    torch.manual_seed(0)
    return [nn.Linear(6, 7), nn.Tanh(), nn.Linear(7, 5), nn.Tanh(), nn.Linear(5, 3)]


def test_the_runtime_cuts_a_stage_into_the_simulators_buckets() -> None:
    """float64 layers of 392, 0, 320, 0 and 144 bytes at a 400-byte cap: the runtime's buckets hold the parameters
    of exactly the layers sim.cost.grad_buckets.fill_buckets puts together ([4, 2], [0]), in reverse layer order."""
    layers = [layer.double() for layer in _layers()]
    params = [p for layer in layers for p in layer.parameters()]
    nbytes = [float(sum(p.numel() * p.element_size() for p in layer.parameters())) for layer in layers]
    assert nbytes == [392.0, 0.0, 320.0, 0.0, 144.0]
    got = layer_buckets(layers, params, 400.0)
    want = fill_buckets(nbytes, 400.0)
    assert want == [[4, 2], [0]]
    assert [[id(p) for p in bucket] for bucket in got] == [
        [id(p) for i in members for p in layers[i].parameters()] for members in want
    ]


def _sync(layers: list[nn.Module], bucket_bytes: float, launched: list[dict[str, Any]]) -> GradSync:
    """A GradSync of one stage with copies (a stand-in group), its launches recorded instead of sent."""
    sync = GradSync.__new__(GradSync)
    sync.bucket_bytes, sync._buckets, sync._pending = bucket_bytes, {}, []
    sync.group, sync.members, sync.wire = object(), (0, 1), None  # type: ignore[assignment]
    sync.plan = type("P", (), {"zero": 0, "stages": [type("S", (), {"devices": (0, 1)})()]})()  # type: ignore[assignment]
    sync.use_buckets(0, layers, [p for layer in layers for p in layer.parameters()])
    return sync


def test_buckets_launch_in_order_from_hooks_during_the_last_backward_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Armed for the last backward, each bucket is launched by the hook of its last parameter, in bucket order, with
    its gradients already accumulated, before the backward returns; an unarmed backward launches nothing, and
    `start` after the armed one launches nothing more."""
    layers = [layer.double() for layer in _layers()]
    model = nn.Sequential(*layers)
    launched: list[dict[str, Any]] = []
    backward_done = [False]

    def record(params: list[torch.Tensor], group: object, what: str, wire: object, ring: object, chain: object = None) -> str:
        launched.append({"what": what, "ready": all(p.grad is not None for p in params), "during": not backward_done[0]})
        return what

    monkeypatch.setattr(replicas, "launch", record)
    sync = _sync(layers, 400.0, launched)
    x = torch.randn(4, 6, dtype=torch.float64)
    model(x).sum().backward()  # an earlier microbatch: not armed
    assert launched == []
    sync.arm(0)
    model(x).sum().backward()
    backward_done[0] = True
    assert [a["what"].split(" (")[1].split(")")[0] for a in launched] == ["bucket 0 of 2", "bucket 1 of 2"]
    assert all(a["ready"] and a["during"] for a in launched)
    sync.start(0, [p for p in model.parameters()])
    assert len(launched) == 2
    sync.begin()
    model(x).sum().backward()  # the next iteration's first microbatch: disarmed again
    assert len(launched) == 2


def test_start_launches_what_no_hook_did_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """Gradients accumulated by hand (a split W, which no hook sees): `start` launches every bucket, in order."""
    layers = [layer.double() for layer in _layers()]
    launched: list[str] = []
    monkeypatch.setattr(replicas, "launch", lambda params, group, what, wire, ring, chain=None: launched.append(what))
    sync = _sync(layers, 400.0, [])
    sync.arm(0)
    for p in (p for layer in layers for p in layer.parameters()):
        p.grad = torch.ones_like(p)
    sync.start(0, [p for layer in layers for p in layer.parameters()])
    assert [w.split(" (")[1].split(")")[0] for w in launched] == ["bucket 0 of 2", "bucket 1 of 2"]


def _plan_file(tmp_path: Path, zero: int) -> str:
    """charlm's embedding and block 0 on 2 replicas, the rest on one (3 processes), zero `zero`."""
    from pipeplan.core.plan import Plan, Stage
    from pipeplan.io.plan_json import write_plan

    plan = Plan((Stage(0, 1, (0, 1)), Stage(2, 3, (2,))), 1, 4, 2, "1f1b", zero=zero)
    path = tmp_path / f"plan-{zero}.json"
    write_plan(plan, path, "charlm", "local")
    return str(path)


def _train_args(plan: str, *extra: str) -> list[str]:
    opts = [x for key, value in OPTIONS.items() for x in ("--opt", f"{key}={value}")]
    return ["--local", "3", "--plan", plan, "--module", "charlm", *opts, "--dtype", "float64", "--optimizer", "adam",
            "--lr", str(LR), "--steps", "3", "--no-predict", "--json", *extra]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("zero", [0, 1])
def test_train_with_buckets_gives_the_plain_loops_losses(tmp_path: Path, zero: int) -> None:
    """`train --allreduce-bucket-mb 0.01` (10 KiB buckets) on a stage of 2 replicas beside one of 1, on an emulated
    network, zero 0 and zero 1 (sharded Adam state): its 3 losses equal the plain torch loop's to 1e-9, and the
    report says stage 0's all-reduce went in more than one bucket per step."""
    args = _train_args(_plan_file(tmp_path, zero), "--allreduce-bucket-mb", "0.01", "--emulate-gb-per-s", "2")
    done = run_train(args, timeout=600)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    want = charlm_losses(OPTIONS, lambda params: torch.optim.Adam(params, lr=LR))
    losses = report["losses"]
    assert len(losses) == 3 and all(abs(a - b) <= TOLERANCE for a, b in zip(losses, want, strict=True)), (losses, want)
    (stage0,) = report["allreduce"]
    assert stage0["stage"] == 0 and stage0["buckets"] > 1 and len(stage0["spans_ms"]) == 3


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["--allreduce-bucket-mb", "0"],
            "--allreduce-bucket-mb must be a number of MiB > 0 (PyTorch DDP's default is 25), got 0.0",
        ),
        (["--allreduce-bucket-mb", "25", "--adaptive"], "--allreduce-bucket-mb buckets the all-reduce, which --adaptive's"),
    ],
)
def test_a_bad_bucket_size_or_an_adaptive_run_is_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path, extra: list[str], message: str
) -> None:  # fmt: skip
    """--allreduce-bucket-mb 0, or beside --adaptive: exit 2, one line naming the flag, before any process starts."""
    from pipeplan.runtime.training import launch

    started: list[int] = []
    monkeypatch.setattr(launch, "launch_local", lambda nprocs, *args, **kwargs: started.append(nprocs) or 0)
    monkeypatch.chdir(tmp_path)
    code, out, err = run(monkeypatch, capsys, "train", *_train_args(_plan_file(tmp_path, 0), *extra))
    assert (code, out, started) == (2, "", []), err
    assert err.count("\n") == 1 and err.startswith("error: TrainConfigError: ") and message in err, err
