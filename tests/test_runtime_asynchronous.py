"""PipeMare in the runtime: the stage updater's rules by hand, the delays a run measures against the simulator's,
the fully synchronous case against 1F1B, and bad switches as one-line errors."""

from __future__ import annotations

import json
import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")

from torch import nn  # noqa: E402

from pipeplan.runtime.execution.optim import RateSchedule  # noqa: E402
from pipeplan.runtime.options import AsyncSettings  # noqa: E402
from pipeplan.runtime.training.asynchronous import StageUpdater  # noqa: E402
from pipeplan.schedules.pipemare import pipemare  # noqa: E402
from pipeplan.sim.delays import stage_delays  # noqa: E402
from runtime_cli import run_train  # noqa: E402

pytestmark = pytest.mark.torch  # every test here needs torch (make test-fast leaves them out)

TINY = ["--opt", "hidden=32", "--opt", "blocks=3"]


def sgd(params: list[torch.Tensor], lr: float) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=lr)


def test_rescheduled_rate_anneals_from_alpha_over_tau_to_alpha_in_k_steps() -> None:
    """α / τ^(1 - min(k/K, 1)): α/τ at k = 0, α/sqrt(τ) half way, α from K on; α in the synchronous warm-up."""
    updater = StageUpdater([nn.Parameter(torch.zeros(2))], sgd, 0.8, 4, AsyncSettings(lr_reschedule=4))
    assert updater.rate(asynchronous=False) == 0.8
    rates = []
    for _ in range(6):
        rates.append(updater.rate(asynchronous=True))
        updater.params[0].grad = torch.zeros(2)
        updater.step(asynchronous=True)
    assert rates == pytest.approx([0.2, 0.8 / 4**0.75, 0.4, 0.8 / 4**0.25, 0.8, 0.8])


def test_rescheduling_divides_the_annealed_base_rate_of_the_runs_step() -> None:
    """α_k / τ^(p_k) with α_k the run's cosine rate: the base counts every step (synchronous warm-up too), p_k only
    the asynchronous ones."""
    rates = RateSchedule(0.8, "cosine", 6)
    updater = StageUpdater([nn.Parameter(torch.zeros(2))], sgd, 0.8, 4, AsyncSettings(lr_reschedule=2), rates)
    got = []
    for asynchronous in (False, True, True, True, True):
        got.append(updater.rate(asynchronous))
        updater.params[0].grad = torch.zeros(2)
        updater.step(asynchronous)
    base = [rates.at(k) for k in range(5)]
    assert got == pytest.approx([base[0], base[1] / 4, base[2] / 2, base[3], base[4]])


def test_a_stage_without_delay_keeps_its_rate_and_needs_no_correction() -> None:
    """τ = 0 counts as 1 for the rate; γ and δ are not kept (nothing to correct)."""
    updater = StageUpdater([nn.Parameter(torch.zeros(2))], sgd, 0.5, 0, AsyncSettings(lr_reschedule=3, discrepancy_decay=0.5))
    assert updater.rate(asynchronous=True) == 0.5 and updater.velocity is None


def test_velocity_follows_its_recurrence_and_backward_runs_on_the_extrapolated_weights() -> None:
    """δ ← γ δ + (1 - γ)(w_new - w_old) with γ = D^(1/τ); inside `corrected` the weights are w - τ δ, after it w."""
    p = nn.Parameter(torch.tensor([1.0, -2.0]))
    tau, d = 2, 0.25
    updater = StageUpdater([p], sgd, 0.1, tau, AsyncSettings(discrepancy_decay=d))
    gamma = d ** (1 / tau)
    delta = torch.zeros(2)
    for grad in ([1.0, 0.5], [-2.0, 3.0], [0.5, 0.5]):
        old = p.detach().clone()
        p.grad = torch.tensor(grad)
        updater.step(asynchronous=True)
        delta = gamma * delta + (1 - gamma) * (p.detach() - old)
        assert p.grad is None
    assert updater.velocity is not None and torch.allclose(updater.velocity[0], delta)
    w = p.detach().clone()
    with updater.corrected(asynchronous=True):
        assert torch.allclose(p.detach(), w - tau * delta)
    assert torch.allclose(p.detach(), w)
    with updater.corrected(asynchronous=False):  # the synchronous warm-up is not corrected
        assert torch.equal(p.detach(), w)


def test_prediction_runs_the_forward_on_the_weights_one_step_of_change_ahead() -> None:
    """δ is the last step's change (γ = 0); inside `predicted` the weights are w + τ δ, after it w; the backward is
    not moved (prediction and correction exclude each other), nor is the synchronous warm-up's forward."""
    p = nn.Parameter(torch.tensor([1.0, -2.0]))
    tau = 3
    updater = StageUpdater([p], sgd, 0.1, tau, AsyncSettings(weight_prediction=True))
    for grad in ([1.0, 0.5], [-2.0, 3.0]):
        old = p.detach().clone()
        p.grad = torch.tensor(grad)
        updater.step(asynchronous=True)
    change = p.detach() - old
    assert torch.allclose(change, torch.tensor([0.2, -0.3]))
    w = p.detach().clone()
    with updater.predicted(asynchronous=True):
        assert torch.allclose(p.detach(), w + tau * change)
    assert torch.allclose(p.detach(), w)
    for shifted in (updater.predicted(asynchronous=False), updater.corrected(asynchronous=True)):
        with shifted:
            assert torch.equal(p.detach(), w)
    unmoved = StageUpdater([nn.Parameter(torch.zeros(2))], sgd, 0.1, 0, AsyncSettings(weight_prediction=True))
    assert unmoved.velocity is None  # τ = 0: its forwards already meet their backward's weights


