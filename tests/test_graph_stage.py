"""Stages of a branching model (models.traced.graph_stage): any down-set partition run stage by stage is the whole model."""

from __future__ import annotations

import functools

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from pipeplan.core.errors import ProfileError  # noqa: E402
from pipeplan.models.build import Model, build_model  # noqa: E402
from pipeplan.models.traced.graph_stage import GraphStage, pack, unpack  # noqa: E402

pytestmark = pytest.mark.torch


@functools.cache
def small_model() -> Model:
    """rescnn with 4 channels and 2 residual blocks on digits: 18 layers, two diamonds."""
    return build_model("rescnn", {"channels": "4"}, "digits")


def reference(model: Model, rows: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The loss and the parameter gradients of the whole model on the first `rows` training samples."""
    net = model.reference()
    net.zero_grad(set_to_none=True)
    loss = model.loss_fn(net(model.dataset.inputs[:rows]), model.dataset.targets[:rows])
    loss.backward()
    grads = [p.grad.clone() for p in net.parameters()]
    net.zero_grad(set_to_none=True)
    return loss.detach(), grads


def topological_order(inputs: tuple[tuple[int, ...], ...], priority: list[int]) -> list[int]:
    """A topological order of the graph: among the layers whose inputs are placed, the one of highest priority first."""
    placed: list[int] = []
    done: set[int] = set()
    while len(placed) < len(inputs):
        ready = [i for i in range(len(inputs)) if i not in done and all(s in done for s in inputs[i])]
        best = max(ready, key=lambda i: (priority[i], -i))
        placed.append(best)
        done.add(best)
    return placed


def run_stages(model: Model, order: list[int], bounds: list[tuple[int, int]], rows: int, split: bool) -> torch.Tensor:
    """Forward every stage in turn, then backward in reverse (I then W with split); return the loss."""
    last = len(bounds) - 1
    stages = [GraphStage(s, model.layers, model.graph, order, a, b, s == last, split) for s, (a, b) in enumerate(bounds)]
    x, target = model.dataset.inputs[:rows], model.dataset.targets[:rows]
    try:
        for stage in stages[:-1]:
            x = stage.forward(0, x, None, None, 1.0)
            assert x.dim() == 2 and x.shape[0] == rows
        loss = stages[-1].forward(0, x, target, model.loss_fn, 1.0)
        grad = None
        for stage in reversed(stages):
            grad = stage.backward_input(0, grad) if split else stage.backward(0, grad)
        if split:
            for stage in stages:
                stage.backward_weight(0)
        assert grad is None  # the first stage receives the data: no gradient to send
    finally:
        for stage in stages:
            stage.close()
    return loss.detach()


@settings(max_examples=12)
@given(
    priority=st.lists(st.integers(0, 100), min_size=18, max_size=18),
    cuts=st.sets(st.integers(0, 16), max_size=4),
    split=st.booleans(),
)
def test_stages_of_any_down_set_partition_equal_the_whole_model(priority: list[int], cuts: set[int], split: bool) -> None:
    """Stages cut anywhere in any topological order give the whole model's loss and gradients (to 1e-6)."""
    model = small_model()
    assert model.graph is not None and len(model.layers) == 18
    order = topological_order(model.graph.inputs, priority)
    ends = [*sorted(cuts), len(order) - 1]
    bounds = [(0 if k == 0 else ends[k - 1] + 1, end) for k, end in enumerate(ends)]
    expected_loss, expected = reference(model, 12)
    loss = run_stages(model, order, bounds, 12, split)
    torch.testing.assert_close(loss, expected_loss, rtol=1e-6, atol=1e-6)
    params = list(model.reference().parameters())
    for p, g in zip(params, expected, strict=True):
        torch.testing.assert_close(p.grad, g, rtol=1e-6, atol=1e-6)
        p.grad = None


def test_a_tensor_made_before_a_stage_and_read_after_it_is_forwarded_through_it() -> None:
    """The skip branch computed in stage 0 and added in stage 2 is in stage 1's received and sent live sets."""
    model = small_model()
    order = [0, 1, 2, 3, 7, 4, 5, 6, *range(8, 18)]  # blocks_0_skip (7) before the main branch
    middle = GraphStage(1, model.layers, model.graph, order, 5, 6, False, False)
    names = model.layer_names
    assert [names[i] for i in middle.received] == ["relu", "blocks_0_skip"]
    assert [names[i] for i in middle.sent] == ["blocks_0_skip", "relu_1"]


def test_pack_then_unpack_gives_back_every_tensor() -> None:
    """Tensors of different shapes packed into one (batch, features) tensor come back equal."""
    a, b = torch.randn(3, 2, 4), torch.randn(3, 5)
    packed = pack([a, b])
    assert packed.shape == (3, 13)
    back = unpack(packed, [(2, 4), (5,)])
    assert torch.equal(back[0], a) and torch.equal(back[1], b)


def test_a_stage_refuses_a_received_tensor_of_the_wrong_width() -> None:
    """A received tensor that is not the live set's width is refused, naming both shapes."""
    with pytest.raises(ProfileError, match=r"received shape \(3, 7\), expected \(batch, 13\)"):
        unpack(torch.zeros(3, 7), [(2, 4), (5,)])


def test_a_stage_order_must_hold_every_layer_once() -> None:
    """An order that leaves a layer out is refused before any stage runs."""
    model = small_model()
    with pytest.raises(ProfileError, match="must list each of the model's 18 layers once"):
        GraphStage(0, model.layers, model.graph, list(range(17)), 0, 5, False, False)
