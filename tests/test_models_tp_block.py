"""models.tp_block in one process: a SplitBlock computes what its encoder layer computes (before sharding, for every
tp), its weights go back to the encoder layer in that layer's layout, and a tp that does not divide is refused."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from pipeplan.core.errors import PlanError  # noqa: E402
from pipeplan.models.tp_block import SplitBlock, check_split, encoder_of, qkv_rows  # noqa: E402
from pipeplan.models.zoo.charlm import CausalBlock  # noqa: E402

pytestmark = pytest.mark.torch


def _layer(norm_first: bool, activation: str = "relu") -> nn.TransformerEncoderLayer:
    """A float64 encoder layer of width 16, 4 heads, MLP hidden 32, no dropout, from a fixed seed."""
    torch.manual_seed(7)
    layer = nn.TransformerEncoderLayer(16, 4, 32, 0.0, activation, batch_first=True, norm_first=norm_first)
    return layer.double()


@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_a_split_block_computes_its_encoder_layer(norm_first: bool, causal: bool, tp: int) -> None:
    """Before sharding, a SplitBlock's forward and its input gradient equal the encoder layer's (a causal one's under
    charlm's mask) to 1e-12, for each tp its row order is built for."""
    layer = _layer(norm_first, "gelu")
    block = SplitBlock(layer, causal, tp)
    x = torch.randn(3, 8, 16, dtype=torch.float64, requires_grad=True)
    if causal:
        mask = nn.Transformer.generate_square_subsequent_mask(8, dtype=torch.float64)
        want = layer(x, src_mask=mask, is_causal=True)
    else:
        want = layer(x)
    got = block(x)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    (want_grad,) = torch.autograd.grad(want.sum(), x)
    (got_grad,) = torch.autograd.grad(got.sum(), x)
    torch.testing.assert_close(got_grad, want_grad, rtol=0, atol=1e-12)


def test_qkv_rows_give_each_tp_rank_its_heads_query_key_and_value() -> None:
    """Width 4 over tp 2: rank 0 takes rows q0 q1 k0 k1 v0 v1 (0, 1, 4, 5, 8, 9), rank 1 the others."""
    assert qkv_rows(4, 2).tolist() == [0, 1, 4, 5, 8, 9, 2, 3, 6, 7, 10, 11]
    assert qkv_rows(4, 1).tolist() == list(range(12))


def test_write_dense_puts_the_weights_back_in_the_encoder_layers_layout() -> None:
    """A SplitBlock read from one encoder layer and written into another (zeroed) makes it equal the first."""
    source, target = _layer(True), _layer(True)
    with torch.no_grad():
        for p in target.parameters():
            p.zero_()
    SplitBlock(source, False, 2).write_dense(target, lambda t: t.detach())
    for (key, want), got in zip(source.state_dict().items(), target.state_dict().values(), strict=True):
        assert torch.equal(got, want), key


def test_only_encoder_layers_split_and_a_tp_must_divide_heads_and_hidden() -> None:
    """charlm's CausalBlock and a bare encoder layer split (the first causal); a Linear does not; a tp that does not
    divide the heads (3 of 4) or the MLP's hidden size (4 of 30) is refused naming the layer, the count and the tp."""
    layer = _layer(True)
    assert encoder_of(layer) == (layer, False)
    causal = CausalBlock(16, 4, 32, 0.0)
    assert encoder_of(causal) == (causal.layer, True)
    assert encoder_of(nn.Linear(4, 4)) is None
    check_split(layer, "block0", 2, "stage 0")
    with pytest.raises(PlanError, match=r"^stage 0 has tp 3, which does not divide layer block0's 4 attention heads"):
        check_split(layer, "block0", 3, "stage 0")
    odd = nn.TransformerEncoderLayer(16, 4, 30, 0.0, batch_first=True)
    with pytest.raises(PlanError, match=r"^stage 1 has tp 4, which does not divide layer b's 30 MLP hidden size"):
        check_split(odd, "b", 4, "stage 1")
