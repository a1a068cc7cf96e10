"""Tensor-parallel stages (runtime.execution.tp_layers, models.tp_block) over 4 gloo processes: charlm (the zoo's GPT-like
model: embedding, causal nn.TransformerEncoderLayer blocks, head) trains as a plain torch loop does (float64, 1e-9):
the same losses, the same clipped global gradient norms, the same final state_dict, for TP 2 x PP 2, and for a TP 2
stage feeding a stage of 2 data-parallel replicas (TP ranks to replicas, and the replicas' all-reduce), one stage
of 2 data-parallel replicas each a TP group of 2 (the all-reduce of each shard over its copies), and a TP 2 stage
with no block (its layers run whole on both TP ranks); a stock Hugging Face Llama on TP 2 x PP 2; `train --plan` with
tp 2 stages, and what train refuses of a tensor-parallel plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from cli_runner import run  # noqa: E402
from plain_loops import charlm_losses  # noqa: E402
from runtime_cli import run_train  # noqa: E402
from tp_runs import HEADS, LLAMA, LR, MAX_NORM, STEPS, WIDTH, launch_script, plain_loop  # noqa: E402

pytestmark = pytest.mark.torch

TOLERANCE = 1e-9
CASES = {
    "tp2xpp2": [[0, 1, [0, 1], 2], [2, 3, [2, 3], 2]],
    "tp2xpp2_zb-h1": [[0, 1, [0, 1], 2], [2, 3, [2, 3], 2]],
    "tp2xpp2_interleaved-1f1b": [[0, 0, [0, 1], 2], [1, 1, [2, 3], 2], [2, 2, [0, 1], 2], [3, 3, [2, 3], 2]],
    "tp2_then_dp2": [[0, 1, [0, 1], 2], [2, 3, [2, 3], 1]],
    "dp2_of_tp2": [[0, 3, [0, 1, 2, 3], 2]],
    "tp2_without_block": [[0, 0, [0, 1], 2], [1, 3, [2, 3], 2]],
    "sp-tp2xpp2": [[0, 1, [0, 1], 2, True], [2, 3, [2, 3], 2, True]],
    "sp-tp2xpp2_zb-h1": [[0, 1, [0, 1], 2, True], [2, 3, [2, 3], 2, True]],
    "sp-tp2_then_dp2": [[0, 1, [0, 1], 2, True], [2, 3, [2, 3], 1]],
    "sp-dp2_of_tp2": [[0, 3, [0, 1, 2, 3], 2, True]],
}
"""Each plan's stages: (first layer, last layer, devices, tp[, sequence_parallel]) over charlm's 4 layers (embed,
block0, block1, head); its schedule 1f1b, or the one after "tp2xpp2_" in its name (zb-h1: the backward split into I
and W; interleaved-1f1b: 2 chunks per process, chunk c on processes of rank c mod 2); "sp-": sequence-parallel."""
SP_TOLERANCE = 1e-12
"""Sequence parallelism against the plain loop (float64): measured 1.8e-15 on the losses and norms."""

MODEL = """
import torch
from pipeplan.models.zoo.charlm import charlm, next_char_cross_entropy as loss_fn

def build():
    spec = charlm(d_model=WIDTH, heads=HEADS, layers=2, seq_len=SEQ, dropout=0.0, seed=5)
    return torch.nn.Sequential(*spec.layers).double()

def forward(model, ids):
    return model(ids)

def batches():
    generator = torch.Generator().manual_seed(3)
    for _ in range(STEPS):
        yield torch.randint(0, 96, (BATCH, SEQ), generator=generator), torch.randint(0, 96, (BATCH, SEQ), generator=generator)
"""

SCRIPT = """
import json, sys
import torch
import pipeplan
from pipeplan.core.plan import Plan, Stage

out = {}
for case, stages in json.loads(sys.argv[1]).items():
    model = build()
    schedule = case.split("tp2xpp2_", 1)[1] if "tp2xpp2_" in case else "1f1b"
    chunks = 2 if schedule == "interleaved-1f1b" else 1
    plan = Plan(tuple(Stage(a, b, tuple(d), tp, *sp) for a, b, d, tp, *sp in stages), 1, 2, BATCH // 2, schedule, chunks=chunks)
    pipe = pipeplan.distribute(model, plan, loss_fn)
    optimizer = torch.optim.SGD(pipe.parameters(), lr=LR)
    start = pipe.state_dict()
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
    pipe.load_state_dict(start)  # into the freed blocks' shards: the state read back is the one loaded
    again = pipe.state_dict()
    reload = max(float((again[key] - start[key]).abs().max()) for key in start)
    mine = {id(p): p for p in [*model.parameters(), *pipe.parameters()]}.values()
    held = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in mine if not p.is_meta)
    out[case] = {"log": log, "role": [pipe.role.sched_rank, pipe.role.replica, pipe.role.tp_rank], "held": held, "reload": reload,
                 "split": sorted(pipe.tensor_parallel.blocks),
                 "ends": [[type(getattr(b, end, None)).__name__ for end in ("enter", "leave")]
                          for _, (_, b) in sorted(pipe.tensor_parallel.blocks.items())],
                 "rows": [(b.qkv if hasattr(b, "qkv") else b.self_attn.q_proj).weight.to_local().shape[0]
                          for _, b in pipe.tensor_parallel.blocks.values()]}
