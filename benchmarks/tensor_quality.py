"""pipeplan's 3D search against the Megatron-style grid on the published GPT configurations (issue 34).

Usage: .venv/bin/python benchmarks/tensor_quality.py [--rows NAME,...] [--json]

For each row of benchmarks/published_runs.py with a global batch and a vocabulary (the Megatron-LM SC'21 rows and
BLOOM-176B), on the calibrated preset of its GPUs and its GPU count: the Megatron-style baseline's best grid point
(planner.baselines.megatron.plan_megatron: t x p x d, uniform stages, 1F1B or interleaved, no ZeRO) and pipeplan's
3D search (planner.search.tensor_grid.plan_tensor, which `plan` runs beside its t = 1 search and keeps the faster),
each simulated in full. Reported: both times, the speed-up, the winning grid, and the gap to two floors:

- the proven lower bound over every plan, tensor-parallel and sharded included (planner.bound.tensor_bound: compute
  with the optimizer step, and one microbatch's path, at every shape);
- a work floor, looser: every layer's forward and backward for the whole global batch at its cheapest per-sample
  microbatch size among the divisors of the batch, spread evenly over all devices (tensor parallelism divides a split
  layer's time by t on t devices: the same device-time).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pipeplan.api.planning import plan_request
from pipeplan.planner.baselines.megatron import plan_megatron
from pipeplan.planner.bound.tensor_bound import tensor_lower_bound
from pipeplan.planner.plan_space import divisors
from pipeplan.planner.search.tensor_grid import plan_tensor
from published_runs import RUNS, PublishedRun, _cluster_name, _spec


def work_floor(request) -> float:  # type: ignore[no-untyped-def]
    """The module note's floor in ms: min over b of (every layer's F + B at b) x (g / b), over the devices' speeds."""
    g = request.global_batch
    per_batch = min(float(request.model.layers.per_layer_ms(b).sum()) * g / b for b in divisors(g))
    return per_batch / sum(d.speed for d in request.cluster.devices)


def row(run: PublishedRun) -> dict[str, object]:
    """Both planners on one published configuration."""
    assert run.global_batch is not None
    request = plan_request(_spec(run, 1), _cluster_name(run), run.global_batch, time_budget_s=None)
    started = time.process_time()
    grid = plan_megatron(request)
    grid_cpu = time.process_time() - started
    started = time.process_time()
    ours = plan_tensor(request)
    ours_cpu = time.process_time() - started
    plan, point = ours.plan, grid.extra["grid"]
    floor = work_floor(request)
    started = time.process_time()
    bound = tensor_lower_bound(request)
    bound_cpu = time.process_time() - started
    return {
        "run": run.name,
        "gpus": run.gpus,
        "published_grid": f"{run.tp}x{run.pp}x{run.dp}",
        "megatron_grid": f"{point.tp}x{point.pp}x{point.dp} b{point.micro} v{point.chunks}",
        "megatron_ms": grid.iteration_time,
        "pipeplan_grid": f"{plan.stages[0].tp}x{plan.num_ranks}x{plan.data_parallel_of(0)} b{plan.microbatch_size} "
        f"{plan.schedule} v{plan.chunks} zero{plan.zero} sp{int(plan.stages[0].sequence_parallel)}",
        "pipeplan_ms": ours.iteration_time,
        "speedup": grid.iteration_time / ours.iteration_time,
        "floor_ms": floor,
        "gap": ours.iteration_time / floor,
        "bound_ms": bound.ms,
        "bound_term": bound.term,
        "bound_gap": ours.iteration_time / bound.ms,
        "cpu_s": {"megatron": round(grid_cpu, 2), "pipeplan_3d": round(ours_cpu, 2), "bound": round(bound_cpu, 2)},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default=None, help="comma-separated run names [every row with a batch and vocabulary]")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    wanted = None if args.rows is None else set(args.rows.split(","))
    runs = [r for r in RUNS if r.global_batch is not None and r.vocab is not None and (wanted is None or r.name in wanted)]
    rows = []
    for run in runs:
        rows.append(row(run))
        if not args.json:
            r = rows[-1]
            print(
                f"| {r['run']} | {r['gpus']} | {r['published_grid']} | {r['megatron_grid']} | {r['megatron_ms']:.1f} | "
                f"{r['pipeplan_grid']} | {r['pipeplan_ms']:.1f} | {r['speedup']:.3f} | {r['bound_ms']:.1f} | "
                f"{r['bound_gap']:.3f} | {r['gap']:.3f} | {r['cpu_s']['megatron']} / {r['cpu_s']['pipeplan_3d']} / "
                f"{r['cpu_s']['bound']} |",
                flush=True,
            )
    if args.json:
        print(json.dumps(rows, indent=1))
    slower = [r["run"] for r in rows if r["pipeplan_ms"] > r["megatron_ms"]]  # type: ignore[operator]
    return 1 if slower else 0


if __name__ == "__main__":
    sys.exit(main())
