"""What the tensor-parallel runtime tests share: the runs' constants, a stock Hugging Face Llama as worker code, the
plain torch loop that is their reference, and the launch of a worker script over local gloo processes.

Model code is text: the same lines build the model in each worker process (after CONSTANTS) and in the test's own
process (plain_loop), so both train the same model on the same batches.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

STEPS, BATCH, SEQ, WIDTH, HEADS, MAX_NORM, LR = 3, 4, 8, 16, 4, 0.3, 0.5
CONSTANTS = f"STEPS, BATCH, SEQ, WIDTH, HEADS, MAX_NORM, LR = {STEPS}, {BATCH}, {SEQ}, {WIDTH}, {HEADS}, {MAX_NORM}, {LR}\n"

LLAMA = """
import torch
import transformers
from pipeplan.models.zoo.stock import causal_lm_loss as loss_fn

def build():
    torch.manual_seed(5)
    config = transformers.LlamaConfig(vocab_size=96, hidden_size=WIDTH, num_hidden_layers=2, num_attention_heads=HEADS,
                                      num_key_value_heads=HEADS // 2, intermediate_size=2 * WIDTH,
                                      max_position_embeddings=SEQ, tie_word_embeddings=False, bos_token_id=0,
                                      eos_token_id=0, pad_token_id=0)
    return transformers.LlamaForCausalLM(config).double()

def forward(model, ids):
    return model(ids).logits

def batches():
    generator = torch.Generator().manual_seed(3)
    for _ in range(STEPS):
        yield torch.randint(0, 96, (BATCH, SEQ), generator=generator), torch.randint(0, 96, (BATCH, SEQ), generator=generator)
"""
"""A stock LlamaForCausalLM (float64, 4 heads, 2 key/value heads, 2 decoder layers): captured, its 5 layers are
embed_tokens, layers.0, layers.1, norm and lm_head."""


def model_space(code: str) -> dict[str, Any]:
    """The names model code defines (build, forward, batches, loss_fn), run here after CONSTANTS."""
    space: dict[str, Any] = {}
    exec(CONSTANTS + code, space)  # the test's own model code, shared with the workers
    return space


def plain_loop(code: str) -> tuple[nn.Module, list[list[float]]]:
    """The same training as a plain torch loop over the whole model in this process: the model after it, and each
    step's loss and clipped global gradient norm."""
    space = model_space(code)
    model, loss_fn, forward = space["build"](), space["loss_fn"], space["forward"]
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    log = []
    for ids, labels in space["batches"]():
        optimizer.zero_grad()
        loss = loss_fn(forward(model, ids), labels)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        optimizer.step()
        log.append([float(loss.detach()), float(norm)])
    return model, log


def launch_script(tmp_path: Path, nprocs: int, code: str, cases: object, timeout_s: int = 600) -> list[dict[str, Any]]:
    """Run CONSTANTS + code as a script on nprocs local gloo processes in tmp_path with the JSON of `cases` as its
    argument (it must succeed); each rank's `rank-R.json`."""
    from pipeplan.runtime.training.launch import launch_local

    script = tmp_path / "script.py"
    script.write_text(CONSTANTS + code)
    run = f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')"
    assert launch_local(nprocs, run, [json.dumps(cases)], cwd=str(tmp_path), timeout_s=timeout_s) == 0
    return [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(nprocs)]
