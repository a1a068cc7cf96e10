"""What H4 leaves an adaptive controller, measured with the future known (issue 35).

Usage: PYTHONPATH=src .venv/bin/python benchmarks/adaptive_bound.py [--profile dapple/gnmt-16] [--batch 32]
       [--cluster pcie-4x4-10g] [--seed 10] [--traces markov,oscillating,bus-1s,ferry-1s,flip]

For each trace (the instance and seed of benchmarks/adaptive.py: gnmt-16 on pcie-4x4-10g is its 4th job, seed 10):
every fixed k, the best fixed k in hindsight, the oracle over every k (runs.run_oracle: dynamic programming with the
future known) and the oracle restricted to the k whose peak is <= TARGET_PEAK x the best fixed k's ("capped").
A controller meets H4 either by holding only capped k (so it is at most the capped oracle) or by being more than
TARGET_PEAK_GAIN faster than the best fixed k. With H1/A3 (>= TARGET_ORACLE of the oracle), when capped / oracle is
below TARGET_ORACLE the controller must use a dearer k, and then needs (1 + gain) x best / oracle of the oracle:
"needed" below, to compare with the 0.95 of H1/A3 and with what the controller reaches.
"""

from __future__ import annotations

import argparse

from adaptive import ITERATIONS, TARGET_ORACLE, TARGET_PEAK, TARGET_PEAK_GAIN, cross_node_links, make_trace, plan_instance


def main() -> None:
    """Print one row per trace."""
    from adaptive_traces import FLIP_SLOW, held_out_trace
    from pipeplan.adapt.controller import AdaptiveController, ControllerConfig
    from pipeplan.adapt.pipeline import PipelineModel
    from pipeplan.adapt.runs import run_fixed, run_oracle
    from pipeplan.core.hardware.bandwidth_trace import BandwidthTrace, TraceStep
    from pipeplan.schedules.kfkb import kfkb
    from pipeplan.sim.engine.simulator import simulate

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="dapple/gnmt-16")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--cluster", default="pcie-4x4-10g")
    parser.add_argument("--seed", type=int, default=10)
    parser.add_argument("--traces", default="markov,oscillating,bus-1s,ferry-1s,flip")
    args = parser.parse_args()
    request, result = plan_instance(args.profile, args.batch, args.cluster)
    plan, model = result.plan, request.model
    idle = PipelineModel.from_plan(plan, model)
    links = cross_node_links(idle, model.cluster)
    slowed = BandwidthTrace(tuple(TraceStep(0.0, link, FLIP_SLOW) for link in links))
    slow_ms = simulate(kfkb(idle.num_stages, idle.microbatches, 1), idle.costs, slowed, record=False).iteration_time
    config = ControllerConfig()
    print("trace | best k | capped k | oracle/best | capped/oracle | needed with a dearer k | oracle k used")
    for name in args.traces.split(","):
        if name in ("periodic", "markov", "replay", "oscillating"):
            trace = make_trace(name, result.iteration_time, links, args.seed, ITERATIONS)
        else:
            trace = held_out_trace(name, result.iteration_time, slow_ms, links, args.seed, ITERATIONS)
        pipeline = PipelineModel.from_plan(plan, model, trace)
        controller = AdaptiveController(pipeline, config)
        schedules = controller.predictor.schedules
        fixed = {k: run_fixed(f"k={k}", k, s, pipeline, trace, ITERATIONS) for k, s in schedules.items()}
        best = min(fixed, key=lambda k: (fixed[k].total_ms, k))
        cap = TARGET_PEAK * max(fixed[best].peak_bytes)
        capped = {k: s for k, s in schedules.items() if max(fixed[k].peak_bytes) <= cap}
        oracle = run_oracle(schedules, pipeline, trace, ITERATIONS, config.switch_ms)
        bounded = run_oracle(capped, pipeline, trace, ITERATIONS, config.switch_ms)
        ratio = oracle.total_ms / bounded.total_ms
        needed = (1 + TARGET_PEAK_GAIN) * oracle.total_ms / fixed[best].total_ms
        print(
            f"{name} | {best} | <= {max(capped)} | {fixed[best].total_ms / oracle.total_ms:.3f} | {ratio:.3f}"
            f"{' (< ' + str(TARGET_ORACLE) + ')' if ratio < TARGET_ORACLE else ''} | {needed:.3f} | {sorted(set(oracle.k))}",
            flush=True,
        )


if __name__ == "__main__":
    main()
