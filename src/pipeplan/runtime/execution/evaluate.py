"""Held-out evaluation of a pipeline-parallel model: process 0 gathers every stage's weights and runs the test split.

The weights travel as tensors (point-to-point, into buffers shaped by process 0's own copies of the layers), the
stages each process sends as JSON (exchange.py): nothing a peer sends is unpickled.

The model is small enough here that copying its weights once per epoch costs
little next to training, and evaluating on one process keeps it independent
of the schedule (a synchronous or an asynchronous run evaluates alike).
Accuracy is the share of correct argmax predictions over the last dimension
(classes for digits, the next character at every position for pysource), for integer targets of the output's
shape less its last dimension (negative targets left out); other targets (a regression's) have none (NaN);
loss is the model's loss function, a mean over the test samples.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from pipeplan.core.plan import Plan
from pipeplan.models.build import Model
from pipeplan.runtime.transport.exchange import all_gather_json

EVAL_BATCH = 256
"""Test samples per forward pass."""
WEIGHTS_TAG = 1 << 22
"""The tag of the weights sent to process 0, apart from the pipeline's (comm.py: below 1 << 22)."""


@dataclass(frozen=True, slots=True)
class EvalResult:
    """Test-split accuracy (a fraction in [0, 1]) and mean loss after `step` training steps."""

    step: int
    epoch: float
    test_accuracy: float
    test_loss: float
    elapsed_s: float

    def to_json(self) -> dict[str, float]:
        return {"step": self.step, "epoch": self.epoch, "test_accuracy": self.test_accuracy, "test_loss": self.test_loss,
                "elapsed_s": self.elapsed_s}  # fmt: skip


def evaluate(model: Model, plan: Plan, own: Mapping[int, nn.Module], device: torch.device) -> tuple[float, float] | None:
    """A collective call: every process sends its stages' weights (`own`: stage -> module; none for a data-parallel
    copy) to process 0, which evaluates the whole model on the test split and returns (accuracy, loss); None on the
    others.

    Process 0's own stages are `model.layers` themselves (a stage wraps the model's layer objects); the layers of
    other stages are its unused copies, which the gathered weights overwrite.
    """
    owners = all_gather_json(sorted(own))  # the stages each process sends, as JSON; the weights as tensors
    order = plan.layer_order if plan.layer_order is not None else range(len(model.layers))
    if dist.get_rank() != 0:
        for s in sorted(own):
            state = own[s].state_dict()
            for key in sorted(state):
                dist.send(state[key].detach().to(device).contiguous(), 0, tag=WEIGHTS_TAG)
        return None
    for sender, stages in enumerate(owners[1:], start=1):
        for s in stages:
            stage = plan.stages[int(s)]
            copy = nn.Sequential(*(model.layers[i] for i in order[stage.first_layer : stage.last_layer + 1]))
            state = {key: torch.empty_like(value, device=device) for key, value in copy.state_dict().items()}
            for key in sorted(state):
                dist.recv(state[key], sender, tag=WEIGHTS_TAG)
            copy.load_state_dict(state)
    return held_out_scores(model, device)


def evaluation(
    model: Model, plan: Plan, own: Mapping[int, nn.Module], device: torch.device, done: int, per_epoch: int, began: float
) -> EvalResult | None:
    """`evaluate` after `done` training steps (a collective call), as the EvalResult process 0 reports (epochs of
    `per_epoch` steps, seconds since `began`); None on the others."""
    scores = evaluate(model, plan, own, device)
    if scores is None:
        return None
    accuracy, loss = scores
    return EvalResult(done, done / per_epoch, accuracy, loss, time.perf_counter() - began)


def held_out_scores(model: Model, device: torch.device) -> tuple[float, float]:
    """(accuracy, mean loss) of the model's layers composed on its test split, in evaluation mode (restored after)."""
    data = model.dataset
    assert data.test_inputs is not None and data.test_targets is not None
    chain = model.reference().to(device)
    training = chain.training
    chain.eval()
    correct = total = 0
    loss_sum = 0.0
    try:
        with torch.no_grad():
            for lo in range(0, len(data.test_inputs), EVAL_BATCH):
                x = data.test_inputs[lo : lo + EVAL_BATCH].to(device)
                y = data.test_targets[lo : lo + EVAL_BATCH].to(device)
                out = chain(x)
                loss_sum += float(model.loss_fn(out, y)) * len(x)
                if not y.is_floating_point() and tuple(out.shape[:-1]) == tuple(y.shape):
                    scored = y >= 0  # a negative class (Hugging Face's -100) is a position left out of the loss
                    correct += int(((out.argmax(dim=-1) == y) & scored).sum())
                    total += int(scored.sum())
    finally:
        chain.train(training)
    return (correct / total if total else float("nan")), loss_sum / len(data.test_inputs)
