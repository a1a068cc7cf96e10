"""models.stage: a stage's input enters its graph through grad_entry, so its first layer may change it in place."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from pipeplan.models.stage import StageModule, grad_entry  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.mark.parametrize("split", [False, True], ids=["B", "I+W"])
def test_a_stage_starting_with_an_in_place_activation_gives_the_plain_gradients(split: bool) -> None:
    """Stage 1 of two starts with ReLU(inplace=True): its input gradient and weight gradients equal autograd's on
    the unsplit, out-of-place model (the same arithmetic: exact)."""
    torch.manual_seed(0)
    first, relu, last = nn.Linear(3, 4), nn.ReLU(inplace=True), nn.Linear(4, 2)
    x, grad_out = torch.randn(5, 3), torch.randn(5, 2)
    stage = StageModule(1, [relu, last], is_first=False, is_last=False, split_backward=split)
    h = first(x).detach()
    out = stage.forward(0, h, None, None, 1.0)
    if split:
        grad_in = stage.backward_input(0, grad_out)
        stage.backward_weight(0)
    else:
        grad_in = stage.backward(0, grad_out)
    mine = [p.grad.clone() for p in last.parameters()]
    for p in last.parameters():
        p.grad = None
    h_ref = first(x).detach().requires_grad_(True)
    ref = last(torch.relu(h_ref))
    ref.backward(grad_out)
    assert torch.equal(out, ref.detach()) and torch.equal(grad_in, h_ref.grad)
    assert all(torch.equal(a, p.grad) for a, p in zip(mine, last.parameters(), strict=True))


def test_grad_entry_shares_the_storage_and_passes_the_gradient_to_the_leaf() -> None:
    x = torch.randn(4)
    leaf, entry = grad_entry(x)
    assert leaf.is_leaf and not entry.is_leaf and entry.data_ptr() == x.data_ptr()
    (entry * 3).sum().backward()
    assert torch.equal(leaf.grad, torch.full((4,), 3.0))
    ids = torch.arange(4)
    assert grad_entry(ids) == (ids, ids)
