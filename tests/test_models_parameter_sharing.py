"""models.parameter_sharing: the one finder of tensors that several layers hold, against a brute-force count by identity."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from pipeplan.models.parameter_sharing import SharedParameter, holdings, shared_parameters  # noqa: E402

pytestmark = pytest.mark.torch


class _Twice(nn.Module):
    """A layer that holds one Linear under two names (a parameter used twice inside one layer)."""

    def __init__(self, inner: nn.Linear) -> None:
        super().__init__()
        self.a, self.b = inner, inner


def _layers() -> list[nn.Module]:
    """embedding, a BatchNorm, a layer holding a Linear twice, a head tied to the embedding and sharing the BatchNorm's
    running mean as a buffer."""
    torch.manual_seed(0)
    embed, norm, inner = nn.Embedding(5, 3), nn.BatchNorm1d(3), nn.Linear(3, 3)
    head = nn.Linear(3, 5, bias=False)
    head.weight = embed.weight
    head.register_buffer("mean", norm.running_mean)
    return [embed, norm, _Twice(inner), head]


def test_holdings_finds_every_tensor_once_with_its_first_holder_and_path() -> None:
    """Each parameter (and with buffers, buffer) object once, its path in its first layer, its holders ascending;
    the brute force: every layer's tensors compared by identity."""
    layers = _layers()
    for buffers in (False, True):
        found = holdings(layers, buffers=buffers)
        brute: dict[int, list[int]] = {}
        for index, layer in enumerate(layers):
            tensors = list(layer.parameters()) + (list(layer.buffers()) if buffers else [])
            for tensor in tensors:
                where = brute.setdefault(id(tensor), [])
                if index not in where:
                    where.append(index)
        assert {key: h.layers for key, h in found.items()} == brute
        assert all(found[id(h.tensor)] is h for h in found.values())
    found = holdings(layers, buffers=True)
    assert found[id(layers[0].weight)].path == "weight" and found[id(layers[0].weight)].layers == [0, 3]
    assert found[id(layers[1].running_mean)].path == "running_mean" and found[id(layers[1].running_mean)].layers == [1, 3]
    assert found[id(layers[2].a.weight)].layers == [2]
    assert id(layers[1].running_mean) not in holdings(layers)


def test_shared_parameters_keeps_parameters_of_two_or_more_layers_named_after_the_first() -> None:
    """The tied weight only: not the buffer shared by two layers, not a Linear held twice by one layer."""
    assert shared_parameters(_layers(), ["embed", "norm", "twice", "head"]) == (
        SharedParameter("embed.weight", (0, 3), 15, 15 * 4),
    )
