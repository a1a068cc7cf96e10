"""Per-process optimizer-state bytes with and without sharding (a plan's zero 1, runtime.execution.sharded_state).

Usage: .venv/bin/python benchmarks/sharded_state_memory.py [--processes 4] [--width 128]

The zoo's charlm (embedding, 2 causal transformer blocks of d_model --width and 4 heads, head; sequence 16), float32,
trained 2 Adam steps through pipeplan.distribute on --processes local gloo processes, under two plans: one stage
of --processes data-parallel replicas, and the same stage with its state sharded (zero 1), each on the same global
batch (4 samples per process). Each process reports the bytes of its optimizer's state tensors (each storage once:
Adam's exp_avg and exp_avg_sq, and its step counters) and of its parameters. Printed: one row per plan and process,
the ratio zero 0 / zero 1, and the largest loss difference between the two plans (they train alike).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

SCRIPT = """
import json, sys
import torch
from torch.multiprocessing.reductions import StorageWeakRef
import pipeplan
from pipeplan.core.plan import Plan, Stage
from pipeplan.models.zoo.charlm import charlm, next_char_cross_entropy

width, processes = int(sys.argv[1]), int(sys.argv[2])
rows = {}
for zero in (0, 1):
    torch.manual_seed(0)
    spec = charlm(d_model=width, heads=4, layers=2, seq_len=16, dropout=0.0, seed=5)
    model = torch.nn.Sequential(*spec.layers)
    plan = Plan((Stage(0, 3, tuple(range(processes))),), 1, 2, 2 * processes, "1f1b", zero=zero)
    pipe = pipeplan.distribute(model, plan, next_char_cross_entropy)
    optimizer = pipe.optimizer(torch.optim.Adam, lr=1e-3)
    generator = torch.Generator().manual_seed(3)
    losses = []
    for _ in range(2):
        ids = torch.randint(0, 96, (plan.global_batch, 16), generator=generator)
        losses.append(pipe.step(ids, torch.roll(ids, -1, 1)))
        optimizer.step()
    seen = {}
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                storage = value.untyped_storage()
                seen.setdefault(StorageWeakRef(storage).cdata, storage.nbytes())
    rows[zero] = {"state_bytes": sum(seen.values()), "param_bytes": sum(p.numel() * p.element_size() for p in pipe.parameters()),
                  "losses": losses}
json.dump(rows, open(f"rank-{pipe.rank}.json", "w"))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--width", type=int, default=128)
    args = parser.parse_args()
    from pipeplan.runtime.training.launch import launch_local

    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "script.py"
        script.write_text(SCRIPT)
        code = f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')"
        if launch_local(args.processes, code, [str(args.width), str(args.processes)], cwd=folder, timeout_s=900) != 0:
            print("the processes failed", file=sys.stderr)
            return 1
        ranks = [json.loads((Path(folder) / f"rank-{r}.json").read_text()) for r in range(args.processes)]
    print(f"charlm d_model {args.width}, one stage of {args.processes} replicas, Adam, float32")
    print(f"{'process':>7} {'params B':>10} {'state B zero 0':>15} {'state B zero 1':>15} {'ratio':>6}")
    for r, rank in enumerate(ranks):
        full, sharded = rank["0"]["state_bytes"], rank["1"]["state_bytes"]
        print(f"{r:>7} {rank['0']['param_bytes']:>10} {full:>15} {sharded:>15} {full / sharded:>6.2f}")
    gap = max(abs(a - b) for rank in ranks for a, b in zip(rank["0"]["losses"], rank["1"]["losses"], strict=True))
    print(f"largest loss difference zero 0 vs zero 1: {gap:.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
