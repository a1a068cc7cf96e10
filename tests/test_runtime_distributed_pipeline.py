"""pipeplan.distribute on stock Hugging Face models (models.traced.capture) over 2 gloo processes: an untied Llama and a
GPT-2 whose tied `wte`/`lm_head` weight is split over the 2 stages train as a plain torch loop does (float64, 1e-9):
the same losses, the same clipped global gradient norms (the tied weight counted once), the same final state."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from torch import nn  # noqa: E402

import hf_tiny  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]

TOLERANCE = 1e-9
STEPS, BATCH, SEQ, VOCAB, MAX_NORM, LR = 3, 4, 16, 100, 0.3, 0.5
CASES = {"llama": {"tied": False}, "gpt2": {}}
"""The models (tests/hf_tiny.py's tiny configs, float64, dropout 0) and their build options."""

SCRIPT = """
import json, sys
import torch
sys.path.insert(0, sys.argv[1])
import hf_tiny
import pipeplan
from pipeplan.core.plan import Plan, Stage
from pipeplan.models.specs import spec_from_module

def loss_fn(logits, labels):
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))

out = {}
for kind, options in json.loads(sys.argv[2]).items():
    model = hf_tiny.build(kind, **options)
    layers = len(spec_from_module(model).layers)
    plan = Plan((Stage(0, 1, (0,)), Stage(2, layers - 1, (1,))), 1, 2, 2, "1f1b")
    pipe = pipeplan.distribute(model, plan, loss_fn)
    optimizer = torch.optim.SGD(pipe.parameters(), lr=LR)
    batches = torch.Generator().manual_seed(3)
    log = []
    for _ in range(STEPS):
        ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=batches)
        labels = torch.randint(0, VOCAB, (BATCH, SEQ), generator=batches)
        optimizer.zero_grad()
        loss = pipe.step(ids, labels)
        norm = pipe.clip_grad_norm_(MAX_NORM)
        optimizer.step()
        log.append([loss, norm])
    state = pipe.state_dict()
    if pipe.rank == 0:
        torch.save(state, f"{kind}.pt")
    out[kind] = {"log": log, "shared": [list(c.layers) for c in pipe.executor.shared if c.split], "stages": list(pipe.stages)}
json.dump(out, open(f"rank-{pipe.rank}.json", "w"))
"""


def _plain(kind: str, options: dict[str, object]) -> tuple[nn.Module, list[list[float]]]:
    """The same training as a plain torch loop over the whole model in this process: its losses and norms."""
    model = hf_tiny.build(kind, **options)
    assert isinstance(model, nn.Module)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    batches = torch.Generator().manual_seed(3)
    log = []
    for _ in range(STEPS):
        ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=batches)
        labels = torch.randint(0, VOCAB, (BATCH, SEQ), generator=batches)
        optimizer.zero_grad()
        logits = model(ids, use_cache=False).logits
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1))
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        optimizer.step()
        log.append([float(loss.detach()), float(norm)])
    return model, log


def test_stock_hf_models_split_over_two_processes_train_as_the_plain_loop(tmp_path: Path) -> None:
    """Llama (untied) and GPT-2 (tied wte/lm_head on stages 0 and 1) over 2 processes: losses and clipped norms of 3
    steps and the final state_dict equal the plain loop's to 1e-9."""
    from pipeplan.runtime.training.launch import launch_local

    constants = f"STEPS, BATCH, SEQ, VOCAB, MAX_NORM, LR = {STEPS}, {BATCH}, {SEQ}, {VOCAB}, {MAX_NORM}, {LR}\n"
    script = tmp_path / "script.py"
    script.write_text(constants + SCRIPT)
    code = f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')"
    tests = str(Path(__file__).resolve().parent)
    assert launch_local(2, code, [tests, json.dumps(CASES)], cwd=str(tmp_path), timeout_s=500) == 0
    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(2)]
    for kind, options in CASES.items():
        model, want = _plain(kind, options)
        assert [r[kind]["stages"] for r in ranks] == [[0], [1]]
        assert ranks[0][kind]["shared"] == ([[0, 5]] if kind == "gpt2" else [])  # wte (stage 0) and lm_head (stage 1)
        assert any(norm > MAX_NORM for _, norm in want)  # the clipping acts
        for rank in ranks:
            got = rank[kind]["log"]
            assert len(got) == STEPS
            for (loss, norm), (want_loss, want_norm) in zip(got, want, strict=True):
                assert abs(loss - want_loss) <= TOLERANCE and abs(norm - want_norm) <= TOLERANCE
        saved = torch.load(tmp_path / f"{kind}.pt")
        assert list(saved) == list(model.state_dict())
        for key, value in model.state_dict().items():
            assert torch.allclose(saved[key], value, rtol=0, atol=TOLERANCE), key


@pytest.mark.usefixtures("one_process")
def test_a_batch_of_another_shape_than_the_export_is_refused_in_one_line_before_the_step() -> None:
    """torch.export fixed every dimension but the batch's (GPT-2's 16 positions): 8 positions are one PlanError line
    naming both shapes and the way out, and the model is left as it was (no gradient)."""
    import pipeplan
    from pipeplan.core.errors import PlanError
    from pipeplan.core.plan import Plan, Stage

    model = hf_tiny.build("gpt2")
    assert isinstance(model, nn.Module)
    pipe = pipeplan.distribute(model, Plan((Stage(0, 5, (0,)),), 1, 2, 2, "gpipe"), nn.functional.cross_entropy)
    ids = torch.zeros(4, 8, dtype=torch.long)
    with pytest.raises(PlanError, match=r"^inputs have shape \(4, 8\) but the model was captured with torch.export on "
                       r"inputs of shape \(4, 16\) \(only the batch dimension may vary\): pad or cut every batch"):  # fmt: skip
        pipe.step(ids, ids)
    assert all(p.grad is None for p in model.parameters())
