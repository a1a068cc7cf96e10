"""The executor: a process walks its own actions of the Schedule and dispatches on the op; it never reorders."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import torch
from torch import nn

from pipeplan.core.schedule import Action
from pipeplan.models.autocast import autocast
from pipeplan.models.layer_rng import RngKey
from pipeplan.models.stage import LossFn, StageModule
from pipeplan.models.traced.graph import LayerGraph
from pipeplan.models.traced.graph_stage import GraphStage
from pipeplan.runtime.execution.loss_scale import LossScaler
from pipeplan.runtime.execution.memory_meter import SavedMemoryMeter
from pipeplan.runtime.execution.optim import distinct
from pipeplan.runtime.execution.replicas import AllReduceSpan, GradSync
from pipeplan.runtime.execution.shared_grads import SharedGradSync, shared_copies
from pipeplan.runtime.placement import Role, Topology
from pipeplan.runtime.rank_errors import RuntimeFault
from pipeplan.runtime.state.faults import FaultInjector
from pipeplan.runtime.transport.comm import Comm, TransferRecord
from pipeplan.runtime.transport.link_emulation import Wire


class ActionSpan(NamedTuple):
    """One compute action this process ran, timed on its perf_counter (seconds): `op` in FBIW, from start_s to end_s
    (runtime.measurement.timeline turns it into the simulator's ComputeSpan, in ms from the run's shared origin)."""

    rank: int
    stage: int
    op: str
    microbatch: int
    start_s: float
    end_s: float


@dataclass(frozen=True, slots=True)
class StepRecord:
    """What one process measured in one iteration: its loss share and, when recorded, its spans (perf_counter s).

    `busy_s[i]`, when recorded, is what action i cost its process: its whole time (posting receives, the compute,
    handing its output over) less the time it waited for its input; a compute span is the compute alone.
    `collectives`, on an emulated network, are its stages' data-parallel all-reduces (ms on the trace's clock).
    """

    loss: float
    compute: tuple[ActionSpan, ...]
    transfers: tuple[TransferRecord, ...]
    peak_inflight: int
    stage_peaks: tuple[tuple[int, int], ...]
    busy_s: tuple[float, ...] = ()
    collectives: tuple[AllReduceSpan, ...] = ()


class StageHooks(Protocol):
    """What an asynchronous run adds around the actions (runtime.training.asynchronous): it wraps each forward and each
    backward (B or I; the weights they run on) and performs each optimizer step (U)."""

    def forward(self, stage: int, microbatch: int) -> AbstractContextManager[None]: ...

    def backward(self, stage: int, microbatch: int) -> AbstractContextManager[None]: ...

    def update(self, stage: int, minibatch: int) -> None: ...


class Executor:
    """Runs one process's part of each iteration: actions in schedule order, then gradient sync.

    Args:
        topology: placement of plan and schedule.
        role: this process's role.
        layers: the whole model's ordered layers (only this process's stages are kept).
        loss_fn: `loss_fn(output, target)`, a mean over the samples of its batch.
        device: where the stages run.
        timeout_s: bound on every wait for a peer.
        lookahead: actions ahead whose receives are posted early.
        hooks: run around forwards, backwards and optimizer steps (U); a schedule with U actions needs them.
        loss_samples: the samples one optimizer step covers (the loss of a piece of n samples is scaled by
            n / loss_samples); default the plan's global batch.
        wire: the emulated network the messages travel on (None: the real one).
        graph: a branching model's edges and shapes (models.traced.graph): its stages run the layers at their positions of
            the plan's layer order as graphs, sending the packed live sets (models.traced.graph_stage); None: a chain.
        precision: what the forwards compute in (core.precision): `full`, or `bf16` / `fp16` under torch.autocast
            (the backwards run outside it, as in torch's recipe); the activations and gradients that cross stages
            travel in the dtype the layers produce.
        scaler: fp16's loss scale: the backward of each microbatch's loss starts from its scale instead of 1.
        bucket_bytes: all-reduce each replicated stage's gradients in buckets of this many bytes during its last
            backward task, as PyTorch DDP does (runtime.execution.replicas); None: in one flat bucket after it.
        seed: the run's seed. Every forward seeds each layer call from (seed, step, the microbatch's first sample in
            its step's global batch, the layer's index; models.layer_rng), so the random numbers a layer draws do not
            depend on the plan. Row i of `run`'s inputs is sample i mod `loss_samples` of step `step_index` +
            i div `loss_samples` (an asynchronous walk holds several steps' rows).
    """

    def __init__(
        self,
        topology: Topology,
        role: Role,
        layers: Sequence[nn.Module],
        loss_fn: LossFn,
        device: torch.device,
        timeout_s: float,
        lookahead: int = 2,
        faults: FaultInjector | None = None,
        hooks: StageHooks | None = None,
        loss_samples: int | None = None,
        wire: Wire | None = None,
        graph: LayerGraph | None = None,
        precision: str = "full",
        scaler: LossScaler | None = None,
        seed: int = 0,
        bucket_bytes: float | None = None,
    ) -> None:
        self.topology = topology
        self.precision = precision
        self.scaler = scaler
        self.seed = seed
        self.hooks = hooks
        self.loss_samples = loss_samples or topology.plan.global_batch
        self.microbatch_losses: dict[int, float] = {}
        """The scaled loss of each microbatch whose last stage ran here (the last iteration's)."""
        self.role = role
        self.loss_fn = loss_fn
        self.device = device
        self.lookahead = lookahead
        self.faults = faults or FaultInjector.from_env()
        plan, schedule = topology.plan, topology.schedule
        self.actions = schedule.ranks[role.sched_rank]
        split = schedule.split_backward
        self.stages: dict[int, StageModule] = {}
        order = plan.layer_order if plan.layer_order is not None else range(len(layers))
        if graph is None and plan.layer_order is not None:
            raise RuntimeFault("the plan orders its layers as a graph's, but the model is a chain: the plan is another model's")
        for s in role.stages:
            first, last = plan.stages[s].first_layer, plan.stages[s].last_layer
            is_last = s == schedule.num_stages - 1
            for i in order[first : last + 1]:
                layers[i].to(device)
            if graph is None:
                self.stages[s] = StageModule(s, layers[first : last + 1], s == 0, is_last, split, range(first, last + 1))
            else:
                self.stages[s] = GraphStage(s, layers, graph, list(order), first, last, is_last, split)
        self.timeout_s = timeout_s
        self.wire = wire
        self._comms: dict[tuple[tuple[Action, ...], ...], Comm] = {}
        self.use(topology)
        self.sync = GradSync(topology, role, timeout_s, wire, bucket_bytes)
        self._shared_sync(layers, timeout_s)
        for s, st in sorted(self.stages.items()):
            self.sync.use_buckets(s, list(st.module.children()), self._plain[s])
        self.step_index = 0
        self._loss = torch.zeros((), dtype=torch.float64)
        self._peak = 0  # most microbatches in flight on this process in the current iteration
        self._current: Action | None = None

    def _shared_sync(self, layers: Sequence[nn.Module], timeout_s: float) -> None:
        """The parameters several layers hold (tied weights): summed over every process holding a copy
        (runtime.execution.shared_grads), and so left out of the stages' own data-parallel all-reduce."""
        found = shared_copies(layers, self.topology)
        self.shared = tuple(copies for copies, _ in found)
        params: dict[int, nn.Parameter] = {}
        holders: dict[int, tuple[int, ...]] = {}
        for i, (_, param) in enumerate(found):
            local = tuple(s for s, st in sorted(self.stages.items()) if any(q is param for q in st.module.parameters()))
            if local and param.requires_grad:
                params[i], holders[i] = param, local
        self.shared_sync = SharedGradSync(self.shared, params, holders, self.role, timeout_s, self.wire, self.topology.plan)
        kept = {id(p) for p in params.values()}
        self._plain = {s: [p for p in st.params if id(p) not in kept] for s, st in self.stages.items()}

    def use(self, topology: Topology) -> None:
        """Walk `topology`'s schedule from the next iteration on: the same stages, weights and processes in another
        order (adaptive k switches here, on every process at the same iteration; each order keeps its channels)."""
        if topology.roles[self.role.process] != self.role:
            raise RuntimeFault(f"process {self.role.process} cannot switch to a schedule that gives it another role")
        self.topology = topology
        self.actions = topology.schedule.ranks[self.role.sched_rank]
        comm = self._comms.get(topology.schedule.ranks)
        if comm is None:
            comm = Comm(topology, self.role, self.actions, self.device, self.timeout_s, self.lookahead, self.wire)
            self._comms[topology.schedule.ranks] = comm
        self.comm = comm
        # the position of each local stage's last backward (B or W): its gradients are final there.
        self._last_backward: dict[int, int] = {}
        for i, a in enumerate(self.actions):
            if a.op in "BW":
                self._last_backward[a.stage] = i

    def parameters(self) -> list[nn.Parameter]:
        """Parameters of this process's stages, stage by stage, each once (a weight two local stages hold is one)."""
        return distinct(p for s in sorted(self.stages) for p in self.stages[s].module.parameters())

    def layer_ids(self, stage: int) -> tuple[int, ...]:
        """The model's indices of the layers of local `stage`, in the order its module holds them."""
        return self.stages[stage].layer_ids

    def modules(self) -> dict[int, nn.Module]:
        """stage index -> that stage's nn.Sequential (its layers in position order)."""
        return {s: st.module for s, st in sorted(self.stages.items())}

    def run(
        self, inputs: torch.Tensor, targets: torch.Tensor, record: bool = False, meter: SavedMemoryMeter | None = None
    ) -> StepRecord:
        """One iteration on the global batch (every process holds it; each takes its own rows).

        Leaves the summed gradients in the parameters' .grad; the caller steps the optimizer.
        With a `meter`, the bytes autograd keeps alive are sampled after every action.

        Raises:
            RuntimeFault: naming this process, the step and the action that failed.
        """
        for p in self.parameters():
            p.grad = None
        self.comm.begin_step(record)
        self.sync.begin()
        self.shared_sync.begin()
        self._loss = torch.zeros((), dtype=torch.float64)
        self.microbatch_losses = {}
        spans: list[ActionSpan] = []
        self._busy: list[float] = []
        stage_peaks = dict.fromkeys(self.stages, 0)
        self._current = None
        try:
            with meter if meter is not None else contextlib.nullcontext():
                self._walk(inputs, targets, record, spans, stage_peaks, meter)
            self.comm.finish_step(None)
            collectives = self.sync.finish()
            self.shared_sync.finish()
        except Exception as exc:
            for st in self.stages.values():
                st.clear()
            action = self._current
            where = f"action {action}" if action is not None else "the end of the iteration"
            message = str(exc) if isinstance(exc, RuntimeFault) else f"at {where}: {type(exc).__name__}: {exc}"
            who = f"rank {self.role.process} (pipeline rank {self.role.sched_rank}), step {self.step_index}"
            raise RuntimeFault(f"{who}: {message}") from exc
        self.step_index += 1
        return StepRecord(
            float(self._loss),
            tuple(spans),
            tuple(self.comm.records),
            self._peak,
            tuple(sorted(stage_peaks.items())),
            tuple(self._busy),
            collectives,
        )

    def _walk(
        self,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        record: bool,
        spans: list[ActionSpan],
        stage_peaks: dict[int, int],
        meter: SavedMemoryMeter | None,
    ) -> None:
        """Run this process's actions in order (the body of `run`); `_current` names the action running."""
        self._peak = 0
        for i, action in enumerate(self.actions):
            self._current = action
            self.faults.check(self.role.process, self.step_index, action)
            begun = time.perf_counter()
            self.comm.receive_s = 0.0
            self.comm.prefetch(i)
            if self._last_backward.get(action.stage) == i:
                self.sync.arm(action.stage)
            start = self._dispatch(action, inputs, targets)
            if record:
                end = time.perf_counter()
                spans.append(ActionSpan(self.role.process, action.stage, action.op, action.microbatch, start, end))
                self._busy.append(end - begun - self.comm.receive_s)
            self._peak = max(self._peak, sum(st.inflight for st in self.stages.values()))
            stage_peaks[action.stage] = max(stage_peaks[action.stage], self.stages[action.stage].inflight)
            if self._last_backward.get(action.stage) == i:
                self.sync.start(action.stage, self._plain[action.stage])
                self.shared_sync.stage_done(action.stage)
            if meter is not None:
                meter.sample()
        self._current = None

    def _dispatch(self, action: Action, inputs: torch.Tensor, targets: torch.Tensor) -> float:
        """Run one action; return the perf_counter time its compute started (after its inputs arrived)."""
        stage = self.stages[action.stage]
        mb = action.microbatch
        if action.op == "F":
            lo, hi = self.topology.sample_range(self.role, mb, action.stage)
            # copies, as a host-to-GPU transfer makes: a view would keep the whole batch's storage alive in what
            # autograd saves, and the memory meter would count all of it for one microbatch
            x = inputs[lo:hi].to(self.device, non_blocking=True, copy=True) if stage.is_first else self._receive(action)
            start = time.perf_counter()
            target = targets[lo:hi].to(self.device, non_blocking=True, copy=True) if stage.is_last else None
            scale = (hi - lo) / self.loss_samples
            step, first = divmod(lo, self.loss_samples)
            key = RngKey(self.seed, self.step_index + step, first)
            hooked = self.hooks.forward(action.stage, mb) if self.hooks is not None else contextlib.nullcontext()
            with hooked, autocast(self.precision, self.device):
                out = stage.forward(mb, x, target, self.loss_fn, scale, key)
            if stage.is_last:
                value = out.detach().to("cpu", torch.float64)
                if self.role.tp_rank == 0:  # a tensor-parallel stage's other TP ranks hold copies of the same loss
                    self._loss += value
                self.microbatch_losses[mb] = float(value)
            else:
                self.comm.send(action, out)
            return start
        if action.op == "W":
            start = time.perf_counter()
            stage.backward_weight(mb)
            return start
        if action.op == "U":
            if self.hooks is None:
                raise RuntimeFault(f"action {action}: an optimizer step inside the schedule needs an asynchronous run")
            start = time.perf_counter()
            self.hooks.update(action.stage, mb)
            return start
        if action.op not in "BI":
            raise RuntimeFault(f"op {action.op!r} of action {action} is not supported by the runtime")
        grad = self._loss_seed(stage, mb) if stage.is_last else self._receive(action)
        start = time.perf_counter()
        backward: Callable[[int, torch.Tensor | None], torch.Tensor | None]
        backward = stage.backward if action.op == "B" else stage.backward_input
        with self.hooks.backward(action.stage, mb) if self.hooks is not None else contextlib.nullcontext():
            grad_in = backward(mb, grad)
        if not stage.is_first:
            self.comm.send(action, grad_in)
        return start

    def _loss_seed(self, stage: StageModule, microbatch: int) -> torch.Tensor | None:
        """Where the backward of a microbatch's loss starts: its loss scale under fp16, else 1 (None)."""
        if self.scaler is None:
            return None
        return self.scaler.seed(stage.output_of(microbatch))

    def _receive(self, action: Action) -> torch.Tensor:
        tensor = self.comm.receive(action)
        if tensor is None:
            raise RuntimeFault(f"action {action} has no input")
        return tensor