def test_a_graph_built_on_predicted_weights_backpropagates_on_the_weights_of_the_moment() -> None:
    """A forward inside `predicted`, the shift undone, a step: the backward runs (no in-place error), its input
    gradient on the current weights and its weight gradient on the activations the predicted forward saw."""
    layer = nn.Linear(3, 2, bias=False)
    updater = StageUpdater(list(layer.parameters()), sgd, 0.5, 1, AsyncSettings(weight_prediction=True))
    layer.weight.grad = torch.ones_like(layer.weight)
    updater.step(asynchronous=True)  # δ = -0.5 everywhere
    x = torch.randn(4, 3, requires_grad=True)
    with updater.predicted(asynchronous=True):
        hidden = torch.tanh(layer(x))  # tanh saves its output: the predicted weights' activations
    ahead = torch.tanh(x.detach() @ (layer.weight.detach() - 0.5).T)
    assert torch.allclose(hidden.detach(), ahead)
    layer.weight.grad = torch.ones_like(layer.weight)
    updater.step(asynchronous=True)
    hidden.sum().backward()
    assert torch.allclose(x.grad, (1 - ahead**2) @ layer.weight.detach())


def test_a_step_between_forward_and_backward_leaves_the_graph_usable_on_the_new_weights() -> None:
    """The update goes through `.data` aliases: a graph built before it backpropagates (no in-place error) and its
    input gradient uses the current weights, as PipeMare's delayed gradients do; nothing is stashed."""
    layer = nn.Linear(3, 2)
    x = torch.randn(4, 3, requires_grad=True)
    y = layer(x).sum()
    updater = StageUpdater(list(layer.parameters()), sgd, 0.5, 1, AsyncSettings())
    for p in layer.parameters():
        p.grad = torch.ones_like(p)
    updater.step(asynchronous=True)
    y.backward()
    assert torch.allclose(x.grad, torch.ones(4, 2) @ layer.weight.detach())


@pytest.mark.slow
@pytest.mark.parametrize(("p", "m", "warmup"), [(4, 2, 0), (2, 1, 2), (3, 3, 1)])
def test_measured_delays_equal_the_simulators(p: int, m: int, warmup: int) -> None:
    """`train --schedule pipemare` on p local processes: the delay each stage measures (the weight versions its
    forwards and backwards ran on) equals what sim.delays derives from the same schedule."""
    steps = 8
    args = ["--local", str(p), "--schedule", "pipemare", "-p", str(p), "-m", str(m), *TINY, "--steps", str(steps),
            "--batch-size", str(8 * m), "--lr", "0.05", "--optimizer", "sgd_momentum", "--json",
            *(["--sync-warmup", str(warmup)] if warmup else [])]  # fmt: skip
    done = run_train(args)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["schedule"] == "pipemare"
    assert out["delays"] == list(stage_delays(pipemare(p, m, steps, warmup)).delays)
    assert len(out["losses"]) == steps and all(math.isfinite(v) for v in out["losses"])
    assert out["samples_per_s"] > 0


