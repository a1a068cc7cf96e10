"""Asynchronous pipeline training (PipeMare, SEEDS.md §4): each stage steps as soon as its minibatch's gradients are
complete, with no flush and one copy of the weights.

How one copy of the weights can serve forwards and backwards that are steps
apart: a stage's optimizer updates the weights through `.data` aliases of its
parameters. Autograd's graph of a microbatch forwarded before the update
keeps the same storage, and its backward then runs on the current weights
(the delayed-gradient semantics of PipeMare) instead of failing on an
in-place change. Nothing is stashed.

The three techniques, each a switch (all off: naive asynchronous training):
- learning-rate rescheduling (`lr_reschedule` K): stage i's step k uses
  α_k / τ_i^{p_k}, p_k = 1 - min(k / K, 1), τ_i counted at least 1; k counts
  the asynchronous steps (after any synchronous warm-up), α_k is the run's
  base rate at its step (constant, or annealed by `--lr-schedule`);
- discrepancy correction (`discrepancy_decay` D): a per-stage velocity
  δ ← γ δ + (1 - γ)(w_new - w_old), γ = D^(1/τ_i), and every backward runs on
  ŵ = w - τ_i δ (the weights extrapolated back to the forward's version);
  stages with τ_i = 0 need none;
- synchronous warm-up (`sync_warmup` W): the first W minibatches run as
  flushed 1F1B (the schedule's own order), then the stream starts.

Beyond the paper, weight prediction (`weight_prediction`, SpecTrain's idea,
exclusive with the correction): every forward of a stage with τ_i > 0 runs
on w + τ_i δ, δ the stage's last step's change (the velocity with γ = 0),
the weights its backward is expected to meet, so the gradient is taken
near the weights it updates (the staleness itself, which rescheduling and
correction leave; BENCHMARKS.md, PipeMare C6).

τ_i is the delay the schedule's order gives stage i (sim.delays); the run
also measures every microbatch's delay (the weight versions its forward and
backward ran on) and reports the largest per stage.

Randomness: a walk's rows are several steps' global batches (row r is sample
r mod B of step r div B, counted from the walk's first step), and each
layer call is seeded from that step and sample (models.layer_rng), so every
layer draws the numbers a synchronous run draws for the same samples. The
losses still depend on the plan: the delays τ_i come from the split and the
schedule (with every step synchronous they are 1F1B's).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import time
from collections.abc import Callable, Iterator, Sequence

import torch
import torch.distributed as dist
from torch import nn

from pipeplan.core.units import s_to_ms
from pipeplan.models.build import Model
from pipeplan.models.zoo.datasets import batch_indices
from pipeplan.runtime.execution.evaluate import evaluation
from pipeplan.runtime.execution.executor import Executor
from pipeplan.runtime.execution.optim import RateSchedule, make_optimizer, set_rate, warm_up
from pipeplan.runtime.execution.shared_grads import check_asynchronous_sharing
from pipeplan.runtime.options import AsyncSettings, check_async_settings
from pipeplan.runtime.placement import Topology
from pipeplan.runtime.training.train_config import StepCallback, TrainConfig, TrainReport
from pipeplan.runtime.transport.exchange import gather_json
from pipeplan.sim.delays import stage_delays


class StageUpdater:
    """One stage's optimizer under PipeMare: its step, rescheduled learning rate and discrepancy correction."""

    def __init__(
        self,
        params: Sequence[nn.Parameter],
        make_optimizer: Callable[[list[torch.Tensor], float], torch.optim.Optimizer],
        lr: float,
        tau: int,
        settings: AsyncSettings,
        rates: RateSchedule | None = None,
    ) -> None:
        self.params = list(params)
        self.aliases = [p.data for p in self.params]  # updates through these do not invalidate saved graphs
        self.optimizer = make_optimizer(self.aliases, lr) if self.aliases else None
        self.tau = tau
        self.settings = settings
        self.correct = settings.discrepancy_decay is not None and tau > 0 and bool(self.aliases)
        self.predict = settings.weight_prediction and tau > 0 and bool(self.aliases)
        keep = self.correct or self.predict
        self.velocity = [torch.zeros_like(a) for a in self.aliases] if keep else None
        self.gamma = float(settings.discrepancy_decay) ** (1.0 / tau) if self.correct else 0.0  # type: ignore[arg-type]
        self.rates = rates or RateSchedule(lr)
        self.steps = 0
        self.async_steps = 0

    def rate(self, asynchronous: bool) -> float:
        """The learning rate of the next step: α_k, or α_k / τ^{p_k} under rescheduling in the asynchronous phase."""
        base = self.rates.at(self.steps)
        k_max = self.settings.lr_reschedule
        if not asynchronous or k_max is None:
            return base
        power = 1.0 - min(self.async_steps / k_max, 1.0)
        return base / max(self.tau, 1) ** power

    def step(self, asynchronous: bool) -> None:
        """Apply the accumulated gradients (then clear them for the next minibatch) and update the velocity."""
        if self.optimizer is None:
            return
        for alias, p in zip(self.aliases, self.params, strict=True):
            alias.grad = p.grad
        set_rate(self.optimizer, self.rate(asynchronous))
        velocity, gamma = self.velocity, self.gamma
        if velocity is not None:
            for d, w in zip(velocity, self.aliases, strict=True):
                d.mul_(gamma).sub_(w, alpha=1.0 - gamma)  # γ δ - (1 - γ) w_old ...
        self.optimizer.step()
        if velocity is not None:
            for d, w in zip(velocity, self.aliases, strict=True):
                d.add_(w, alpha=1.0 - gamma)  # ... + (1 - γ) w_new
        for alias, p in zip(self.aliases, self.params, strict=True):
            alias.grad = None
            p.grad = None
        self.steps += 1
        if asynchronous:
            self.async_steps += 1

    def corrected(self, asynchronous: bool) -> contextlib.AbstractContextManager[None]:
        """Run the body (a backward) on ŵ = w - τ δ when correcting, then restore w."""
        return self._shifted(-float(self.tau) if asynchronous and self.correct else 0.0)

    def predicted(self, asynchronous: bool) -> contextlib.AbstractContextManager[None]:
        """Run the body (a forward) on w + τ δ when predicting, then restore w."""
        return self._shifted(float(self.tau) if asynchronous and self.predict else 0.0)

    @contextlib.contextmanager
    def _shifted(self, by: float) -> Iterator[None]:
        """The body on w + by δ (through the aliases: graphs stay usable), then w again."""
        velocity = self.velocity
        if velocity is None or by == 0.0:
            yield
            return
        for d, w in zip(velocity, self.aliases, strict=True):
            w.add_(d, alpha=by)
        try:
            yield
        finally:
            for d, w in zip(velocity, self.aliases, strict=True):
                w.sub_(d, alpha=by)


