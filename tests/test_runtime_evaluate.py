"""Tests of runtime.evaluate and train's --eval / --epochs: held-out scores, and the options' errors."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")

from torch import nn  # noqa: E402
from torch.nn import functional  # noqa: E402

from pipeplan.models.build import Model, build_model  # noqa: E402
from pipeplan.models.zoo.datasets import Dataset  # noqa: E402
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
         "--eval needs data with a held-out split; --module transformer's own samples (--dataset sample) has none"),
    ],
)  # fmt: skip
def test_bad_eval_and_epoch_options_are_one_line_errors(args: list[str], message: str) -> None:
    done = run_train(["--local", "2", "--schedule", "1f1b", "-p", "2", "-m", "2", *args])
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors and message in errors[0] and "Traceback" not in done.stderr, done.stderr


def _weights_worker(out: str) -> None:
    """Two processes hold different last layers; process 1 owns stage 1 (the last layer) and sends it."""
    import json
    import pickle
    from pathlib import Path

    import torch.distributed as dist

    from pipeplan.core.plan import Plan, Stage
    from pipeplan.runtime.execution.evaluate import evaluate

    def no_pickle(*args: object, **kwargs: object) -> None:
        raise AssertionError("evaluate unpickled what a peer sent")

    pickle.loads = no_pickle  # type: ignore[assignment]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = build_model("mlp", {"hidden": 8, "blocks": 1}, "digits")
    with torch.no_grad():
        for i, value in enumerate(model.layers[1].parameters()):
            value.copy_(torch.linspace(-1.0, 1.0, value.numel()).reshape(value.shape) * (rank + 1) + i)  # differ
    plan = Plan((Stage(0, 0, (0,)), Stage(1, 1, (1,))), 1, 2, 1, "1f1b")
    scores = evaluate(model, plan, {rank: nn.Sequential(model.layers[rank])}, torch.device("cpu"))
    last = {k: v.flatten().tolist() for k, v in model.layers[1].state_dict().items()}
    seen = {"last": last, "scores": scores, "own": list(held_out_scores(model, torch.device("cpu")))}
    Path(out, f"rank{rank}.json").write_text(json.dumps(seen))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    import sys

    _weights_worker(sys.argv[1])


@pytest.mark.slow
def test_process_0_evaluates_with_the_weights_the_other_process_sent(tmp_path: pytest.TempPathFactory) -> None:
    """Process 0's copy of stage 1 ends equal to process 1's (it differed), and the scores are the
    held-out scores of that model."""
    import json
    from pathlib import Path

    from pipeplan.runtime.training.launch import launch_local, run_file

    assert launch_local(2, run_file(__file__), [str(tmp_path)], timeout_s=120) == 0
    first, second = (json.loads(Path(tmp_path, f"rank{r}.json").read_text()) for r in range(2))
    assert first["last"] == second["last"] and second["scores"] is None
    assert first["scores"] == first["own"]
