"""Policies run under a bandwidth trace in the simulator: a fixed k, the controller, and the offline oracle."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pipeplan.adapt.controller import AdaptiveController, Decision
from pipeplan.adapt.observation import Collective, IterationObservation, Transfer
from pipeplan.adapt.pipeline import PipelineModel
from pipeplan.core.hardware.bandwidth_trace import BandwidthTrace
from pipeplan.core.schedule import Schedule
from pipeplan.sim.engine.iterations import IterationRun, Reuse, allreduce_durations, peak_bytes, simulate_iterations
from pipeplan.sim.engine.program import Program, compile_schedule
from pipeplan.sim.engine.simulator import simulate
from pipeplan.sim.result import SimResult


@dataclass(frozen=True, slots=True)
class PolicyRun(IterationRun):
    """One policy's run: the simulator's IterationRun (per-iteration start on the trace clock, time, peak memory),
    labelled with the policy's name and the k of each iteration; switches counted."""

    name: str
    k: tuple[int, ...]

    @property
    def switches(self) -> int:
        """How often k changed between consecutive iterations."""
        return sum(a != b for a, b in zip(self.k, self.k[1:], strict=False))

    def to_json(self) -> dict[str, Any]:
        """IterationRun's {"total_ms", "start_ms", "iteration_ms", "peak_bytes"} with "k" and "switches"."""
        return {**IterationRun.to_json(self), "k": list(self.k), "switches": self.switches}


def run_fixed(
    name: str, k: int, schedule: Schedule, pipeline: PipelineModel, trace: BandwidthTrace | None, iterations: int
) -> PolicyRun:
    """`iterations` iterations of one schedule (sim.engine.iterations.simulate_iterations), labelled with its k."""
    run = simulate_iterations(schedule, pipeline.costs, trace, iterations)
    return PolicyRun(run.start_ms, run.iteration_ms, run.peak_bytes, name, (k,) * iterations, allreduce_ms=run.allreduce_ms)


def observe_result(pipeline: PipelineModel, result: SimResult, index: int, k: int, start_ms: float) -> IterationObservation:
    """What the simulated iteration shows a controller: per-stage mean F and B, every transfer on its links and
    every stage's data-parallel all-reduce (a Collective of each SimResult.collectives span).

    Each flow's own wire time: the FlowSpans where the transfer queue timed
    flows one by one (several pairs, a NIC, a traced link), else the transfer
    span of the boundary's one flow. Times are moved onto the trace's clock.
    """
    p = pipeline.num_stages
    sums = [[0.0, 0, 0.0, 0] for _ in range(p)]
    for span in result.compute:
        row = sums[span.stage]
        if span.op == "F":
            row[0] += span.end_ms - span.start_ms
            row[1] += 1
        elif span.op == "B":
            row[2] += span.end_ms - span.start_ms
            row[3] += 1
    fwd = tuple(r[0] / r[1] if r[1] else c.fwd_ms for r, c in zip(sums, pipeline.costs.stages, strict=True))
    bwd = tuple(r[2] / r[3] if r[3] else c.bwd_ms for r, c in zip(sums, pipeline.costs.stages, strict=True))
    costs = pipeline.costs
    link_bytes = pipeline.link_bytes
    transfers = [Transfer(f.link, link_bytes[f.link], start_ms + f.start_ms, start_ms + f.end_ms) for f in result.flows]
    logged = {(f.kind, f.boundary) for f in result.flows}
    for span in result.transfers:
        boundary = span.src_stage if span.kind == "act" else span.dst_stage
        if (span.kind, boundary) in logged:
            continue
        flows = costs.forward[boundary] if span.kind == "act" else costs.backward[boundary]
        link = flows[0].link
        transfers.append(Transfer(link, link_bytes[link], start_ms + span.start_ms, start_ms + span.end_ms))
    collectives = tuple(Collective(c.stage, start_ms + c.start_ms, start_ms + c.end_ms) for c in result.collectives)
    return IterationObservation(index, k, result.iteration_time, fwd, bwd, tuple(transfers), start_ms, collectives)


@dataclass
class ControllerRun:
    """The controller's policy run, its decisions, and what each decision (reading the iteration's measurements
    and choosing the next k) took: wall time and this process's CPU time, in ms."""

    run: PolicyRun
    decisions: list[Decision]
    decision_ms: list[float]
    decision_cpu_ms: list[float]


