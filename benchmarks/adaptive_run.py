"""Ada-Grouper on the real transport: the adaptive controller against fixed 1F1B, 2 local processes, an emulated link
under a preempted bandwidth trace.

Usage: .venv/bin/python benchmarks/adaptive_run.py [--case pipeline|replicated] [--pairs N] [--steps S] [--check]
       [--json OUT]

Model: the built-in `mlp` (8 blocks of Linear 512x512 + ReLU, MSE loss), float32, SGD, global batch 1024 in 16
microbatches of 64, 4 + 4 blocks on 2 processes (gloo over loopback, one thread each, `train --local 2`). A
microbatch's activation (and its gradient) is 128 KiB. The link is emulated at 0.4 GB/s (0.33 ms per message, a
fraction of a forward), and a periodic trace (`pipeplan trace periodic --period-ms 4000 --duty 0.75 --factor F
--start-ms 1000`) slows every link for 75 % of every 4 s from 1 s on. F is calibrated before the pairs (an
adaptive run of 8 iterations at nominal rate) so that a slowed message takes 2.5 forwards of a microbatch as the
machine runs them then (`--factor` fixes it instead): on a free core a forward takes about 3 ms, F about 0.04 and a
slowed message 8 ms; a loaded machine stretches compute, not the emulated link, and without calibration would hide
every transfer behind compute even under 1F1B. That ratio is where the simulator gives kFkB its largest gain over
1F1B, 20-30 % per slowed iteration at m = 16; the simulator's own run of this benchmark (the controller fed by
simulated events, fixed 1F1B, the trace at F = 0.04, 32 iterations) gives the controller 15-20 % over the run for forwards
of 2 to 8 ms (backwards twice that). Under 1F1B each slowed transfer lands on the critical path; kFkB with k >= 2
hides it behind the other microbatches of its group.

Case `replicated` (issue 35: every plan adapts): the same model on 3 processes, stage 0 replicated on 2 (each
runs half of every microbatch and sends its half to stage 1, on its own emulated link), stage 1 on 1
(`--local 3 --replicas 2,1`); the trace slows both transfer links, not stage 0's all-reduce ring (slowed_links).

Runs alternate A B A B ... (A: `--schedule 1f1b`, B: `--schedule kfkb --k 1 --adaptive`, both under the same
emulated link and trace), so drifts in machine load hit both alike; each run is S iterations, its time the sum of
its steps (pipeline, optimizer, the loss exchange and, for B, the controller). /proc/loadavg is read before and
after every run.

Reported, with the targets of issue 20 (--check exits 1 when one fails):
- T1: the controller's median run time is >= 10 % below 1F1B's (1 - median B / median A >= 0.10);
- T2: k changes when the trace changes: after every slowdown that finds a run at k = 1, k rises within 3
  iterations (also reported: each slowdown's k before and after, and the mean k of the iterations that start
  slowed and at nominal rate; the controller need not come back down at nominal rate, where k >= 2 costs
  nothing but memory);
- T3: the controller's predicted time of each iteration (its T(k) for the k it chose) within 15 % of the measured
  one: the median error over the adaptive runs' iterations (also the share within 15 %, the same over the
  iterations under which the trace did not change, and the simulator in hindsight: each iteration simulated with
  its own measured compute under the true trace).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HIDDEN, BLOCKS, BATCH, MICROBATCHES = 512, 8, 1024, 16
ACTIVATION_BYTES = BATCH // MICROBATCHES * HIDDEN * 4
GB_PER_S = 0.4
PERIOD_MS, DUTY, START_MS = 4000.0, 0.75, 1000.0
SLOWED_FORWARDS = 2.5
"""A slowed message takes this many forwards of a microbatch (calibrated; --factor fixes the factor instead)."""
TARGET_SPEEDUP, TARGET_PREDICTION = 0.10, 0.15
BOOT = "from pipeplan.cli import main; main()"


def write_trace(path: Path, duration_ms: float, factor: float) -> Any:
    """The periodic preemption trace (pipeplan.sim.trace_gen, what `pipeplan trace periodic` writes) on the case's
    transfer links (slowed_links)."""
    from pipeplan.io.bandwidth_trace_json import bandwidth_trace_to_json
    from pipeplan.sim.trace_gen import periodic_trace

    trace = periodic_trace(PERIOD_MS, DUTY, factor, duration_ms, slowed_links(), start_ms=START_MS)
    path.write_text(json.dumps({"format": "pipeplan.bandwidth_trace/1", "steps": bandwidth_trace_to_json(trace)}))
    return trace


CASES = {"pipeline": (2, [], 1), "replicated": (3, ["--replicas", "2,1"], 2)}
"""Each case's processes, its train options beyond the schedule's, and the pieces a microbatch's activation is cut in."""
CASE = "pipeline"
"""The case this run measures (--case)."""


