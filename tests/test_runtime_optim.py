"""runtime.optim: the optimizers by name and the base learning-rate schedule."""

from __future__ import annotations

import itertools
import json
import math

import pytest

torch = pytest.importorskip("torch")

from pipeplan.runtime.execution.optim import RateSchedule, make_optimizer  # noqa: E402
from runtime_cli import run_train  # noqa: E402

pytestmark = pytest.mark.torch  # every test here needs torch (make test-fast leaves them out)


def test_constant_schedule_is_the_rate_at_every_step() -> None:
    rates = RateSchedule(0.3, "constant", 5)
    assert [rates.at(k) for k in range(7)] == [0.3] * 7


def test_cosine_schedule_follows_its_closed_form_and_holds_past_the_end() -> None:
    """α_k = lr (1 + cos(π k / T)) / 2: lr at k = 0, lr / 2 at T / 2, falling every step; after the end, the last rate."""
    rates = RateSchedule(0.8, "cosine", 8)
    got = [rates.at(k) for k in range(8)]
    assert got == pytest.approx([0.8 * (1 + math.cos(math.pi * k / 8)) / 2 for k in range(8)])
    assert got[0] == 0.8 and got[4] == pytest.approx(0.4)
    assert all(a > b > 0 for a, b in itertools.pairwise(got))
    assert rates.at(20) == got[-1] and rates.at(-1) == got[0]


def test_apply_sets_every_parameter_group() -> None:
    a, b = torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))
    optimizer = make_optimizer("sgd", [a], 1.0)
    optimizer.add_param_group({"params": [b]})
    RateSchedule(1.0, "cosine", 2).apply(optimizer, 1)
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([0.5, 0.5])


def test_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="linear"):
        RateSchedule(1.0, "linear", 2).at(0)


@pytest.mark.slow
def test_training_under_cosine_steps_with_the_annealed_rate() -> None:
    """One process, SGD: step 1 uses lr under both schedules (cos 0 = 1), so the first two losses agree; step 2
    uses lr / 2 under cosine (T = 4), so from the third loss on the runs differ."""
    common = ["--local", "1", "--schedule", "1f1b", "-p", "1", "-m", "2", "--steps", "4", "--optimizer", "sgd",
              "--lr", "0.5", "--json", "-q", "--opt", "hidden=32", "--opt", "blocks=2", "--batch-size", "16"]  # fmt: skip
    losses = {}
    for kind in ("constant", "cosine"):
        done = run_train([*common, "--lr-schedule", kind])
        assert done.returncode == 0, done.stderr
        losses[kind] = json.loads(done.stdout)["losses"]
    assert losses["constant"][:2] == losses["cosine"][:2]
    assert losses["constant"][2] != losses["cosine"][2]