json.dump(out, open(f"rank-{pipe.rank}.json", "w"))
"""


def _block_elements(model: nn.Module, tp: int) -> int:
    """The elements of one TP rank's share of charlm's block (closed form): qkv, up and their biases column-split,
    out and down row-split (their biases whole), the two norms whole."""
    width, ffn = WIDTH, model[1].layer.linear1.out_features
    return (3 * width * width + 3 * width + ffn * width + ffn + width * width + width * ffn) // tp + 2 * width + 4 * width


@pytest.mark.slow
def test_tensor_parallel_stages_over_four_processes_train_as_the_plain_loop(tmp_path: Path) -> None:
    """TP 2 x PP 2, TP 2 then 2 data-parallel replicas, 2 replicas of TP 2, and a TP 2 stage of no block, on 4
    processes, and the first three with sequence parallelism (its runs of blocks sharding the sequence at their
    start and gathering it at their end; 1e-12): the losses and clipped norms of 3 SGD steps and the final
    state_dict equal the plain loop's to 1e-9,
    with the blocks split on their stages' processes, whose dense copies are freed (a process holds the model's
    parameters less its split blocks, plus its shards of them); a state loaded into the shards is read back."""
    ranks = launch_script(tmp_path, 4, MODEL + SCRIPT, CASES)
    model, want = plain_loop(MODEL)
    assert any(norm > MAX_NORM for _, norm in want)  # the clipping acts
    assert [r["tp2xpp2"]["role"] for r in ranks] == [[0, 0, 0], [0, 0, 1], [1, 0, 0], [1, 0, 1]]
    assert [r["tp2xpp2"]["split"] for r in ranks] == [[1], [1], [2], [2]]
    assert [r["tp2xpp2_zb-h1"]["split"] for r in ranks] == [[1], [1], [2], [2]]
    assert [r["tp2xpp2_interleaved-1f1b"]["split"] for r in ranks] == [[2], [2], [1], [1]]
    assert [r["tp2_then_dp2"]["role"] for r in ranks] == [[0, 0, 0], [0, 0, 1], [1, 0, 0], [1, 1, 0]]
    assert [r["tp2_then_dp2"]["split"] for r in ranks] == [[1], [1], [], []]
    assert [r["dp2_of_tp2"]["role"] for r in ranks] == [[0, 0, 0], [0, 0, 1], [0, 1, 0], [0, 1, 1]]
    assert [r["dp2_of_tp2"]["split"] for r in ranks] == [[1, 2]] * 4
    assert [r["tp2_without_block"]["split"] for r in ranks] == [[], [], [1, 2], [1, 2]]  # the embedding runs whole
    both, first, last = ["Collective", "Collective"], ["Collective", "Identity"], ["Identity", "Collective"]
    assert [r["sp-tp2xpp2"]["ends"] for r in ranks] == [[both]] * 4  # each stage's one block shards and gathers
    assert [r["sp-dp2_of_tp2"]["ends"] for r in ranks] == [[first, last]] * 4  # block0 passes its shares to block1
    assert [r["tp2xpp2"]["ends"] for r in ranks] == [[["Identity", "Identity"]]] * 4
    for case in (c for c in CASES if c.startswith("sp-")):
        for rank in ranks:
            for (loss, norm), (want_loss, want_norm) in zip(rank[case]["log"], want, strict=True):
                assert abs(loss - want_loss) <= SP_TOLERANCE and abs(norm - want_norm) <= SP_TOLERANCE, (case, rank)
    assert [r["tp2xpp2"]["rows"] for r in ranks] == [[3 * WIDTH // 2]] * 4  # each TP rank holds half the q, k, v rows
    total = sum(p.numel() for p in model.parameters())
    for case in CASES:  # a split block's dense copy is freed: a process holds the model less it, plus its shard
        for rank in ranks:
            blocks = len(rank[case]["split"])
            assert rank[case]["reload"] == 0.0, case
            assert rank[case]["held"] == total - blocks * (_block_elements(model, 1) - _block_elements(model, 2)), case
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


@pytest.mark.slow
def test_one_sequence_parallel_stage_over_two_processes_trains_as_the_plain_loop(tmp_path: Path) -> None:
    """charlm whole on one stage of tp 2 with sequence parallelism, on 2 processes: its two blocks pass their
    sequence shares between them (block0 shards its input, block1 gathers its output), and the losses and clipped
    norms of 3 SGD steps equal the plain loop's to 1e-12, the final state_dict to 1e-9."""
    ranks = [r["sp-tp2"] for r in launch_script(tmp_path, 2, MODEL + SCRIPT, {"sp-tp2": [[0, 3, [0, 1], 2, True]]})]
    model, want = plain_loop(MODEL)
    assert [r["ends"] for r in ranks] == [[["Collective", "Identity"], ["Identity", "Collective"]]] * 2
    for rank in ranks:
        for (loss, norm), (want_loss, want_norm) in zip(rank["log"], want, strict=True):
            assert abs(loss - want_loss) <= SP_TOLERANCE and abs(norm - want_norm) <= SP_TOLERANCE, (rank["log"], want)
    saved = torch.load(tmp_path / "sp-tp2.pt")
    for key, value in model.state_dict().items():
        assert torch.allclose(saved[key], value, rtol=0, atol=TOLERANCE), key


