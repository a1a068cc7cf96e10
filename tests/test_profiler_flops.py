"""FLOP and bytes-moved counts per layer against closed forms (torch, CPU only)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from pipeplan.models.specs import resolve_module_spec  # noqa: E402
from pipeplan.profiler import measure_layers  # noqa: E402
from pipeplan.profiler.flops import attention_backward_flops, attention_flops, bytes_moved  # noqa: E402

pytestmark = pytest.mark.torch  # every test here needs torch (make test-fast leaves them out)

F32 = 4


def test_linear_flops_are_two_per_multiply_add() -> None:
    """Linear(in→out) on b samples: forward 2·b·in·out; backward 2·b·in·out per gradient (weight, and input after layer 0)."""
    b, n_in, n_out = 8, 48, 80
    m = measure_layers([nn.Linear(n_in, n_out), nn.Linear(n_out, n_out)], torch.randn(b, n_in), b, runs=0)
    first, second = m.layers[0].work, m.layers[1].work
    assert first.fwd_flops == 2 * b * n_in * n_out
    assert first.bwd_flops == 2 * b * n_in * n_out  # layer 0's input is data: weight gradient only
    assert second.fwd_flops == 2 * b * n_out * n_out
    assert second.bwd_flops == 2 * 2 * b * n_out * n_out


def test_elementwise_layers_count_no_flops() -> None:
    """ReLU, LayerNorm and GELU are not matrix products: FlopCounterMode counts 0 for them."""
    m = measure_layers([nn.Linear(4, 4), nn.ReLU(), nn.LayerNorm(4), nn.GELU()], torch.randn(2, 4), 2, runs=0)
    assert [s.work.fwd_flops + s.work.bwd_flops for s in m.layers[1:]] == [0, 0, 0]


def gpt2_block_flops(b: int, s: int, h: int) -> tuple[int, int, int]:
    """Closed form for one GPT-2 block (2 FLOPs per multiply-add; layernorm, softmax, GELU not counted).

    Forward: QKV projection 2·b·s·h·3h + QKᵀ 2·b·s·s·h + attention×V 2·b·s·s·h + output projection 2·b·s·h·h
    + MLP 2·b·s·h·4h·2  =  24·b·s·h² + 4·b·s²·h.
    Backward: every projection twice (input and weight gradients) = 48·b·s·h²; attention 10·b·s²·h with the
    fused kernel (recomputed QKᵀ, dV, dP, dQ, dK) or 8·b·s²·h on the math path (scores kept).
    Returns (forward, fused backward, math-path backward).
    """
    return 24 * b * s * h * h + 4 * b * s * s * h, 48 * b * s * h * h + 10 * b * s * s * h, 48 * b * s * h * h + 8 * b * s * s * h


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_gpt2_block_flops_match_the_closed_form(dropout: float) -> None:
    """A GPT-2-small block (h 768) at b 2, s 32 counts exactly the closed form, attention included."""
    pytest.importorskip("transformers")
    b, s, h = 2, 32, 768
    spec = resolve_module_spec("gpt2-small", layers=1, seq_len=s, dropout=dropout)
    work = measure_layers(spec, None, b, runs=0).layers[1].work
    fwd, bwd_fused, bwd_math = gpt2_block_flops(b, s, h)
    assert work.fwd_flops == fwd
    assert work.bwd_flops == (bwd_fused if dropout == 0 else bwd_math)


def test_gpt2_head_flops_are_the_vocabulary_projection() -> None:
    """The head projects b·s tokens from h to the 50257-word vocabulary: 2·b·s·h·V forward."""
    pytest.importorskip("transformers")
    b, s, h, vocab = 2, 8, 768, 50257
    spec = resolve_module_spec("gpt2-small", layers=1, seq_len=s)
    assert measure_layers(spec, None, b, runs=0).layers[2].work.fwd_flops == 2 * b * s * h * vocab


def test_attention_closed_forms() -> None:
    """Attention forward 2·b·h·Sq·Sk·(d+d_v); backward 2·b·h·Sq·Sk·(3d+2d_v)."""
    assert attention_flops((2, 4, 16, 8), (2, 4, 16, 8), (2, 4, 16, 8)) == 4 * 2 * 4 * 16 * 16 * 8
    assert attention_backward_flops((2, 4, 16, 8), (2, 4, 16, 8), (2, 4, 16, 8)) == 10 * 2 * 4 * 16 * 16 * 8


def test_bytes_moved_of_a_linear_layer() -> None:
    """Linear after layer 0: forward reads W and x and writes y; backward reads W, x, dy and writes dW, dx."""
    b, n_in, n_out = 8, 48, 80
    m = measure_layers([nn.ReLU(), nn.Linear(n_in, n_out)], torch.randn(b, n_in), b, runs=0)
    w = (n_in * n_out + n_out) * F32
    x, y = b * n_in * F32, b * n_out * F32
    work = m.layers[1].work
    assert (work.fwd_bytes, work.bwd_bytes) == (w + x + y, 2 * w + x + y + x)
    assert bytes_moved(w, x, y, x, input_needs_grad=False) == (w + x + y, 2 * w + x + y)