def slowed_links() -> list[tuple[int, int]] | None:
    """The links the trace slows: every link (None) in case `pipeline`; in case `replicated` the pipeline's transfers
    between each stage-0 replica (devices 0, 1) and stage 1 (device 2), not the stage's all-reduce ring 0 <-> 1.

    Note:
        The emulated all-reduce of stage 0's 4 MiB of gradients takes 10.5 ms at 0.4 GB/s; at the factor calibrated
        for a message (~0.01 under load) it takes over 1 s, longer than an iteration's compute, that no k hides.
        Slowed with the transfers it made each slowed iteration ~1.5 s, so the trace's 3 s slowdowns held two
        iterations and its phases changed within almost every iteration: the controller's forecast median error
        was 83 % (1F1B 8.9 % faster; 2026-11-28 04:10-04:18, load 1.7-3.3). The all-reduce under a trace is
        tested in tests/test_runtime_adaptive.py; this case measures k against 1F1B.
    """
    return None if CASE == "pipeline" else [(0, 2), (1, 2), (2, 0), (2, 1)]


def links_option() -> str:
    """slowed_links as `pipeplan trace periodic --links` takes them ("" for every link)."""
    links = slowed_links()
    return "" if links is None else " --links " + ",".join(f"{a}-{b}" for a, b in links)


def probe_link() -> tuple[int, int]:
    """A link the trace slows, whose factor says whether an iteration ran slowed: stage 0's first device to stage 1's."""
    return (0, CASES[CASE][0] - 1)


def piece_bytes() -> float:
    """Bytes of one message (a microbatch's activation, or its share from one replica)."""
    return ACTIVATION_BYTES / CASES[CASE][2]


def command(policy: str, steps: int, trace: Path | None) -> list[str]:
    """The `pipeplan train` command line of one run (no trace: the link at its nominal rate)."""
    schedule = ["--schedule", "1f1b"] if policy == "1f1b" else ["--schedule", "kfkb", "--k", "1", "--adaptive"]
    processes, options, _ = CASES[CASE]
    return ["train", "--local", str(processes), *schedule, *options, "-p", "2", "-m", str(MICROBATCHES),
            "--batch-size", str(BATCH),
            "--opt", f"hidden={HIDDEN}", "--opt", f"blocks={BLOCKS}", "--dataset", "sample", "--optimizer", "sgd",
            "--lr", "1e-3", "--steps", str(steps), "--emulate-gb-per-s", str(GB_PER_S), "--no-predict", "--json",
            *(["--bandwidth-trace", str(trace)] if trace is not None else [])]  # fmt: skip


def calibrated_factor(steps: int = 8) -> tuple[float, float]:
    """(factor, forward ms): the trace's factor that makes a slowed message take SLOWED_FORWARDS forwards of a
    microbatch as this machine runs them now (the median over an adaptive run at nominal rate, warm-up left out)."""
    out = run("adaptive", steps, None)
    forward = statistics.median(statistics.fmean(f) for f in out["adaptive"]["stage_fwd_ms"][1:])
    nominal_ms = piece_bytes() / (GB_PER_S * 1e9) * 1000.0
    return min(0.5, nominal_ms / (SLOWED_FORWARDS * forward)), forward


def loadavg() -> float:
    """The 1-minute load average."""
    return float(Path("/proc/loadavg").read_text().split()[0])


def run(policy: str, steps: int, trace: Path | None) -> dict[str, Any]:
    """One run: its JSON report, with the load before and after."""
    before = loadavg()
    done = subprocess.run([sys.executable, "-c", BOOT, *command(policy, steps, trace)], capture_output=True, text=True,
                          timeout=600, env=dict(os.environ))  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"{policy} run failed: {done.stderr.strip().splitlines()[-1:]}")
    out = json.loads(done.stdout)
    out |= {"policy": policy, "total_ms": sum(out["step_ms"]), "load": (before, loadavg())}
    return out


def prediction_errors(runs: list[dict[str, Any]], trace: Any) -> tuple[list[float], list[float]]:
    """|predicted / measured - 1| of every adaptive iteration with a prediction, and of those whose start and the
    previous iteration's saw the same factor as its end (the trace did not change under it)."""
    every, steady = [], []
    for out in runs:
        a = out["adaptive"]
        for i, (pred, meas, start) in enumerate(zip(a["predicted_ms"], a["iteration_ms"], a["start_ms"], strict=True)):
            if pred is None:
                continue
            error = abs(pred / meas - 1)
            every.append(error)
            since = a["start_ms"][i - 1] if i > 0 else start
            if len({trace.factor_at(probe_link(), t) for t in (since, start, start + meas)}) == 1:
                steady.append(error)
    return every, steady


