"""Adaptive k on the real transport (Ada-Grouper): after each iteration every process shares what it measured, the
controller (pipeplan.adapt) chooses the next iteration's k, and every process switches to it at that boundary.

Note:
    The controller's pipeline (runtime.measurement.controller_pipeline) is the runtime's: one pipeline whose stage
    s runs at its slowest replica (in any pipeline copy) and whose boundaries move the runtime's pieces between
    process pairs, on the job's device links. With a plan, its profile and cluster (`cost_model`), it is built
    before the first step from the plan's costs, and the measured stage times calibrate its compute (the
    controller's ComputeEstimator). Without them, the first iteration (warm-up) measures what it is built from:
    each stage's forward and backward per microbatch, optimizer step, static bytes and saved bytes per in-flight
    microbatch, and the bytes each piece moves; that build is this loop's cost, not the step's. The links'
    nominal rates are the emulated ones, or on the real network a ping-pong between processes 0 and 1
    (runtime.measurement.prediction.measure_link). The warm-up's compute (first-touch allocations, channel set-up) is not fed to
    the controller, its transfers are. Each process's numbers travel in the all-reduce that already sums the loss
    (each in its own slot), so every process holds the same numbers and runs the same controller: the same
    observations give the same decisions (pipeplan.adapt), without an extra collective. Each process also reports
    the k it ran, so a disagreement is an error, never a silent divergence.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

import torch

from pipeplan.adapt import AdaptiveController, ControllerConfig, Decision, Link, PipelineModel
from pipeplan.adapt.predict import fitting_ks
from pipeplan.core.plan import Plan
from pipeplan.core.schedule import Schedule
from pipeplan.core.units import s_to_ms
from pipeplan.runtime.execution.executor import Executor, StepRecord
from pipeplan.runtime.execution.memory_meter import SavedMemoryMeter
from pipeplan.runtime.measurement import observations
from pipeplan.runtime.measurement.controller_pipeline import RingTime, measured_pipeline, plan_pipeline
from pipeplan.runtime.options import check_adaptable
from pipeplan.runtime.placement import Topology
from pipeplan.runtime.rank_errors import RuntimeFault
from pipeplan.runtime.transport.link_emulation import Wire
from pipeplan.schedules.registry import make_schedule
from pipeplan.sim.cost.model import CostModel

COMPUTE_HALF_LIFE = 4.0
"""Iterations at which a measured stage time weighs half in the runtime controller's compute estimate.

