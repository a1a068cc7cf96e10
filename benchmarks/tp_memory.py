"""What each process holds of a model once a TP 2 x PP 2 plan splits its transformer blocks (issue 34).

Usage: .venv/bin/python benchmarks/tp_memory.py [--model charlm|llama] [--width 512] [--layers 4] [--json]

charlm (float64, dropout 0), or a Hugging Face LlamaForCausalLM (float64, 8 heads, 4 key/value heads, MLP 2.75 x
width, captured with torch.export), of `--width` and `--layers` blocks on 4 local gloo processes: stage 0 = the
embedding and the first half of the blocks on processes 0-1 (tp 2), stage 1 = the rest (and Llama's final norm) and
the head on processes 2-3 (tp 2).
Each process reports, before `pipeplan.distribute` and after it: the bytes of the parameters it holds (each storage
once; a DTensor's local shard; a parameter on the meta device holds none) and its resident set (/proc/self/statm).
Every process still builds the whole model (the other stage's layers too): the drop is its own split blocks' dense
copies less its shards of them.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

SCRIPT = """
import json, os, sys
import torch
import pipeplan
from pipeplan.core.plan import Plan, Stage
from pipeplan.models.zoo.charlm import charlm, next_char_cross_entropy

WIDTH, LAYERS, MODEL = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]

def held(params):
    seen, total = set(), 0
    for p in params:
        local = p.to_local() if hasattr(p, "to_local") else p
        if local.is_meta or local.untyped_storage().data_ptr() in seen:
            continue
        seen.add(local.untyped_storage().data_ptr())
        total += local.untyped_storage().nbytes()
    return total

def rss():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

half, extra = LAYERS // 2, 0
if MODEL == "charlm":
    spec = charlm(d_model=WIDTH, heads=8, layers=LAYERS, seq_len=16, dropout=0.0, seed=5)
    model, loss = torch.nn.Sequential(*spec.layers).double(), next_char_cross_entropy
else:
    import transformers
    from pipeplan.models.zoo.stock import causal_lm_loss as loss
    torch.manual_seed(5)
    config = transformers.LlamaConfig(vocab_size=96, hidden_size=WIDTH, num_hidden_layers=LAYERS, num_attention_heads=8,
                                      num_key_value_heads=4, intermediate_size=WIDTH * 11 // 4, max_position_embeddings=16,
                                      tie_word_embeddings=False, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    model, extra = transformers.LlamaForCausalLM(config).double(), 1
before = {"param_bytes": held(model.parameters()), "rss_bytes": rss()}
plan = Plan((Stage(0, half, (0, 1), 2), Stage(half + 1, LAYERS + 1 + extra, (2, 3), 2)), 1, 2, 2, "1f1b")
pipe = pipeplan.distribute(model, plan, loss)
ids = torch.randint(0, 96, (4, 16), generator=torch.Generator().manual_seed(1))
pipe.step(ids, ids)
after = {"param_bytes": held([*model.parameters(), *pipe.parameters()]), "rss_bytes": rss()}
json.dump({"rank": pipe.rank, "before": before, "after": after}, open(f"rank-{pipe.rank}.json", "w"))
"""


def main() -> None:
    """Run the 4 processes, print each one's bytes before and after the split."""
    from pipeplan.runtime.training.launch import launch_local

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("charlm", "llama"), default="charlm")
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "script.py"
        script.write_text(SCRIPT)
        code = f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')"
        assert launch_local(4, code, [str(args.width), str(args.layers), args.model], cwd=folder, timeout_s=600) == 0
        rows = [json.loads((Path(folder) / f"rank-{r}.json").read_text()) for r in range(4)]
    if args.json:
        json.dump(rows, sys.stdout, indent=1)
        return
    mib = 1 << 20
    print("rank  params before  params after  RSS before  RSS after   (MiB)")
    for row in rows:
        b, a = row["before"], row["after"]
        print(f"{row['rank']:>4}  {b['param_bytes'] / mib:13.2f}  {a['param_bytes'] / mib:12.2f}  "
              f"{b['rss_bytes'] / mib:10.1f}  {a['rss_bytes'] / mib:9.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