def hindsight_errors(runs: list[dict[str, Any]], trace: Any) -> list[float]:
    """|simulated / measured - 1| of every adaptive iteration after the warm-up, simulated with the k it ran, its
    own measured stage compute and optimizer steps, and the trace's true factors from its start: how closely the
    simulator follows the emulated network, apart from the controller's forecast of compute and bandwidth."""
    from pipeplan.adapt import PipelineModel
    from pipeplan.schedules.kfkb import kfkb
    from pipeplan.sim.engine.simulator import simulate

    errors = []
    for out in runs:
        a = out["adaptive"]
        for i in range(1, len(a["k"])):
            model = PipelineModel.from_measurements(
                fwd_ms=a["stage_fwd_ms"][i], bwd_ms=a["stage_bwd_ms"][i], boundary_bytes=[piece_bytes()],
                boundary_links=[probe_link()], bandwidth_gb_per_s=[GB_PER_S], static_bytes=[0, 0], activation_bytes=[0, 0],
                memory_limit_bytes=[1e12, 1e12], microbatches=MICROBATCHES, optimizer_ms=stage_optimizer_ms(out, i),
            )  # fmt: skip
            schedule = kfkb(2, MICROBATCHES, a["k"][i])
            simulated = simulate(schedule, model.costs, trace, record=False, offset_ms=a["start_ms"][i]).iteration_time
            errors.append(abs(simulated / a["iteration_ms"][i] - 1))
    return errors


def stage_optimizer_ms(out: dict[str, Any], i: int) -> list[float]:
    """Iteration i's optimizer step per stage: its slowest process's (stage 0 is every process but the last)."""
    per_process = out["optimizer_ms_by_process"][i]
    return [max(per_process[:-1]), per_process[-1]]


def k_by_phase(out: dict[str, Any], trace: Any) -> dict[str, list[int]]:
    """The k of each iteration of an adaptive run, by the trace's factor at its start (slowed or nominal)."""
    phases: dict[str, list[int]] = {"slowed": [], "nominal": []}
    for k, start in zip(out["adaptive"]["k"], out["adaptive"]["start_ms"], strict=True):
        phases["slowed" if trace.factor_at(probe_link(), start) < 1 else "nominal"].append(k)
    return phases


def steps_by_phase(out: dict[str, Any], trace: Any) -> dict[str, list[float]]:
    """Each step's time, by the trace's factor at its start (slowed or nominal); steps start back to back from 0."""
    phases: dict[str, list[float]] = {"slowed": [], "nominal": []}
    start = 0.0
    for ms in out["step_ms"]:
        phases["slowed" if trace.factor_at(probe_link(), start) < 1 else "nominal"].append(ms)
        start += ms
    return phases


def response_to_slowdowns(out: dict[str, Any], trace: Any) -> list[tuple[int, int]]:
    """For each slowdown the run saw: (k of the last iteration before it, largest k of the 3 iterations after it
    began), the first iteration after it being the first observed slowed (the controller decides from it)."""
    a = out["adaptive"]
    slowed = [trace.factor_at(probe_link(), t) < 1 for t in a["start_ms"]]
    return [(a["k"][i - 1], max(a["k"][i + 1 : i + 4])) for i in range(1, len(slowed) - 3) if slowed[i] and not slowed[i - 1]]


