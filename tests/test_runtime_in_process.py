"""Tests of runtime.execution.in_process: a plan's stages of the user's layers, and its schedule walked in one process."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.torch  # every test here runs torch (make test-fast leaves them out)

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from pipeplan.core.errors import PlanError  # noqa: E402
from pipeplan.core.plan import Plan, Stage  # noqa: E402
from pipeplan.runtime.execution.in_process import InProcessPipeline, split_layers  # noqa: E402
from pipeplan.schedules.plan_schedule import plan_schedule  # noqa: E402


def layers(n: int = 4, width: int = 6) -> list[nn.Module]:
    """n Linear+Tanh blocks with fixed weights."""
    torch.manual_seed(3)
    return [nn.Sequential(nn.Linear(width, width), nn.Tanh()) for _ in range(n)]


PLANS = {
    "1f1b": Plan((Stage(0, 1, (0,)), Stage(2, 3, (1,))), 1, 4, 2, "1f1b"),
    "gpipe": Plan((Stage(0, 0, (0,)), Stage(1, 3, (1,))), 1, 4, 2, "gpipe"),
    "zb-h1": Plan((Stage(0, 1, (0,)), Stage(2, 3, (1,))), 1, 4, 2, "zb-h1"),
    "kfkb k=2": Plan((Stage(0, 1, (0,)), Stage(2, 3, (1,))), 1, 4, 2, "kfkb", k=2),
    "interleaved v=2": Plan(tuple(Stage(i, i, (i % 2,)) for i in range(4)), 1, 4, 2, "interleaved-1f1b", chunks=2),
    "2 pipelines, stage replicas": Plan((Stage(0, 1, (0, 1, 2, 3)), Stage(2, 3, (4, 5))), 2, 2, 2, "1f1b"),
}


@pytest.mark.parametrize("name", list(PLANS))
def test_one_step_gives_the_unpipelined_loss_and_gradients(name: str) -> None:
    """Each schedule's walk returns the full batch's mean loss and accumulates its gradients (float64, to 1e-12)."""
    plan = PLANS[name]
    chain = [layer.double() for layer in layers()]
    x = torch.randn(plan.global_batch, 6, dtype=torch.float64)
    y = torch.randn(plan.global_batch, 6, dtype=torch.float64)
    reference = nn.functional.mse_loss(nn.Sequential(*chain)(x), y)
    reference.backward()
    expected = [p.grad.clone() for layer in chain for p in layer.parameters()]
    for layer in chain:
        layer.zero_grad(set_to_none=True)
    loss = InProcessPipeline(chain, plan, nn.functional.mse_loss).step(x, y)
    assert loss == pytest.approx(reference.item(), abs=1e-12)
    got = [p.grad for layer in chain for p in layer.parameters()]
    assert all(torch.allclose(a, b, atol=1e-12) for a, b in zip(got, expected, strict=True))


def test_each_rank_runs_its_actions_in_its_own_order() -> None:
    """on_action sees every action once, and each rank's actions in the schedule's order for that rank."""
    plan = PLANS["zb-h1"]
    seen: list[tuple[int, object]] = []
    pipe = InProcessPipeline(layers(), plan, nn.functional.mse_loss)
    pipe.step(torch.randn(8, 6), torch.randn(8, 6), on_action=lambda replica, action: seen.append((replica, action)))
    schedule = plan_schedule(plan)
    for rank, actions in enumerate(schedule.ranks):
        mine = [a for _, a in seen if schedule.stage_to_rank[a.stage] == rank]
        assert mine == list(actions)


def test_stages_share_the_users_layers() -> None:
    """split_layers cuts the chain at the plan's stages without copying a layer."""
    chain = layers()
    stages = split_layers(nn.Sequential(*chain), PLANS["gpipe"])
    assert [len(s) for s in stages] == [1, 3]
    assert stages[1][0] is chain[1]


def test_a_model_of_another_length_is_refused() -> None:
    """A chain whose layer count is not the plan's is a PlanError naming both counts."""
    with pytest.raises(PlanError, match="model has 3 layers but the plan's stages cover 4"):
        split_layers(layers(3), PLANS["1f1b"])


def test_a_batch_that_is_not_the_global_batch_is_refused() -> None:
    """step names the sample counts when the batch is not the plan's global batch."""
    pipe = InProcessPipeline(layers(), PLANS["1f1b"], nn.functional.mse_loss)
    with pytest.raises(PlanError, match="inputs hold 5 samples but the plan's global batch is 8"):
        pipe.step(torch.randn(5, 6), torch.randn(5, 6))