class PipeMareHooks:
    """The executor's hooks (runtime.execution.executor.StageHooks) for this process's stages: steps, predicted forwards,
    corrected backwards, and the weight version each microbatch's forward and backward ran on (the measured delays)."""

    def __init__(self, updaters: dict[int, StageUpdater], microbatches: int, sync_minibatches: int) -> None:
        self.updaters = updaters
        self.first_async = sync_minibatches * microbatches  # the first microbatch of the stream
        self.sync_minibatches = sync_minibatches
        self.versions = dict.fromkeys(updaters, 0)
        self._forward: dict[tuple[int, int], int] = {}
        self.delays = dict.fromkeys(updaters, 0)
        self.step_times: list[float] = []

    @contextlib.contextmanager
    def forward(self, stage: int, microbatch: int) -> Iterator[None]:
        self._forward[(stage, microbatch)] = self.versions[stage]
        with self.updaters[stage].predicted(microbatch >= self.first_async):
            yield

    @contextlib.contextmanager
    def backward(self, stage: int, microbatch: int) -> Iterator[None]:
        used = self._forward.pop((stage, microbatch))
        self.delays[stage] = max(self.delays[stage], self.versions[stage] - used)
        with self.updaters[stage].corrected(microbatch >= self.first_async):
            yield

    def update(self, stage: int, minibatch: int) -> None:
        self.updaters[stage].step(asynchronous=minibatch >= self.sync_minibatches)
        self.versions[stage] += 1
        if stage == min(self.updaters):
            self.step_times.append(time.perf_counter())