def main() -> None:
    """Run the pairs, print the table and the targets; --check exits 1 when a target fails."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=sorted(CASES), default="pipeline", help="the job (see the docstring)")
    parser.add_argument("--pairs", type=int, default=3, help="A B pairs (runs alternate A B A B ...)")
    parser.add_argument("--steps", type=int, default=48, help="iterations per run")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target fails")
    parser.add_argument("--json", help="write every run's report here")
    parser.add_argument("--factor", type=float, help="the slowed links' factor (default: calibrated, see the docstring)")
    args = parser.parse_args()
    global CASE
    CASE = args.case
    work = Path(tempfile.mkdtemp(prefix="adaptive-run-"))
    trace_path = work / "trace.json"
    if args.factor is None:
        factor, forward = calibrated_factor()
        print(f"calibration: a forward of {forward:.2f} ms per microbatch -> factor {factor:.4f} (a slowed message "
              f"{piece_bytes() / (GB_PER_S * 1e6 * factor):.1f} ms)", flush=True)  # fmt: skip
    else:
        factor = args.factor
    trace = write_trace(trace_path, 600_000.0, factor)
    runs: list[dict[str, Any]] = []
    for pair in range(args.pairs):
        for policy in ("1f1b", "adaptive"):
            out = run(policy, args.steps, trace_path)
            runs.append(out)
            ks = out["adaptive"]["k"] if "adaptive" in out else None
            print(f"pair {pair + 1} {policy:8s} {out['total_ms']:8.0f} ms  load {out['load'][0]:.2f} -> {out['load'][1]:.2f}"
                  + (f"  k {ks}" if ks else ""), flush=True)  # fmt: skip
    fixed = [r["total_ms"] for r in runs if r["policy"] == "1f1b"]
    adaptive = [r for r in runs if r["policy"] == "adaptive"]
    speedup = 1 - statistics.median(r["total_ms"] for r in adaptive) / statistics.median(fixed)
    paired = [1 - b["total_ms"] / a for a, b in zip(fixed, adaptive, strict=True)]
    every, steady = prediction_errors(adaptive, trace)
    hindsight = hindsight_errors(adaptive, trace)
    responses = [response_to_slowdowns(r, trace) for r in adaptive]
    phases = [k_by_phase(r, trace) for r in adaptive]
    slowed_k = [k for p in phases for k in p["slowed"]]
    nominal_k = [k for p in phases for k in p["nominal"]]
    decision_ms = [d["decision_ms"] for r in adaptive for d in r["adaptive"]["decisions"]]
    share = sum(decision_ms) / sum(sum(r["adaptive"]["iteration_ms"]) for r in adaptive)
    median_adaptive = statistics.median(r["total_ms"] for r in adaptive)
    print(f"\nmedian run: 1F1B {statistics.median(fixed):.0f} ms, adaptive {median_adaptive:.0f} ms: "
          f"the controller {speedup:.1%} faster (target >= {TARGET_SPEEDUP:.0%}); per pair "
          f"{[f'{x:.1%}' for x in paired]}")  # fmt: skip
    first = {p: [round(r["step_ms"][0]) for r in runs if r["policy"] == p] for p in ("1f1b", "adaptive")}
    setup = [round(r["adaptive"].get("setup_ms", 0.0), 1) for r in adaptive]
    print(
        f"first step: 1F1B {first['1f1b']} ms, adaptive {first['adaptive']} ms (controller set-up, outside the "
        f"step: {setup} ms); load average {min(r['load'][0] for r in runs):.2f}-{max(r['load'][1] for r in runs):.2f}"
    )
    mean_k = [(statistics.fmean(p["slowed"]), statistics.fmean(p["nominal"])) for p in phases]
    for phase in ("slowed", "nominal"):
        medians = {p: [statistics.median(steps_by_phase(r, trace)[phase]) for r in runs if r["policy"] == p]
                   for p in ("1f1b", "adaptive")}  # fmt: skip
        wins = sum(b < a for a, b in zip(medians["1f1b"], medians["adaptive"], strict=True))
        print(
            f"median step while {phase}: 1F1B {[round(x) for x in medians['1f1b']]} ms, adaptive "
            f"{[round(x) for x in medians['adaptive']]} ms (the controller faster in {wins} of {len(fixed)} pairs)"
        )
    print(f"k of the iterations that start slowed: {_count(slowed_k)}; at nominal rate: {_count(nominal_k)}; mean k "
          f"(slowed, nominal) per run: {[(round(s, 2), round(n, 2)) for s, n in mean_k]}; each slowdown's k before -> "
          f"largest k within 3 iterations: {responses}")  # fmt: skip
    print(f"predicted vs measured iteration: median error {statistics.median(every):.1%}, {_within(every):.0%} within 15 % "
          f"({len(every)} iterations); where the trace did not change: median {statistics.median(steady):.1%}, "
          f"{_within(steady):.0%} within 15 % ({len(steady)})")  # fmt: skip
    print(
        f"simulated in hindsight (each iteration's own compute, the true trace): median error "
        f"{statistics.median(hindsight):.1%}, {_within(hindsight):.0%} within 15 % ({len(hindsight)} iterations)"
    )
    print(f"controller: {statistics.median(decision_ms):.2f} ms per decision (median), max {max(decision_ms):.2f} ms, "
          f"{share:.2%} of the iterations' time")  # fmt: skip
    print(f"trace: pipeplan trace periodic --period-ms {PERIOD_MS:g} --duty {DUTY:g} --factor {factor:.4f} --start-ms "
          f"{START_MS:g} --duration-ms 600000{links_option()} --out trace.json")  # fmt: skip
    print("command of each run: pipeplan " + " ".join(command("adaptive", args.steps, Path("trace.json"))))
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1))
    ok = (
        speedup >= TARGET_SPEEDUP
        and all(after > before for run in responses for before, after in run if before == 1)
        and statistics.median(every) <= TARGET_PREDICTION
    )
    if args.check and not ok:
        raise SystemExit(1)


def _count(values: list[int]) -> dict[int, int]:
    return {v: values.count(v) for v in sorted(set(values))}


def _within(errors: list[float]) -> float:
    return sum(e <= TARGET_PREDICTION for e in errors) / len(errors) if errors else 0.0


if __name__ == "__main__":
    main()