LLAMA_CASES = {"tp2xpp2": [[0, 1, [0, 1], 2], [2, 4, [2, 3], 2]]}
LLAMA_CASES["tp2xpp2_zb-h1"] = LLAMA_CASES["tp2xpp2"]
"""A Llama's 5 captured layers (embed_tokens, layers.0, layers.1, norm, lm_head) on TP 2 x PP 2, 1f1b and zb-h1."""


@pytest.mark.slow
def test_a_stock_llama_split_over_four_processes_trains_as_the_plain_loop(tmp_path: Path) -> None:
    """A Hugging Face LlamaForCausalLM (4 heads, 2 key/value heads, float64, captured with torch.export) on TP 2 x
    PP 2 (1f1b, and zb-h1's I/W split for the losses and norms): its decoder layers split on their stages' processes
    (half the query rows each), the projections' dense copies freed, and the losses, clipped norms and final
    state_dict of 3 SGD steps equal the model's own plain loop's to 1e-9."""
    pytest.importorskip("transformers")
    every = launch_script(tmp_path, 4, LLAMA + SCRIPT, LLAMA_CASES)
    model, want = plain_loop(LLAMA)
    for zero_bubble in (r["tp2xpp2_zb-h1"] for r in every):  # the backward split into I and W: the same training
        for (loss, norm), (want_loss, want_norm) in zip(zero_bubble["log"], want, strict=True):
            assert abs(loss - want_loss) <= TOLERANCE and abs(norm - want_norm) <= TOLERANCE, (zero_bubble["log"], want)
    ranks = [r["tp2xpp2"] for r in every]
    assert any(norm > MAX_NORM for _, norm in want)
    assert [r["split"] for r in ranks] == [[1], [1], [2], [2]]
    assert [r["rows"] for r in ranks] == [[WIDTH // 2]] * 4  # half the heads' query rows
    total = sum(p.numel() for p in model.parameters())
    block = model.model.layers[0]
    sharded = sum(p.numel() for p in [*block.self_attn.parameters(), *block.mlp.parameters()])  # the projections
    assert [r["held"] for r in ranks] == [total - sharded // 2] * 4
    for rank in ranks:
        assert rank["reload"] == 0.0
        for (loss, norm), (want_loss, want_norm) in zip(rank["log"], want, strict=True):
            assert abs(loss - want_loss) <= TOLERANCE and abs(norm - want_norm) <= TOLERANCE, (rank["log"], want)
    saved = torch.load(tmp_path / "tp2xpp2.pt")
    assert list(saved) == list(model.state_dict())
    for key, value in model.state_dict().items():
        assert torch.allclose(saved[key], value, rtol=0, atol=TOLERANCE), key


OPTIONS = {"d_model": 16, "heads": 4, "layers": 2, "seq_len": 8}
"""charlm's options in train's runs (its own dataset: pysource)."""


def _plan_file(tmp_path: Path, name: str, stages: list[tuple[int, int, tuple[int, ...], int, bool]], zero: int = 0) -> str:
    """A plan file of `stages` (first, last, devices, tp, sequence_parallel): 4 microbatches of 2, 1f1b."""
    from pipeplan.core.plan import Plan, Stage
    from pipeplan.io.plan_json import write_plan

    plan = Plan(tuple(Stage(a, b, d, tp, sp) for a, b, d, tp, sp in stages), 1, 4, 2, "1f1b", zero=zero)
    path = tmp_path / name
    write_plan(plan, path, "charlm", "local")
    return str(path)


def _train_args(plan: str, local: int, *extra: str, **options: int) -> list[str]:
    """train's flags for charlm (OPTIONS, with `options` in place of its values) in float64 with plain SGD, 3 steps."""
    opts = [x for key, value in (OPTIONS | options).items() for x in ("--opt", f"{key}={value}")]
    return ["--local", str(local), "--plan", plan, "--module", "charlm", *opts, "--dtype", "float64", "--optimizer", "sgd",
            "--lr", str(LR), "--steps", "3", "--no-predict", *extra]  # fmt: skip


@pytest.mark.slow
def test_train_runs_a_plan_file_with_tensor_parallel_stages_as_the_plain_loop(tmp_path: Path) -> None:
    """`train --plan` with 2 stages of tp 2 on `--local 4` (float64, SGD), the first sequence-parallel: its 3 losses
    equal a plain torch loop's on the same batches to 1e-9."""
    plan = _plan_file(tmp_path, "plan.json", [(0, 1, (0, 1), 2, True), (2, 3, (2, 3), 2, False)])
    done = run_train([*_train_args(plan, 4), "--json"], timeout=600)
    assert done.returncode == 0, done.stderr
    losses = json.loads(done.stdout)["losses"]

    want = charlm_losses(OPTIONS, lambda params: torch.optim.SGD(params, lr=LR))
    assert len(losses) == 3 and all(abs(a - b) <= TOLERANCE for a, b in zip(losses, want, strict=True)), (losses, want)


@pytest.mark.parametrize(
    ("stages", "zero", "extra", "message"),
    [
        ([(0, 1, (0, 1), 2, False), (2, 3, (2, 3), 2, False)], 0, ["heads=1"],
         "stage 0 (layers 0..1) has tp 2, which does not divide layer block0's 1 attention heads"),
        ([(0, 1, (0, 1), 2, True), (2, 3, (2, 3), 2, False)], 0, ["seq_len=7"],
         "stage 0 (layers 0..1) has sequence_parallel true and tp 2, which does not divide layer block0's sequence "
         "length 7: give that stage sequence_parallel false, or a tp dividing 7"),
        ([(0, 1, (0, 1), 2, False), (2, 3, (2, 3), 2, False)], 0, ["--eval"],
         "stage 0 has tp 2, and train runs tensor-parallel stages without --eval yet"),
    ],
)  # fmt: skip
def test_train_refuses_what_it_does_not_run_of_a_tensor_parallel_plan_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    stages: list[tuple[int, int, tuple[int, ...], int, bool]],
    zero: int,
    extra: list[str],
    message: str,
) -> None:
    """A tp that does not divide a block's heads or a sequence-parallel stage's sequence length, and a flag
    the runtime does not run beside tp: exit 2, one line naming it, before any process starts."""
    from pipeplan.runtime.training import launch

    started: list[int] = []
    monkeypatch.setattr(launch, "launch_local", lambda nprocs, *args, **kwargs: started.append(nprocs) or 0)
    monkeypatch.chdir(tmp_path)
    plan = _plan_file(tmp_path, "plan.json", stages, zero)
    options = {x.split("=")[0]: int(x.split("=")[1]) for x in extra if not x.startswith("--")}
    flags = [x for x in extra if x.startswith("--")]
    args = _train_args(plan, len({d for stage in stages for d in stage[2]}), *flags, **options)
    code, out, err = run(monkeypatch, capsys, "train", *args)
    assert (code, out, started) == (2, "", []), err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: TrainConfigError: ") and message in lines[0], err


def test_a_weight_tied_over_a_tensor_parallel_stage_is_refused_before_any_process() -> None:
    """An embedding and a head sharing one weight, with a tp 2 stage holding either: one PlanError naming the stage,
    the parameter and its holders; the same model with the tp 2 stage holding only the block is not refused."""
    from pipeplan.core.errors import PlanError
    from pipeplan.core.plan import Plan, Stage
    from pipeplan.runtime.execution.tp_layers import check_tensor_parallel

    embed, head = nn.Embedding(10, WIDTH), nn.Linear(WIDTH, 10, bias=False)
    head.weight = embed.weight
    block = nn.TransformerEncoderLayer(WIDTH, HEADS, 2 * WIDTH, dropout=0.0, batch_first=True)
    layers, names = [embed, block, head], ["embed", "block", "head"]
    tied = Plan((Stage(0, 1, (0, 1), tp=2), Stage(2, 2, (2,))), 1, 2, 2, "1f1b")
    with pytest.raises(PlanError, match=r"stage 0 has tp 2 and holds 'embed.weight', a parameter tied over layers embed, "
                       r"head: .* untie it, or give that stage tp 1"):  # fmt: skip
        check_tensor_parallel(tied, layers, names, graph=None)
    apart = Plan((Stage(0, 0, (0,)), Stage(1, 1, (1, 2), tp=2), Stage(2, 2, (3,))), 1, 2, 2, "1f1b")
    check_tensor_parallel(apart, layers, names, graph=None)