def train_asynchronous(
    config: TrainConfig, model: Model, rank: int, world: int, device: torch.device, on_step: StepCallback | None
) -> TrainReport | None:
    """An asynchronous training job on this process (runtime.training.worker.train hands it over): one walk of a pipemare
    schedule per segment, every step's rows at once, each stage stepping at its U actions. Without --eval the
    whole run is one segment; with it, one per epoch (the pipeline drains to evaluate). Losses per step,
    evaluations, measured delays and samples/s go to process 0."""
    layout = config.layout
    assert layout is not None
    settings = config.asynchronous or AsyncSettings()
    m, batch, data = layout.microbatches, layout.global_batch, model.dataset
    total = config.total_steps(len(data), batch)
    check_async_settings(settings, total)
    per_epoch = config.steps_per_epoch(len(data), batch)
    bounds = [*list(range(0, total, per_epoch if config.evaluate else total)), total]
    full = dataclasses.replace(layout, minibatches=total, sync_minibatches=settings.sync_warmup)
    plan, schedule = full.build(len(model.layers), world)
    check_asynchronous_sharing(
        model.layers, model.layer_names, plan, layout.name
    )  # the launcher checked it: here for any other caller
    taus = stage_delays(schedule).delays  # the run's delays: its steady state, as one walk would see it
    report = TrainReport(start_step=0, model=model, plan=plan, schedule=schedule, warmup_steps=config.warmup_steps)
    hooks: PipeMareHooks | None = None
    losses = torch.zeros(total, dtype=torch.float64)
    marks: list[float] = []
    own: dict[int, nn.Module] = {}
    warm_up(config.optimizer)
    walking = 0.0  # seconds inside the walks (building a walk's executor is setup, as a synchronous run's is)
    began = time.perf_counter()
    for first, end in itertools.pairwise(bounds):
        warm = min(max(settings.sync_warmup - first, 0), end - first)
        part = dataclasses.replace(layout, minibatches=end - first, sync_minibatches=warm)
        seg_plan, seg_schedule = part.build(len(model.layers), world)
        topology = Topology(seg_plan, seg_schedule, world)
        role = topology.roles[rank]
        executor = Executor(topology, role, model.layers, model.loss_fn, device, config.timeout_s, config.lookahead,
                            loss_samples=batch, graph=model.graph, precision=config.precision, seed=config.seed)  # fmt: skip
        executor.step_index = first  # its rows are steps first..end-1's batches: the layers' RNG seeds name those steps
        if hooks is None:
            updaters = {
                s: StageUpdater(
                    list(stage.module.parameters()),
                    lambda params, lr: make_optimizer(config.optimizer, params, lr),
                    config.lr,
                    taus[s],
                    settings,
                    config.rates(total),
                )
                for s, stage in executor.stages.items()
            }
            hooks = PipeMareHooks(updaters, m, settings.sync_warmup)
        hooks.first_async = warm * m  # this walk's microbatches count from 0
        hooks.sync_minibatches = warm
        executor.hooks = hooks
        own = executor.modules()
        idx = torch.cat([batch_indices(len(data), batch, step, config.seed) for step in range(first, end)])
        inputs, targets = data.inputs[idx], data.targets[idx]
        dist.barrier()
        started = time.perf_counter()
        hooks.step_times = [started]
        executor.run(inputs, targets)
        walking += time.perf_counter() - started
        for mb, value in executor.microbatch_losses.items():
            losses[first + mb // m] += value
        marks += [b - a for a, b in itertools.pairwise(hooks.step_times)]
        if config.evaluate:
            scored = evaluation(model, seg_plan, own, device, end, per_epoch, began)
            if scored is not None:
                report.evals.append(scored)
    assert hooks is not None
    dist.all_reduce(losses)
    measured: list[list[list[int]]] | None = gather_json(sorted(hooks.delays.items()))  # [stage, delay] rows
    times: list[list[float]] | None = gather_json(marks)
    if rank != 0:
        return None
    assert measured is not None and times is not None
    delays = {int(s): int(tau) for part in measured for s, tau in part}
    report.losses = [float(v) for v in losses]
    report.delays = [delays[s] for s in range(schedule.num_stages)]
    report.samples_per_s = total * batch / walking
    for step, seconds in enumerate(next((t for t in times if t), [])):
        report.step_ms.append(s_to_ms(seconds))  # from one of stage 0's steps to its next (the first: from the start)
        report.pipeline_ms.append(s_to_ms(seconds))
        report.optimizer_ms.append(0.0)
        if on_step is not None:
            on_step(step, report.losses[step], report.step_ms[-1], 0.0)
    return report
