"""Tests of mixed precision in the runtime: bf16 and fp16 autocast over float32 master weights on 2 ranks, against a
plain one-process torch loop under the same autocast, and fp16's loss scale decided by every rank together."""

from __future__ import annotations

import json

import pytest

from runtime_cli import run_train

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

MODELS = {
    "transformer": {"d_model": 16, "heads": 2, "layers": 3, "seq_len": 8, "dropout": 0.0},
    "mlp": {"hidden": 16, "blocks": 4},
}
"""A tiny transformer without dropout (its masks are no part of this test: attention, LayerNorm and softmax under
autocast; its residual adds hand float32 to the next stage), and an mlp whose stages hand over bfloat16 (Linear, ReLU)."""
STEPS, BATCH, MICRO, LR, SEED = 3, 16, 4, 0.01, 5


def train_args(precision: str, module: str = "transformer") -> list[str]:
    """`pipeplan train` on 2 local ranks: 1F1B, 4 microbatches of 4, Adam, a tiny model of MODELS."""
    opts = [piece for key, value in MODELS[module].items() for piece in ("--opt", f"{key}={value}")]
    return ["--local", "2", "--schedule", "1f1b", "-p", "2", "-m", str(BATCH // MICRO), "-b", str(BATCH), "--module",
            module, *opts, "--dataset", "sample", "--steps", str(STEPS), "--lr", str(LR), "--seed", str(SEED),
            "--precision", precision, "--no-predict", "--json"]  # fmt: skip


def build(module: str) -> object:
    """The model `pipeplan train` builds for `module` of MODELS (the same seed, the same layers)."""
    from pipeplan.models.build import build_model

    return build_model(module, {k: str(v) for k, v in MODELS[module].items()}, "sample", seed=SEED)


def one_process_losses(precision: str, skip: tuple[int, ...] = (), module: str = "transformer") -> list[float]:
    """The whole model in one process, as torch's mixed-precision recipe trains it: each microbatch's forward and loss
    under torch.autocast, its backward outside; fp16 scales the loss by 2^16 and unscales the gradients before Adam
    (the steps in `skip` are not taken, as after an overflow, and halve the scale); full: float32, no autocast."""
    from pipeplan.models.zoo.datasets import batch_indices

    model = build(module)
    net = model.reference()
    optimizer = torch.optim.Adam(net.parameters(), lr=LR)
    compute = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)  # full: no autocast
    scale = 2.0**16 if precision == "fp16" else 1.0
    losses = []
    for step in range(STEPS):
        idx = batch_indices(len(model.dataset), BATCH, step, SEED)
        x, y = model.dataset.inputs[idx], model.dataset.targets[idx]
        optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), dtype=torch.float64)
        for lo in range(0, BATCH, MICRO):
            with torch.autocast("cpu", dtype=compute or torch.bfloat16, enabled=compute is not None):
                loss = model.loss_fn(net(x[lo : lo + MICRO]), y[lo : lo + MICRO]) * (MICRO / BATCH)
            (loss * scale).backward()
            total += loss.detach().double()
        if step in skip:
            scale /= 2
        else:
            for p in net.parameters():
                p.grad.mul_(1.0 / scale)
            optimizer.step()
        losses.append(float(total))
    return losses


@pytest.mark.slow
@pytest.mark.parametrize(("module", "crossing"), [("transformer", "float32"), ("mlp", "bfloat16")])
def test_bf16_on_two_ranks_gives_the_losses_of_one_process_under_the_same_autocast(module: str, crossing: str) -> None:
    """Activations and gradients cross the stages in the dtype the layers produce (bfloat16 out of the mlp's first
    stage, over gloo); the per-step losses equal the one-process loop's exactly, and differ from float32's (autocast
    is in effect)."""
    model = build(module)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        handed = torch.nn.Sequential(*model.layers[: len(model.layers) // 2])(model.batch(MICRO))
    assert handed.dtype == getattr(torch, crossing)
    done = run_train(train_args("bf16", module), timeout=600)
    assert done.returncode == 0, done.stderr
    losses = json.loads(done.stdout)["losses"]
    assert losses == one_process_losses("bf16", module=module)
    assert losses[0] != pytest.approx(one_process_losses("full", module=module)[0], rel=1e-6, abs=0)


@pytest.mark.slow
def test_an_fp16_overflow_on_one_rank_skips_the_step_on_every_rank_and_halves_the_scale() -> None:
    """PIPEPLAN_OVERFLOW=1:1 (rank 1 sees an inf at step 2): both ranks skip that step, the scale halves to 2^15, and
    every loss equals the one-process loop's that skips the same step; without it, nothing is skipped."""
    done = run_train(train_args("fp16"), env={"PIPEPLAN_OVERFLOW": "1:1"}, timeout=600)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert (out["loss_scale"], out["skipped_steps"]) == (2.0**15, [1])
    assert out["losses"] == one_process_losses("fp16", skip=(1,))
    assert out["losses"][2] != one_process_losses("fp16")[2]  # the skip changed the run


def test_the_loss_scaler_unscales_exactly_backs_off_and_grows() -> None:
    """One process: a finite step divides the gradients by S and steps; an overflow skips, halves S and restarts the
    count; growth_interval clean steps in a row double S."""
    from pipeplan.runtime.execution.loss_scale import LossScaler

    weight = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    optimizer = torch.optim.SGD([weight], lr=1.0)
    scaler = LossScaler(init_scale=8.0, growth_interval=2)
    assert torch.equal(scaler.seed(torch.tensor(0.5)), torch.tensor(8.0))
    weight.grad = torch.tensor([8.0, 24.0])
    assert scaler.step(optimizer, [weight]) and torch.equal(weight.detach(), torch.tensor([0.0, -1.0]))
    weight.grad = torch.tensor([float("inf"), 0.0])
    assert not scaler.step(optimizer, [weight]) and torch.equal(weight.detach(), torch.tensor([0.0, -1.0]))
    assert (scaler.scale, scaler.clean_steps, scaler.skipped) == (4.0, 0, [1])
    for _ in range(2):
        weight.grad = torch.zeros(2)
        assert scaler.step(optimizer, [weight])
    assert (scaler.scale, scaler.clean_steps) == (8.0, 0)
    weight.grad = torch.zeros(2)
    assert not scaler.step(optimizer, [weight], injected=True) and scaler.scale == 4.0
