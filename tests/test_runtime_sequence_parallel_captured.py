"""Sequence parallelism on captured Hugging Face Llama blocks (runtime.execution.tp_layers with
runtime.execution.sequence_parallel.sequence_graph, models.traced.split_graph's sequence hooks): a stock
LlamaForCausalLM on 4 gloo processes, TP 2 x PP 2 (1f1b and zb-h1) and 2 data-parallel replicas of TP 2, its
decoder layers run on their TP ranks' shares of the sequence, trains as the model's own plain loop does (float64,
1e-12); and what the check before any process refuses of a sequence-parallel stage (a graph whose norm mixes
positions)."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from torch import nn  # noqa: E402

from tp_runs import LLAMA, MAX_NORM, SEQ, STEPS, WIDTH, launch_script, model_space, plain_loop  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]

TOLERANCE = 1e-12
SCRIPT = """
import json, sys
import torch
import pipeplan
from pipeplan.core.plan import Plan, Stage

out = {}
for case, (schedule, stages) in json.loads(sys.argv[1]).items():
    model = build()
    plan = Plan(tuple(Stage(a, b, tuple(d), tp, sp) for a, b, d, tp, sp in stages), 1, 2, BATCH // 2, schedule)
    pipe = pipeplan.distribute(model, plan, loss_fn)
    optimizer = torch.optim.SGD(pipe.parameters(), lr=LR)
    log = []
    for ids, labels in batches():
        optimizer.zero_grad()
        loss = pipe.step(ids, labels)
        norm = pipe.clip_grad_norm_(MAX_NORM)
        optimizer.step()
        log.append([loss, norm])
    state = pipe.state_dict()
    if pipe.rank == 0:
        torch.save(state, f"{case}.pt")
    out[case] = {"log": log, "ends": [[type(getattr(b, hook)).__name__ for hook in ("sp_scatter", "sp_gather")]
                                      for _, (_, b) in sorted(pipe.tensor_parallel.blocks.items())]}
json.dump(out, open(f"rank-{pipe.rank}.json", "w"))
"""
CASES = {
    "sp-tp2xpp2": ["1f1b", [[0, 1, [0, 1], 2, True], [2, 4, [2, 3], 2, True]]],
    "sp-tp2xpp2_zb-h1": ["zb-h1", [[0, 1, [0, 1], 2, True], [2, 4, [2, 3], 2, True]]],
    "sp-dp2_of_tp2": ["1f1b", [[0, 4, [0, 1, 2, 3], 2, True]]],
}
"""Each case's schedule and stages (first layer, last layer, devices, tp, sequence_parallel) over the Llama's 5
captured layers (embed_tokens, layers.0, layers.1, norm, lm_head): a block on each of 2 TP 2 stages (each shards its
input and gathers its output), and both blocks on one stage of 2 replicas of TP 2 (layers.0 passes its shares on)."""


def test_a_stock_llama_sequence_parallel_over_four_processes_trains_as_the_plain_loop(tmp_path: Path) -> None:
    """TP 2 x PP 2 (1f1b, zb-h1) and 2 replicas of TP 2 with sequence_parallel true: the decoder layers take their
    shares and gather their outputs where a run of blocks starts and ends, and the losses and clipped global norms of
    3 SGD steps equal the plain loop's to 1e-12 on every process, the final state_dict to 1e-12 too."""
    ranks = launch_script(tmp_path, 4, LLAMA + SCRIPT, CASES, timeout_s=900)
    model, want = plain_loop(LLAMA)
    assert any(norm > MAX_NORM for _, norm in want)  # the clipping acts
    both = ["Collective", "Collective"]
    assert [r["sp-tp2xpp2"]["ends"] for r in ranks] == [[both]] * 4
    assert [r["sp-dp2_of_tp2"]["ends"] for r in ranks] == [[["Collective", "Identity"], ["Identity", "Collective"]]] * 4
    for case in CASES:
        for rank in ranks:
            got = rank[case]["log"]
            assert len(got) == STEPS
            for (loss, norm), (want_loss, want_norm) in zip(got, want, strict=True):
                assert abs(loss - want_loss) <= TOLERANCE and abs(norm - want_norm) <= TOLERANCE, (case, got, want)
        saved = torch.load(tmp_path / f"{case}.pt")
        assert list(saved) == list(model.state_dict())
        for key, value in model.state_dict().items():
            assert torch.allclose(saved[key], value, rtol=0, atol=TOLERANCE), (case, key)


class _SequenceNorm(nn.Module):
    """A norm that subtracts the mean over the sequence (dimension 1): it cannot run on a share of it."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(WIDTH, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x - x.mean(1, keepdim=True))


def test_a_captured_block_whose_norm_mixes_positions_is_refused_before_any_process() -> None:
    """A stock Llama on a tp 2 stage with sequence_parallel true passes the check; the same model with layers.1's
    post-attention norm averaging over the sequence is refused in one line naming the stage and the layer (and passes
    with sequence_parallel false: the heads' split is not what fails)."""
    from pipeplan.core.errors import PlanError
    from pipeplan.core.plan import Plan, Stage
    from pipeplan.models.traced.capture_spec import capture
    from pipeplan.models.traced.graph import LayerGraph
    from pipeplan.runtime.execution.tp_layers import check_tensor_parallel

    space = model_space(LLAMA)
    sample = lambda b: torch.randint(0, 96, (b, SEQ))  # noqa: E731
    for mixed in (False, True):
        model = space["build"]()  # type: ignore[operator]
        if mixed:
            model.model.layers[1].post_attention_layernorm = _SequenceNorm()
        layers, names, inputs, _ = capture(model, "llama", sample, "not a chain")
        graph = LayerGraph.measure(list(layers), inputs, names, sample(2))
        for sp in (False, True):
            plan = Plan((Stage(0, 1, (0, 1), 2, sp), Stage(2, 4, (2, 3), 2, sp)), 1, 2, 2, "1f1b")
            if not (mixed and sp):
                check_tensor_parallel(plan, layers, names, graph)
                continue
            with pytest.raises(PlanError, match=r"^stage 1 \(layers 2..4\) has sequence_parallel true but layer "
                               r"model.layers.1's captured graph mixes positions outside its attention \(.*\): give "
                               r"that stage sequence_parallel false$"):  # fmt: skip
                check_tensor_parallel(plan, layers, names, graph)