Note:
    The controller's default (ControllerConfig.short_half_life, 0.5) trusts the last iteration's stage times: in the
    simulator they are exact. Measured ones carry noise that does not persist to the next iteration (another
    process taking the core, the allocator); following them predicts last iteration's noise. On a 2-core machine
    at load 2 (benchmarks/adaptive_run.py's 1F1B/adaptive pair, BENCHMARKS.md) the median forecast error of the
    simulated iteration with the true trace and the compute estimate at half-life 0.5 / 1 / 2 / 4 / 8 was
    22.5 / 18.4 / 13.8 / 12.7 / 11.2 %, and 7 % with each iteration's own compute (the noise no forecast has);
    at load 5-12 (5 pairs) 11.4 / 10.7 / 11.5 / 12.3 / 11.9 %, against 3.9 %. 4 is never far from the best and
    keeps a real change of compute (a k whose groups run otherwise) followed within a few iterations.
"""


def memory_per_process() -> float:
    """This host's physical memory shared by the job's processes on it (the limit k must fit without a cluster)."""
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return float(total) / max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


class AdaptiveK:
    """The adaptive loop on one process: its slot of the shared all-reduce, the controller, the topology of each k.

    Args:
        plan, schedule: the job as it starts (kfkb at the starting k).
        executor: this process's executor (switched with `Executor.use`).
        origin_s: the run's start on perf_counter (the clock of the observations and of a bandwidth trace).
        wire: the emulated network, or None (the real one; its rate measured once, collectively, here).
        memory_limit_bytes: what each process's stage (weights, state and its in-flight microbatches) must fit in
            at every candidate k (None: the plan's devices' memory with `cost_model`, else this host's memory per
            process).
        cost_model: the plan's profile and cluster: the controller is built here, before the first step, from the
            plan's costs (None: from the warm-up iteration's measurements).

    Raises:
        TrainConfigError: the job's schedule has no k to adapt (runtime.options.check_adaptable).
        AdaptError, PlanError: the plan does not match `cost_model`, or no k fits the memory limit.
    """

    def __init__(
        self,
        plan: Plan,
        schedule: Schedule,
        executor: Executor,
        origin_s: float,
        wire: Wire | None,
        memory_limit_bytes: float | None = None,
        cost_model: CostModel | None = None,
    ) -> None:
        check_adaptable(schedule.name, plan.chunks)
        self.plan = plan
        self.executor = executor
        self.origin_s = origin_s
        self.wire = wire
        self.k = plan.k
        self._topologies = {plan.k: executor.topology}
        self.devices = executor.topology.devices
        self.memory_limit_bytes = memory_limit_bytes
        self.slot = observations.slot_size(plan.microbatches)
        self.size = self.slot * len(self.devices)
        """Values this loop adds to the all-reduce: one slot per process."""
        self.link: tuple[float, float] | None = None
        if wire is None:
            from pipeplan.runtime.measurement.prediction import measure_link

            self.link = measure_link(executor.device)  # (latency ms, bytes/s), the same on every process
        self.controller: AdaptiveController | None = None
        self.k_used: list[int] = []
        self.start_ms: list[float] = []
        self.iteration_ms: list[float] = []
        self.stage_ms: list[tuple[tuple[float, ...], tuple[float, ...]]] = []
        self.predicted_ms: list[float | None] = []
        self.overhead_ms: list[float] = []
        self.setup_ms = 0.0
        """What building the controller cost (before the first step with a plan, else after the warm-up)."""
        self._next_prediction: float | None = None
        self._from_warmup = cost_model is None
        self.k_dropped: tuple[int, ...] = ()
        """The plan's adaptive k_choices that the controller's pipeline finds over memory (left out; see _config)."""
        if cost_model is not None:
            began = time.perf_counter()
            pipeline = plan_pipeline(plan, executor.topology, cost_model, self._rates(), memory_limit_bytes, self._ring_time())
            self.controller = AdaptiveController(pipeline, self._config(pipeline))
            self._next_prediction = self.controller.decisions[-1].predicted_ms.get(self.k)
            self.setup_ms = s_to_ms(time.perf_counter() - began)

    def pack(
        self,
        shared: torch.Tensor,
        record: StepRecord,
        times_s: tuple[float, float],
        optimizer_ms: float,
        static_bytes: int,
        meter: SavedMemoryMeter | None,
    ) -> None:
        """Write what this process measured in the iteration into its slot of `shared` (`size` values that the
        caller's all-reduce sums; zeros elsewhere).

        Args:
            record: what the executor recorded (spans and transfers).
            times_s: the iteration's start and the end of its optimizer step (perf_counter s).
            optimizer_ms: this process's optimizer step.
            static_bytes: this process's weights, gradients and optimizer state (measured in the first iteration).
            meter: the saved-bytes meter of the iteration, when it ran with one (the first).
        """
        stage = self.executor.role.stages[0]
        peak = dict(record.stage_peaks).get(stage, 0)
        activation = meter.peak_bytes / peak if meter is not None and peak else 0.0
        limit = self.memory_limit_bytes if self.memory_limit_bytes is not None else memory_per_process()
        values = observations.pack(record, self.origin_s, self.k, stage, times_s, optimizer_ms, static_bytes, activation,
                                   limit)  # fmt: skip
        lo = self.executor.role.process * self.slot
        shared[lo : lo + len(values)] = torch.tensor(values, dtype=torch.float64)

    def after_step(self, index: int, shared: torch.Tensor) -> float:
        """Observe iteration `index` from every process's slot (0: the warm-up), decide the next k (the same on every
        process) and switch to it.

        Returns:
            The ms this call spent building the controller (the warm-up's build without a plan; else 0): the
            loop's set-up, which the caller leaves out of the step's time.

        Raises:
            RuntimeFault: the processes ran the iteration with different k.
        """
        began = time.perf_counter()
        values = shared.tolist()
        parts = [observations.unpack(values[q * self.slot : (q + 1) * self.slot]) for q in range(len(self.devices))]
        if any(p["k"] != self.k for p in parts):
            raise RuntimeFault(f"iteration {index}: the processes ran with k {[p['k'] for p in parts]}, not all {self.k}")
        seen = observations.observation(index, self.k, parts, self.devices, self.wire is not None)
        self.k_used.append(self.k)
        self.start_ms.append(seen.start_ms)
        self.iteration_ms.append(seen.iteration_ms)
        self.stage_ms.append((seen.stage_fwd_ms, seen.stage_bwd_ms))
        self.predicted_ms.append(self._next_prediction)
        built = 0.0
        if self.controller is None:
            self.controller = self._build(parts)
            decision = self.controller.decisions[-1]
            built = self.setup_ms = s_to_ms(time.perf_counter() - began)
        else:
            if index == 0:  # the warm-up's compute is first-touch work: its transfers only
                seen = dataclasses.replace(seen, stage_fwd_ms=(), stage_bwd_ms=())
            decision = self.controller.step(seen)
        self._next_prediction = decision.predicted_ms.get(decision.k)
        if decision.k != self.k:
            self.executor.use(self._topology(decision.k))
            self.k = decision.k
        self.overhead_ms.append(s_to_ms(time.perf_counter() - began))
        return built

    def _topology(self, k: int) -> Topology:
        topology = self._topologies.get(k)
        if topology is None:
            plan = dataclasses.replace(self.plan, k=k)
            schedule = make_schedule("kfkb", len(plan.stages), plan.microbatches, k=k)
            topology = self._topologies[k] = Topology(plan, schedule, len(self.devices))
        return topology

    def _rates(self) -> dict[Link, tuple[float, float]]:
        """Each link's nominal (bytes/s, latency ms): the emulated ones, else the measured link on every pair."""
        if self.wire is not None:
            return {link: (r.bytes_per_s, r.latency_ms) for link, r in self.wire.links.rates.items()}
        assert self.link is not None
        latency_ms, per_s = self.link
        return {(a, b): (per_s, latency_ms) for a in self.devices for b in self.devices if a != b}

    def _ring_time(self) -> RingTime | None:
        """A ring all-reduce's nominal time on the emulated wire (None on the real network)."""
        return None if self.wire is None else self.wire.links.ring_parts

    def _build(self, parts: list[dict[str, Any]]) -> AdaptiveController:
        """The controller of this job from the warm-up iteration's measurements (every process's slot)."""
        by_stage: dict[int, list[dict[str, Any]]] = {}
        link_bytes: dict[Link, float] = {}
        for part in parts:
            by_stage.setdefault(part["stage"], []).append(part)
            for key, nbytes, *_ in part["received"]:
                link_bytes[(self.devices[key[3]], self.devices[key[4]])] = nbytes
        pipeline = measured_pipeline(self.executor.topology, by_stage, link_bytes, self._rates(),
                                     self.memory_limit_bytes, self._ring_time())  # fmt: skip
        return AdaptiveController(pipeline, self._config(pipeline))

    def _config(self, pipeline: PipelineModel) -> ControllerConfig:
        """The controller's constants in the runtime: the starting k, measured compute smoothed (COMPUTE_HALF_LIFE),
        and the candidates: the plan's adaptive k_choices (every k that fits without an adaptive block).

        Note:
            A k_choice that `pipeline` (the runtime's: the warm-up's measurements or the plan's costs, at this run's
            memory limit) finds over memory is dropped, with a note in the report (`k_dropped`), not refused: the
            runtime's pipeline exists only in the started processes (a refusal belongs before any start, and
            `train` already refuses there a budget below 1F1B's peak under the plan's profile and cluster), and
            the plan's own model chose k_choices within its budget. If the starting k is dropped the run moves to
            the smallest fitting k_choice after the first iteration; if none fits, every k that fits is a candidate.
        """
        setting = self.plan.adaptive
        if setting is None:
            return ControllerConfig(initial_k=self.k, short_half_life=COMPUTE_HALF_LIFE)
        fitting, _ = fitting_ks(pipeline)
        choices = tuple(k for k in setting.k_choices if k in fitting) or tuple(fitting)
        self.k_dropped = tuple(k for k in setting.k_choices if k not in fitting)
        start = self.k if self.k in choices else choices[0]
        return ControllerConfig(initial_k=start, short_half_life=COMPUTE_HALF_LIFE, k_choices=choices)

    @property
    def decisions(self) -> list[Decision]:
        """Every decision so far."""
        return [] if self.controller is None else self.controller.decisions

    def report(self) -> dict[str, Any]:
        """What `train --json` adds under "adaptive": per iteration its k, start (ms on the run's clock, a bandwidth
        trace's), measured and predicted ms, each stage's mean forward and backward per microbatch (its slowest
        replica's) and this loop's own cost; what building the controller cost (`setup_ms`) and from what
        (`built_from`: "plan", before the first step, or "warm-up"); the candidates (`k_choices`) and the plan's
        k_choices left out as over memory (`k_dropped`); every decision."""
        return {
            "setup_ms": self.setup_ms,
            "built_from": "warm-up" if self._from_warmup else "plan",
            "k_choices": [] if self.controller is None else list(self.controller.k_choices),
            "k_dropped": list(self.k_dropped),
            "k": self.k_used,
            "start_ms": self.start_ms,
            "iteration_ms": self.iteration_ms,
            "stage_fwd_ms": [list(fwd) for fwd, _ in self.stage_ms],
            "stage_bwd_ms": [list(bwd) for _, bwd in self.stage_ms],
            "predicted_ms": self.predicted_ms,
            "overhead_ms": self.overhead_ms,
            "decisions": [d.to_json(timing=True) for d in self.decisions],
        }
