"""Tests of runtime.evaluate and train's --eval / --epochs: held-out scores, and the options' errors."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")

from torch import nn  # noqa: E402
from torch.nn import functional  # noqa: E402

from pipeplan.models.build import Model, build_model  # noqa: E402
from pipeplan.models.datasets import Dataset  # noqa: E402
from pipeplan.runtime.execution.evaluate import held_out_scores  # noqa: E402
from runtime_cli import run_train  # noqa: E402

pytestmark = pytest.mark.torch  # every test here needs torch (make test-fast leaves them out)


class Picks(nn.Module):
    """Logits that favour class `x[:, 0]` (a perfect classifier of targets equal to the first feature)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return functional.one_hot(x[:, 0].long(), 4).float() * 10.0


def test_scores_are_the_share_of_right_argmaxes_and_the_mean_loss() -> None:
    """Three of four test targets match the picked class: accuracy 0.75; the loss is cross-entropy's mean."""
    inputs = torch.tensor([[0.0], [1.0], [2.0], [3.0]])
    targets = torch.tensor([0, 1, 2, 0])
    data = Dataset("toy", inputs, targets, 4, inputs, targets)
    model = Model((Picks(),), ("picks",), functional.cross_entropy, data, None)  # type: ignore[arg-type]
    accuracy, loss = held_out_scores(model, torch.device("cpu"))
    assert accuracy == 0.75
    assert loss == pytest.approx(float(functional.cross_entropy(Picks()(inputs), targets)))


def test_digits_hold_out_every_fifth_sample() -> None:
    """1797 digits: every fifth (359) held out, 1438 to train on."""
    data = build_model("mlp", {"hidden": 8, "blocks": 1}, "digits").dataset
    assert (len(data.inputs), len(data.test_inputs)) == (1438, 359)  # type: ignore[arg-type]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--steps", "3", "--epochs", "1"], "give --steps or --epochs, not both"),
        (["--epochs", "0"], "--epochs must be >= 1, got 0"),
        (["--module", "transformer", "--opt", "layers=2", "--opt", "d_model=16", "--opt", "heads=2", "--eval"],
         "--eval needs a dataset with a held-out split (digits, pysource); sample has none"),
    ],
)  # fmt: skip
def test_bad_eval_and_epoch_options_are_one_line_errors(args: list[str], message: str) -> None:
    done = run_train(["--local", "2", "--schedule", "1f1b", "-p", "2", "-m", "2", *args])
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors and message in errors[0] and "Traceback" not in done.stderr, done.stderr
