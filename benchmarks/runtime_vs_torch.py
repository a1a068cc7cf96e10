"""pipeplan's runtime against torch.distributed.pipelining (Schedule1F1B, ScheduleGPipe) and against its own prediction.

Usage: .venv/bin/python benchmarks/runtime_vs_torch.py [--cases mlp,gpt2] [--rounds N] [--warmup N] [--check]

Case mlp: 8 MLP blocks (Linear 1024x1024 + ReLU; the built-in `mlp` spec), MSE loss, global batch 32 in
8 microbatches of 4, float32, split 4 + 4 blocks over 2 processes (gloo, one thread each, started by
the runtime's --local launcher). Each round runs one iteration (forward + backward of every
microbatch, gradients left in .grad, no optimizer) of four systems: pipeplan 1F1B, torch Schedule1F1B,
pipeplan GPipe, torch ScheduleGPipe, in an order that alternates between rounds (ABBA) so that drifts in
machine load hit both sides alike. An iteration's time is the slowest process's time from a common
barrier to the end of its last action. The ratio pipeplan / torch is taken per round and schedule.

The prediction profiles the same model on this machine: each stage on its own process, both at once, one
thread, microbatch 4, stage times calibrated to the stage run as one chain; one profiling round (after an
untimed one, so gradients accumulate as in training) in every timed round. The gloo link is measured by
ping-pong, and each round's profile is simulated with pipeplan's cost model, giving one prediction per round;
measured / predicted is taken per round (as the machine is shared, load drifts between rounds).

Case gpt2 (issue 32: the runtime as a library is no slower on a stock model): an unmodified Hugging Face
GPT2LMHeadModel (benchmarks/stock_models.py: 4 blocks, n_embd 256, 4 heads, vocabulary 1000, 64 tokens, dropout
0, lm_head tied to the token embedding), captured by pipeplan (torch.export, models.traced.capture: 8 layers, wte, drop,
h.0-h.3, ln_f, lm_head) with HF's own causal-LM loss (models.zoo.stock), global batch 32 in 8 microbatches of 4, split
4 + 4 layers (wte .. h.1 | h.2 .. lm_head), so the tied weight lives on both processes. Both sides run the same
captured layers: pipeplan's executor as `train` builds it (the layer graph, the per-call layer seeding, the tied
weight's gradient all-reduced over the two copies inside the iteration, as train does), torch's PipelineStage on
an nn.Sequential of the stage's layers with one dist.all_reduce of the tied weight's gradient after the step
(the plain way to keep the two copies' gradients equal). Prediction as for mlp.

Targets (with --check the script exits 1 when one fails): over >= 10 rounds, median pipeplan/torch ratio <= 1.0
(mlp) and <= 0.95 (gpt2, the issue's bound) for each schedule; |median of per-round measured pipeplan / predicted
- 1| <= 15% for each schedule (mlp; gpt2's is reported, not a target).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROCESSES = 2
TARGET_PREDICTION = 0.15
SCHEDULES = ("1f1b", "gpipe")


@dataclass(frozen=True)
class Case:
    """One model of the benchmark: its MODULE_SPEC and options, the batch, its ratio target, whether its
    prediction is a target, and the line that describes it."""

    module: str
    options: dict[str, object]
    batch: int
    microbatches: int
    target_ratio: float
    prediction_target: bool
    what: str


CASES = {
    "mlp": Case("mlp", {"hidden": 1024, "blocks": 8}, 32, 8, 1.0, True, "8 MLP blocks x 1024"),
    "gpt2": Case(
        "stock_models:gpt2",
        {},
        32,
        8,
        0.95,
        False,
        "stock HF GPT2LMHeadModel (4 blocks, n_embd 256, vocab 1000, 64 tokens, tied lm_head), captured",
    ),
}


def worker(case_name: str, rounds: int, warmup: int, out: str) -> None:
    """One process of the benchmark: build both runtimes on identical copies of the model, time them alternately."""
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    from pipeplan.models.build import build_model
    from pipeplan.runtime.execution.executor import Executor
    from pipeplan.runtime.execution.job import ScheduleLayout
    from pipeplan.runtime.measurement.prediction import local_cluster, measure_link, plan_on_processes, predict, profile_stages
    from pipeplan.runtime.placement import Topology

    case = CASES[case_name]
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    device = torch.device("cpu")

    def fresh_model() -> object:
        return build_model(case.module, case.options, "sample", "float32", seed=0, sample_size=case.batch)

    runners = {}
    plans = {}
    for name in SCHEDULES:
        model = fresh_model()
        plan, schedule = ScheduleLayout(name, PROCESSES, case.microbatches, case.batch).build(len(model.layers), PROCESSES)
        plans[name] = (plan, schedule, model)
        topology = Topology(plan, schedule, PROCESSES)
        executor = Executor(
            topology, topology.roles[rank], model.layers, model.loss_fn, device, timeout_s=120.0, graph=model.graph
        )
        x, y = model.dataset.inputs, model.dataset.targets
        runners[f"pipeplan {name}"] = lambda ex=executor, x=x, y=y: ex.run(x, y)

        theirs = fresh_model()
        first, last = plan.stages[rank].first_layer, plan.stages[rank].last_layer
        module = torch.nn.Sequential(*theirs.layers[first : last + 1])
        # a tied weight held by layers of both stages: each process's copy gets its own stages' part of the gradient,
        # and one all-reduce after the step sums them (what pipeplan's executor does inside the iteration)
        tied = [p for p in _shared_objects(theirs) if any(p is q for q in module.parameters())]
        stage = PipelineStage(module, stage_index=rank, num_stages=PROCESSES, device=device)
        cls = Schedule1F1B if name == "1f1b" else ScheduleGPipe
        sched = cls(stage, n_microbatches=case.microbatches, loss_fn=theirs.loss_fn)

        def torch_step(
            sched: object = sched, module: torch.nn.Module = module, x: torch.Tensor = x, y: torch.Tensor = y, tied: list = tied
        ) -> None:
            module.zero_grad(set_to_none=True)
            if rank == 0:
                sched.step(x)
            else:
                sched.step(target=y, losses=[])
            for param in tied:
                dist.all_reduce(param.grad)

        runners[f"torch {name}"] = torch_step

    order = ["pipeplan 1f1b", "torch 1f1b", "pipeplan gpipe", "torch gpipe"]
    times: dict[str, list[float]] = {k: [] for k in order}
    # the prediction's profile is measured round by round between the timed iterations, each stage on its own
    # process and both at once, so that it sees the same machine load as the runs it predicts.
    plan, _, model = plans[SCHEDULES[0]]
    latency, bandwidth = measure_link(device)
    cluster = local_cluster(PROCESSES, latency, bandwidth)
    predicted: dict[str, list[float]] = {name: [] for name in SCHEDULES}
    for r in range(warmup + rounds):
        profile = profile_stages(model.layers, model.dataset.inputs, plan, (rank,), runs=1, warmup=1)
        if profile is not None and r >= warmup:
            for name in SCHEDULES:
                _, schedule, _ = plans[name]
                predicted[name].append(predict(plan_on_processes(plan), schedule, profile, cluster).iteration_time)
        for key in order if r % 2 == 0 else list(reversed(order)):
            dist.barrier()
            t0 = time.perf_counter()
            runners[key]()
            elapsed = torch.tensor([time.perf_counter() - t0])
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            if r >= warmup:
                times[key].append(float(elapsed) * 1000.0)

    if rank == 0:
        Path(out).write_text(json.dumps({"times": times, "predicted": predicted, "latency_ms": latency, "bandwidth": bandwidth}))
    dist.barrier()
    dist.destroy_process_group()


def _shared_objects(model: object) -> list[object]:
    """The parameter objects that several of model's layers hold (models.parameter_sharing finds them; named after the first)."""
    from pipeplan.models.parameter_sharing import shared_parameters

    found = []
    for shared in shared_parameters(model.layers, model.layer_names):
        first = shared.layers[0]
        found.append(model.layers[first].get_parameter(shared.name[len(model.layer_names[first]) + 1 :]))
    return found