@pytest.mark.slow
def test_pipemare_with_both_techniques_learns_digits_and_evaluates_each_epoch() -> None:
    """Four asynchronous stages with LR rescheduling and discrepancy correction learn digits (the run is
    deterministic: the schedule fixes the order of every update); --eval reports the held-out accuracy and loss
    after each epoch (22 steps of 64 of the 1438 training samples)."""
    args = ["--local", "4", "--schedule", "pipemare", "-p", "4", "-m", "4", "--opt", "hidden=64", "--opt", "blocks=7",
            "--epochs", "3", "--batch-size", "64", "--lr", "1e-2", "--lr-reschedule", "10", "--discrepancy-decay", "0.5",
            "--eval", "--json"]  # fmt: skip
    done = run_train(args)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    losses = out["losses"]
    assert len(losses) == 3 * (1438 // 64)
    assert sum(losses[-10:]) / 10 < sum(losses[:10]) / 10 - 0.4, losses
    assert [e["step"] for e in out["eval"]] == [22, 44, 66] and [e["epoch"] for e in out["eval"]] == [1.0, 2.0, 3.0]
    assert all(0.0 <= e["test_accuracy"] <= 1.0 and math.isfinite(e["test_loss"]) for e in out["eval"])
    assert out["test_accuracy"] == out["eval"][-1]["test_accuracy"] and out["eval"][-1]["test_loss"] < 2.1
    assert out["delays"] == [1, 1, 1, 0]


@pytest.mark.slow
def test_all_synchronous_pipemare_evaluates_exactly_as_1f1b() -> None:
    """Per-epoch walks (the pipeline drains to evaluate) with every step synchronous: 1F1B's evaluations."""
    common = ["--local", "2", "-p", "2", "-m", "2", *TINY, "--epochs", "2", "--batch-size", "256", "--lr", "0.01", "--eval",
              "--json"]  # fmt: skip
    mare = run_train([*common, "--schedule", "pipemare", "--sync-warmup", "10"])
    sync = run_train([*common, "--schedule", "1f1b"])
    assert mare.returncode == 0 and sync.returncode == 0, mare.stderr + sync.stderr
    evals = [json.loads(done.stdout)["eval"] for done in (mare, sync)]
    assert [e["step"] for e in evals[0]] == [5, 10]
    for a, b in zip(*evals, strict=True):
        assert a["test_accuracy"] == b["test_accuracy"] and a["test_loss"] == pytest.approx(b["test_loss"], rel=1e-9)


@pytest.mark.slow
def test_all_synchronous_pipemare_trains_exactly_as_1f1b() -> None:
    """With --sync-warmup equal to --steps every minibatch is flushed before its stages step: the losses are 1F1B's
    (the same order, the same gradients; per-stage optimizers step the same parameters as one)."""
    common = ["--local", "2", "-p", "2", "-m", "2", *TINY, "--steps", "5", "--batch-size", "16", "--lr", "0.01", "--json"]
    mare = run_train([*common, "--schedule", "pipemare", "--sync-warmup", "5"])
    sync = run_train([*common, "--schedule", "1f1b", "--no-predict"])
    assert mare.returncode == 0 and sync.returncode == 0, mare.stderr + sync.stderr
    assert json.loads(mare.stdout)["delays"] == [0, 0]
    assert json.loads(mare.stdout)["losses"] == pytest.approx(json.loads(sync.stdout)["losses"], rel=1e-9, abs=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--lr-reschedule", "0"], "--lr-reschedule must be an integer >= 1"),
        (["--discrepancy-decay", "1"], "--discrepancy-decay must be a number in [0, 1), got 1.0"),
        (["--discrepancy-decay", "-0.5"], "--discrepancy-decay must be a number in [0, 1), got -0.5"),
        (["--sync-warmup", "9"], "--sync-warmup 9 is beyond the run: --steps is 4"),
        (["--checkpoint-dir", "ckpt"], "--checkpoint-dir is not supported with --schedule pipemare"),
        (["--replicas", "2,1"], "--schedule pipemare runs one pipeline without replicas"),
        (["--weight-prediction", "--discrepancy-decay", "0.5"], "--weight-prediction and --discrepancy-decay exclude each other"),
    ],
)
def test_bad_pipemare_settings_are_one_line_errors(args: list[str], message: str) -> None:
    """Exit 2, one line naming the flag, before any process starts."""
    done = run_train(["--local", "2", "--schedule", "pipemare", "-p", "2", "-m", "2", "--steps", "4", *args])
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0], done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_prediction_with_correction_is_refused_before_any_start_with_epochs_too() -> None:
    """The two switches exclude each other whatever the run's length is given by."""
    done = run_train(["--local", "2", "--schedule", "pipemare", "-p", "2", "--epochs", "1", "--weight-prediction",
                      "--discrepancy-decay", "0.5"])  # fmt: skip
    assert done.returncode == 2 and done.stderr.count("error:") == 1, done.stderr
    assert "--weight-prediction and --discrepancy-decay exclude each other" in done.stderr


@pytest.mark.slow
def test_weight_prediction_runs_the_pipeline_on_other_weights_with_the_same_delays() -> None:
    """Three asynchronous stages with --weight-prediction: the delays the run measures are the simulator's, its
    losses finite and, from the first forward after a delayed stage's first step, not naive training's."""
    common = ["--local", "3", "--schedule", "pipemare", "-p", "3", "-m", "1", *TINY, "--steps", "8", "--batch-size", "16",
              "--lr", "0.05", "--json"]  # fmt: skip
    naive, predicted = run_train(common), run_train([*common, "--weight-prediction"])
    assert naive.returncode == 0 and predicted.returncode == 0, naive.stderr + predicted.stderr
    a, b = json.loads(naive.stdout), json.loads(predicted.stdout)
    assert a["delays"] == b["delays"] == list(stage_delays(pipemare(3, 1, 8)).delays) == [2, 1, 0]
    assert all(math.isfinite(v) for v in b["losses"])
    assert a["losses"][:2] == b["losses"][:2] and a["losses"][-1] != b["losses"][-1]


@pytest.mark.slow
def test_pipemare_switches_need_pipemare() -> None:
    """--lr-reschedule or --weight-prediction on a synchronous schedule is refused, naming the flag."""
    done = run_train(["--local", "2", "--schedule", "1f1b", "--steps", "2", "--lr-reschedule", "5"])
    assert done.returncode == 2 and "--lr-reschedule applies only to --schedule pipemare" in done.stderr
    done = run_train(["--local", "2", "--schedule", "1f1b", "--steps", "2", "--weight-prediction"])
    assert done.returncode == 2 and "--weight-prediction applies only to --schedule pipemare" in done.stderr
