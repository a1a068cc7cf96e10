"""models.traced.split_graph: a captured Hugging Face Llama decoder layer found as a block, split Megatron-style
(its tp 1 copy computes the layer exactly), and checked on a sample before any process: a tp that does not divide
its heads or key/value heads, or a graph whose fixed head counts the split does not follow, is refused in one line."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from torch import nn  # noqa: E402

import hf_tiny  # noqa: E402
from pipeplan.core.errors import PlanError  # noqa: E402
from pipeplan.models.traced import split_graph  # noqa: E402
from pipeplan.models.traced.capture_spec import capture  # noqa: E402
from pipeplan.models.traced.split_graph import check_split_graph, graph_block, split_layer  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]

SEQ, WIDTH = 8, 32


def _captured_llama(heads: int = 4, kv_heads: int = 2) -> list[nn.Module]:
    """A float64 LlamaForCausalLM (2 layers, WIDTH wide) captured with torch.export: its 5 layers."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=50, hidden_size=WIDTH, num_hidden_layers=2, num_attention_heads=heads,
                                      num_key_value_heads=kv_heads, intermediate_size=64, max_position_embeddings=SEQ,
                                      tie_word_embeddings=False, bos_token_id=0, eos_token_id=0, pad_token_id=0)  # fmt: skip
    model = transformers.LlamaForCausalLM(config).double()
    layers, names, _, _ = capture(model, "llama", lambda b: torch.randint(0, 50, (b, SEQ)), "not a chain")
    assert names == ("model.embed_tokens", "model.layers.0", "model.layers.1", "model.norm", "lm_head")
    return list(layers)


@pytest.fixture(scope="module")
def llama() -> list[nn.Module]:
    return _captured_llama()


def _sample() -> torch.Tensor:
    return torch.randn(3, SEQ, WIDTH, dtype=torch.float64, generator=torch.Generator().manual_seed(1))


def test_the_decoder_layers_are_blocks_with_their_heads_and_no_other_layer_is(llama: list[nn.Module]) -> None:
    """Layers 1 and 2 are blocks of 4 heads, 2 key/value heads of 8, 64 hidden units; the embedding, norm and head
    are none, nor is a captured GPT-2 block (its attention is one fused Conv1D)."""
    blocks = [graph_block(layer) for layer in llama]
    assert [b is not None for b in blocks] == [False, True, True, False, False]
    block = blocks[1]
    assert block is not None
    assert (block.heads, block.kv_heads, block.head_dim, block.hidden) == (4, 2, 8, 64)
    assert block.weights["q_proj"] == "self_attn.q_proj.weight" and block.dim("o_proj") == 1 and block.dim("up_proj") == 0
    gpt2 = hf_tiny.build("gpt2")
    layers, _, _, _ = capture(gpt2, "gpt2", lambda b: torch.randint(0, 100, (b, 8)), "not a chain")
    assert all(graph_block(layer) is None for layer in layers)


def test_a_tp_1_split_computes_the_layer_and_shares_its_other_weights(llama: list[nn.Module]) -> None:
    """split_layer at tp 1 (collectives the identity) gives the captured layer's output and input gradient to 1e-12;
    its projections are the shard function's tensors, its norms the layer's own objects."""
    layer = llama[1]
    block = graph_block(layer)
    assert block is not None
    split = split_layer(layer, block, 1, lambda t, _: nn.Parameter(t.detach().clone()))
    x = _sample().requires_grad_(True)
    y = _sample().requires_grad_(True)
    want = layer(x)
    got = split(y)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    (want.sum()).backward()
    (got.sum()).backward()
    torch.testing.assert_close(y.grad, x.grad, rtol=0, atol=1e-12)
    assert split.get_parameter("self_attn.q_proj.weight") is not layer.get_parameter("self_attn.q_proj.weight")
    assert split.get_parameter("input_layernorm.weight") is layer.get_parameter("input_layernorm.weight")


def test_a_tp_2_split_passes_its_check_and_a_tp_must_divide_every_head_count(llama: list[nn.Module]) -> None:
    """tp 2 divides 4 heads, 2 key/value heads and 64 hidden units: checked; tp 4 does not divide the 2 key/value
    heads, tp 3 not the 4 heads: one PlanError naming the count and the way out."""
    check_split_graph(llama[1], "model.layers.0", 2, "stage 0", _sample())
    with pytest.raises(PlanError, match=r"stage 0 has tp 4, which does not divide layer model.layers.0's 2 key/value "
                       r"heads: give the stage a tp that divides 4 heads, 2 key/value heads and 64 hidden units"):  # fmt: skip
        check_split_graph(llama[1], "model.layers.0", 4, "stage 0", _sample())
    with pytest.raises(PlanError, match=r"does not divide layer model\.layers\.0's 4 attention heads"):
        check_split_graph(llama[1], "model.layers.0", 3, "stage 0", _sample())


def test_a_graph_whose_fixed_head_counts_are_left_is_refused_not_run_wrong(
    llama: list[nn.Module], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the rewrite of the head counts the export fixed (repeat_kv's expand), the split does not run on the
    sample: refused in one line naming the layer and the way out."""
    monkeypatch.setattr(split_graph, "_local_sizes", lambda sizes, block, tp: sizes)
    with pytest.raises(PlanError, match=r"stage 0 has tp 2 but layer model.layers.0's captured graph does not run split .*"
                       r"train it with tp 1"):  # fmt: skip
        check_split_graph(llama[1], "model.layers.0", 2, "stage 0", _sample())


def test_a_split_whose_parts_do_not_sum_to_the_block_is_refused(llama: list[nn.Module], monkeypatch: pytest.MonkeyPatch) -> None:
    """A split that runs but computes another block (here: every TP rank given the first rank's shard) fails the
    sum check: refused in one line."""
    real = split_layer

    def first_shard(layer: nn.Module, block: object, tp: int, shard: object) -> nn.Module:
        return real(layer, block, tp, lambda t, d: nn.Parameter(t.detach().chunk(tp, d)[0].clone()))  # type: ignore[arg-type]

    monkeypatch.setattr(split_graph, "split_layer", first_shard)
    with pytest.raises(PlanError, match="captured graph fixes its heads where the split cannot follow"):
        check_split_graph(llama[1], "model.layers.0", 2, "stage 0", _sample())


def test_the_sequence_hooks_compute_the_layer_and_sum_only_the_norm_weights(llama: list[nn.Module]) -> None:
    """split_layer with its sequence hooks at tp 1 (every hook the identity) gives the layer's output to 1e-12; its
    `sp_summed` reads exactly the two RMSNorm weights (the only parameters not sharded); and the stock layer passes
    check_sequence_graph at tp 2 and 4 (each TP rank's share of the 8 positions computes its share of the block)."""
    layer = llama[1]
    block = graph_block(layer)
    assert block is not None
    split = split_layer(layer, block, 1, lambda t, _: nn.Parameter(t.detach().clone()), sequence=True)
    torch.testing.assert_close(split(_sample()), layer(_sample()), rtol=0, atol=1e-12)
    summed = [node.args[0].target for node in split.graph.nodes if node.op == "call_module" and node.target == "sp_summed"]
    assert sorted(summed) == ["input_layernorm.weight", "post_attention_layernorm.weight"]
    hooks = [node.target for node in split.graph.nodes if node.op == "call_module" and node.target != "sp_summed"]
    assert hooks == ["sp_scatter", "tp_enter", "tp_leave", "tp_enter", "tp_leave", "sp_gather"]
    for tp in (2, 4):
        split_graph.check_sequence_graph(layer, "model.layers.0", tp, "stage 0", _sample())