def spread(values: list[float]) -> str:
    """min / quartiles / max of values."""
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return f"{min(values):.3f} / {q[0]:.3f} / {q[2]:.3f} / {max(values):.3f}"


def run_case(name: str, rounds: int, warmup: int) -> list[str]:
    """Run one case on PROCESSES local processes and print its table; the targets it fails."""
    from pipeplan.core.units import bytes_per_s_to_gb_per_s, ms_to_us
    from pipeplan.runtime.training.launch import launch_local, run_file

    case = CASES[name]
    out = Path(tempfile.mkdtemp()) / "result.json"
    code = launch_local(PROCESSES, run_file(__file__), ["--worker", name, str(rounds), str(warmup), str(out)])
    if code:
        return [f"{name}: benchmark workers failed with exit code {code}"]
    result = json.loads(out.read_text())
    times, predicted = result["times"], result["predicted"]
    model = f"{case.what}, batch {case.batch} in {case.microbatches} microbatches"
    print(f"case {name}: runtime vs torch.distributed.pipelining: {model},")
    print(f"{PROCESSES} processes, gloo, 1 thread each; {rounds} alternating rounds after {warmup} warm-up")
    latency_us, gb_per_s = ms_to_us(result["latency_ms"]), bytes_per_s_to_gb_per_s(result["bandwidth"])
    print(f"link (ping-pong): latency {latency_us:.0f} us, bandwidth {gb_per_s:.2f} GB/s")
    print()
    header = f"{'schedule':<8} {'pipeplan ms':>12} {'torch ms':>10} {'ratio median':>13}  {'ratio min / q1 / q3 / max':<30}"
    print(header + f" {'predicted ms':>13} {'meas/pred':>10}  {'meas/pred min / q1 / q3 / max':<30}")
    failures = []
    for schedule in SCHEDULES:
        ours, theirs = times[f"pipeplan {schedule}"], times[f"torch {schedule}"]
        ratios = [a / b for a, b in zip(ours, theirs, strict=True)]
        ratio = statistics.median(ratios)
        measured = statistics.median(ours)
        accuracy = [a / p for a, p in zip(ours, predicted[schedule], strict=True)]
        fit = statistics.median(accuracy)
        print(
            f"{schedule:<8} {measured:>12.2f} {statistics.median(theirs):>10.2f} {ratio:>13.3f}  {spread(ratios):<30}"
            f" {statistics.median(predicted[schedule]):>13.2f} {fit:>10.3f}  {spread(accuracy):<30}"
        )
        if ratio > case.target_ratio:
            failures.append(f"{name} {schedule}: median ratio {ratio:.3f} > {case.target_ratio}")
        if case.prediction_target and abs(fit - 1) > TARGET_PREDICTION:
            failures.append(f"{name} {schedule}: measured/predicted {fit:.3f} is off by more than {TARGET_PREDICTION:.0%}")
    print()
    return failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    parser.add_argument("--rounds", type=int, default=20, help="measured rounds (>= 10)")
    parser.add_argument("--warmup", type=int, default=3, help="unmeasured rounds first")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target fails")
    parser.add_argument("--worker", nargs=4, metavar=("CASE", "ROUNDS", "WARMUP", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        sys.path.insert(0, str(HERE))  # stock_models
        worker(args.worker[0], int(args.worker[1]), int(args.worker[2]), args.worker[3])
        return 0
    if args.rounds < 10:
        parser.error(f"--rounds must be >= 10, got {args.rounds}")
    names = args.cases.split(",")
    unknown = sorted(set(names) - set(CASES))
    if unknown:
        parser.error(f"--cases: no case {unknown[0]} (cases: {', '.join(CASES)})")
    sys.path.insert(0, str(HERE))  # the workers get this path: stock_models
    failures = []
    for name in names:
        failures += run_case(name, args.rounds, args.warmup)
    print("targets: " + ("all met" if not failures else "; ".join(failures)))
    return 1 if failures and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