def run_controller(
    controller: AdaptiveController,
    trace: BandwidthTrace | None,
    iterations: int,
    truth: PipelineModel | None = None,
    distort: Callable[[IterationObservation], IterationObservation] | None = None,
) -> ControllerRun:
    """Run the controller's k in the simulator under the true trace, feeding it each iteration's events.

    A change of k delays the next iteration by the controller's switch_ms.
    `truth` (default: the controller's own model) is the pipeline the
    simulator runs and measures, so a controller can be run with a wrong model
    of it; `distort` maps each observation before the controller reads it
    (measurement noise). Each decision sees only iterations that have ended.
    """
    pipeline = truth if truth is not None else controller.pipeline
    programs: dict[int, Program] = {}
    switch_ms = controller.config.switch_ms
    ks: list[int] = []
    starts: list[float] = []
    times: list[float] = []
    peaks: list[float] = []
    allreduce: list[tuple[float, ...]] = []
    spent: list[float] = []
    cpu: list[float] = []
    t = 0.0
    k = controller.k
    for i in range(iterations):
        schedule = controller.predictor.schedules[k]
        program = programs.setdefault(k, compile_schedule(schedule))
        result = simulate(schedule, pipeline.costs, trace, record=True, offset_ms=t, program=program)
        ks.append(k)
        starts.append(t)
        times.append(result.iteration_time)
        peaks.append(peak_bytes(result))
        allreduce.append(allreduce_durations(result, pipeline.num_stages))
        t += result.iteration_time
        if i + 1 < iterations:
            observation = observe_result(pipeline, result, i, k, starts[-1])
            if distort is not None:
                observation = distort(observation)
            started, started_cpu = time.perf_counter(), time.process_time()
            decision = controller.step(observation)
            spent.append((time.perf_counter() - started) * 1000.0)
            cpu.append((time.process_time() - started_cpu) * 1000.0)
            if decision.k != k:
                t += switch_ms
            k = decision.k
    run = PolicyRun(tuple(starts), tuple(times), tuple(peaks), "adaptive", tuple(ks), allreduce_ms=tuple(allreduce))
    return ControllerRun(run, list(controller.decisions), spent, cpu)


def run_oracle(
    schedules: Mapping[int, Schedule], pipeline: PipelineModel, trace: BandwidthTrace | None, iterations: int, switch_ms: float
) -> PolicyRun:
    """The best k sequence with the future known: dynamic programming over (iteration, k), switch cost counted.

    State (i, k): the earliest time iteration i can end when it runs with k.
    Iteration i + 1 with k' starts at the earliest of ending (i, k') or any
    (i, k) plus switch_ms. Keeping only the earliest end per state is exact
    because an iteration that starts later never ends earlier (every
    transfer's end is non-decreasing in its start under a trace, and compute
    adds fixed times): so one simulation per (i, k') suffices.
    """
    programs = {k: compile_schedule(s) for k, s in schedules.items()}
    ks = list(schedules)
    starts: dict[tuple[int, int], float] = {}
    durations: dict[tuple[int, int], float] = {}
    peaks: dict[tuple[int, int], float] = {}
    allreduce: dict[tuple[int, int], tuple[float, ...]] = {}
    came: dict[tuple[int, int], int] = {}
    first = Reuse(pipeline.costs, trace)
    reuse = {k: first.fresh() for k in ks}
    for i in range(iterations):
        for k2 in ks:
            if i == 0:
                starts[(0, k2)] = 0.0
                continue
            ends = [(starts[(i - 1, k)] + durations[(i - 1, k)] + (switch_ms if k != k2 else 0.0), k != k2, k) for k in ks]
            best = min(ends)
            starts[(i, k2)], came[(i, k2)] = best[0], best[2]
        for k in ks:
            offset = starts[(i, k)]
            known = reuse[k].known(offset)
            if known is None:
                result = simulate(schedules[k], pipeline.costs, trace, record=False, offset_ms=offset, program=programs[k])
                known = reuse[k].keep(offset, result)
            durations[(i, k)], peaks[(i, k)], allreduce[(i, k)] = known
    last = iterations - 1
    k = min(ks, key=lambda x: (starts[(last, x)] + durations[(last, x)], x))
    chosen = [k]
    for i in range(last, 0, -1):
        k = came[(i, k)]
        chosen.append(k)
    chosen.reverse()
    pairs = list(enumerate(chosen))
    return PolicyRun(
        tuple(starts[p] for p in pairs),
        tuple(durations[p] for p in pairs),
        tuple(peaks[p] for p in pairs),
        "oracle",
        tuple(chosen),
        allreduce_ms=tuple(allreduce[p] for p in pairs),
    )
