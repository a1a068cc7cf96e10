"""Tracing a branching model into layers (models.traced.graph): one layer per computing node, edges from the fx graph."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from pipeplan.core.errors import ProfileError  # noqa: E402
from pipeplan.models.build import build_model  # noqa: E402
from pipeplan.models.specs import resolve_module_spec  # noqa: E402
from pipeplan.models.traced.graph import live_after, run_layers, trace_layers  # noqa: E402

pytestmark = pytest.mark.torch


def test_rescnn_traces_into_one_layer_per_node_with_its_diamonds() -> None:
    """rescnn's layers are its input, every computing node, and each add reads both branches of its block."""
    spec = resolve_module_spec("rescnn", blocks=1, channels=4)
    assert spec.layer_names == ("x", "unflatten", "stem", "relu", "blocks_0_conv1", "relu_1", "blocks_0_conv2",
                                "blocks_0_skip", "add", "relu_2", "mean")  # fmt: skip
    assert spec.layer_inputs == ((), (0,), (1,), (2,), (3,), (4,), (5,), (3,), (6, 7), (8,), (9,))
    owned = [sum(p.numel() for p in layer.parameters()) for layer in spec.layers]
    assert owned == [0, 0, 40, 0, 148, 0, 148, 20, 0, 0, 0]  # parameters belong to the module nodes only
    whole = sum(p.numel() for p in spec.sequential().parameters())
    assert whole == sum(owned)


def test_the_traced_layers_compute_what_the_module_computes() -> None:
    """Running the layers by their inputs gives the traced module's own output."""
    from pipeplan.models.zoo.rescnn import ResCNN

    torch.manual_seed(3)
    net = ResCNN(8, 4, 2)
    layers, _, inputs = trace_layers(net, "net")
    x = torch.randn(5, 64)
    torch.testing.assert_close(run_layers(layers, inputs, x)[-1], net(x), rtol=0, atol=0)


def test_digits_appends_a_head_that_reads_the_last_layer() -> None:
    """With digits the model gets a `head` reading the traced model's output, and every layer's shape is known."""
    pytest.importorskip("sklearn")
    model = build_model("rescnn", {"channels": "4", "blocks": "1"}, "digits")
    assert model.layer_names[-1] == "head" and model.layer_inputs is not None
    assert model.layer_inputs[-1] == (len(model.layers) - 2,)
    assert model.graph is not None and model.graph.shapes[-1] == (10,) and model.graph.shapes[2] == (4, 8, 8)


def test_live_after_holds_every_earlier_output_a_later_layer_reads() -> None:
    """Cutting inside a diamond carries both branches; a skip placed first is forwarded until its add."""
    inputs = ((), (0,), (1,), (1,), (2, 3))  # 0 -> 1 -> {2, 3} -> 4
    assert live_after(inputs, [0, 1, 2, 3, 4], 1) == (1,)
    assert live_after(inputs, [0, 1, 2, 3, 4], 2) == (1, 2)
    assert live_after(inputs, [0, 1, 3, 2, 4], 2) == (1, 3)
    assert live_after(inputs, [0, 1, 3, 2, 4], 3) == (3, 2)  # in position order


class _CallsTwice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(self.lin(x))


class _TwoInputs(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y


@pytest.mark.parametrize(
    ("module", "message"),
    [
        (_CallsTwice(), "calls module 'lin' twice"),
        (_TwoInputs(), "must take exactly one input tensor, its forward takes 2"),
    ],
)
def test_models_that_cannot_be_split_into_layers_are_refused(module: nn.Module, message: str) -> None:
    """A module with parameters called twice, or two inputs: one ProfileError naming it."""
    with pytest.raises(ProfileError, match=message):
        trace_layers(module, "m")


class _TokenAndReLUTwice(nn.Module):
    """A class token and a position table read outside any module call, and one ReLU module called twice."""

    def __init__(self) -> None:
        super().__init__()
        self.token = nn.Parameter(torch.randn(1, 1, 3))
        self.register_buffer("positions", torch.randn(3, 3))
        self.lin = nn.Linear(3, 3)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.cat([self.token.expand(x.shape[0], -1, -1), x], dim=1) + self.positions
        return self.act(self.act(self.lin(h)) * self.token)


def test_a_parameter_read_outside_a_module_call_belongs_to_each_layer_that_reads_it() -> None:
    """The token is the model's own Parameter, held by both layers that read it (one shared object); the buffer by
    its reader; the parameter-free ReLU called twice is two layers; the layers compute the module's output."""
    from pipeplan.models.parameter_sharing import shared_parameters

    net = _TokenAndReLUTwice()
    layers, names, inputs = trace_layers(net, "net")
    assert names == ("x", "getattr_1", "getitem", "expand", "cat", "add", "lin", "act", "mul", "act_1")
    (shared,) = shared_parameters(layers, names)
    assert shared.layers == (3, 8) and all(any(p is net.token for p in layers[i].parameters()) for i in shared.layers)
    assert any(b is net.positions for b in layers[5].buffers())
    x = torch.randn(4, 2, 3)
    torch.testing.assert_close(run_layers(layers, inputs, x)[-1], net(x), rtol=0, atol=0)


def test_rescnn_refuses_an_input_that_is_not_a_square_image() -> None:
    """in_features must be a square number of pixels."""
    with pytest.raises(ProfileError, match="in_features must be a square number of pixels"):
        resolve_module_spec("rescnn", in_features=63)


class _TwoBranches(nn.Module):
    """A user's branching model: no chain of blocks, so it is traced."""

    def __init__(self) -> None:
        super().__init__()
        self.left, self.right, self.out = nn.Linear(4, 3), nn.Linear(4, 3), nn.Linear(6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.cat([torch.relu(self.left(x)), self.right(x)], dim=1))

    def sample_input(self, batch_size: int) -> torch.Tensor:
        return torch.ones(batch_size, 4)


def test_a_module_that_is_no_chain_of_blocks_is_traced_into_a_graph() -> None:
    """spec_from_module traces a branching module: its layers run by their inputs give the module's output."""
    from pipeplan.models.specs import spec_from_module

    net = _TwoBranches()
    spec = spec_from_module(net, "two")
    assert spec.layer_names == ("x", "left", "relu", "right", "cat", "out")
    assert spec.layer_inputs == ((), (0,), (1,), (0,), (2, 3), (4,))
    x = torch.randn(5, 4)
    torch.testing.assert_close(spec.sequential()(x), net(x), rtol=0, atol=0)


def test_a_module_that_neither_chains_nor_traces_says_both() -> None:
    """A module with no blocks whose forward does not trace names both reasons."""
    from pipeplan.models.specs import spec_from_module

    with pytest.raises(ProfileError, match=r"is not a chain of blocks.*nor does it trace as a graph: .*its forward takes 2"):
        spec_from_module(_TwoInputs(), "pair")
