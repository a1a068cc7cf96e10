"""A plan run from the user's own script: this process's stages of the user's model, one step per global batch.

A script started by torchrun (or `pipeplan`'s `--local` launcher) on as many
processes as the plan has devices builds a `DistributedPipeline` on every
process. Each builds the whole model, keeps the layers of its own stages
(models.specs.spec_from_module: the chain or graph the profiler measured) and
walks its actions of the plan's schedule with the runtime's Executor, the code
`pipeplan train` runs: the same messages, the same gradient all-reduce between
replicas. The user's optimizer steps `parameters()` (`optimizer(cls, ...)` builds it, its state sharded under a
plan's zero 1: runtime.execution.sharded_state); the loss, the gradient
norm and the model's state are collectives that every process calls and that
give every process the same answer (runtime.execution.whole_model).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from pipeplan.core.errors import PlanError, TrainConfigError
from pipeplan.core.plan import Plan
from pipeplan.models.model_spec import ModelSpec
from pipeplan.models.stage import LossFn
from pipeplan.models.traced.graph import LayerGraph
from pipeplan.runtime.execution.executor import Executor
from pipeplan.runtime.execution.loss_scale import LossScaler
from pipeplan.runtime.execution.sharded_state import check_elementwise, plan_optimizer
from pipeplan.runtime.execution.tp_layers import check_tensor_parallel, tensor_parallel_layers
from pipeplan.runtime.execution.whole_model import WholeModel
from pipeplan.runtime.placement import Topology
from pipeplan.runtime.transport.link_emulation import Wire
from pipeplan.runtime.transport.process_group import init_distributed
from pipeplan.schedules.plan_schedule import plan_schedule
from pipeplan.schedules.registry import ASYNCHRONOUS


def model_spec(model: nn.Module) -> ModelSpec:
    """The layers of `model` as the profiler measures them (a chain of blocks, or a traced graph; a stock Hugging Face
    model captured on its own sample input, models.zoo.stock).

    Raises:
        ProfileError: the model is neither a chain of blocks nor a graph that traces.
    """
    from pipeplan.models.specs import spec_from_module
    from pipeplan.models.zoo.stock import hf_defaults

    def no_sample(batch_size: int) -> torch.Tensor:
        raise PlanError(
            f"model {type(model).__name__} is a graph: its edges are measured on a sample batch; give the module a "
            "sample_input(batch_size) method"
        )

    own = callable(getattr(model, "sample_input", None)) or hf_defaults(model) is not None
    return spec_from_module(model, type(model).__name__, sample_input=None if own else no_sample)


class DistributedPipeline:
    """This process's part of a plan on a model (see the module docstring); built on every process of the job.

    `start_pipeline` joins the process group and builds it from the user's model (pipeplan.distribute); the
    constructor builds it from the runtime's parts, in a group already joined (`pipeplan train`'s worker).

    Args:
        model: the whole model as one module over `layers` (its state_dict keys name the whole model's state).
        layers: its layers as the plan splits them (the module's own objects; every process builds them all).
        graph: a branching model's edges and shapes (None: a chain).
        topology: the plan and its schedule on the job's processes.
        rank: this process.
        loss_fn: `loss_fn(output, target)`, a mean over the samples of its batch.
        device: where this process's stages run.
        timeout_s: bound on every wait for a peer.
        lookahead: actions ahead whose receives are posted early.
        wire: the emulated network the messages travel on (None: the real one).
        bucket_bytes: all-reduce replicated stages' gradients in buckets of this many bytes during their last
            backward (runtime.execution.replicas); None: after it, in one.
    """

    def __init__(
        self,
        model: nn.Module,
        layers: Sequence[nn.Module],
        graph: LayerGraph | None,
        topology: Topology,
        rank: int,
        loss_fn: LossFn,
        device: torch.device,
        timeout_s: float,
        lookahead: int = 2,
        wire: Wire | None = None,
        precision: str = "full",
        scaler: LossScaler | None = None,
        seed: int = 0,
        sample_shape: tuple[int, ...] | None = None,
        bucket_bytes: float | None = None,
    ) -> None:
        self.rank, self.world_size, self.device = rank, topology.world_size, device
        self.sample_shape = sample_shape
        """One sample's input shape when the model was captured with torch.export (every dimension fixed but the
        batch's); None: any."""
        self.plan = topology.plan
        self.topology = topology
        self.role = topology.roles[rank]
        check_tensor_parallel(self.plan, layers, None, graph)
        run, self.tensor_parallel = tensor_parallel_layers(layers, topology, self.role, device, timeout_s, graph)
        self.tensor_parallel.free_dense([model, *layers])  # its shards hold those weights now
        self.executor = Executor(topology, self.role, run, loss_fn, device, timeout_s, lookahead, wire=wire, graph=graph,
                                 precision=precision, scaler=scaler, seed=seed, bucket_bytes=bucket_bytes)  # fmt: skip
        self.whole = WholeModel(model, layers, topology, self.role, device, self.tensor_parallel)

    @property
    def stages(self) -> tuple[int, ...]:
        """The plan's (chunk-)stages this process runs."""
        return self.role.stages

    @property
    def replica(self) -> int:
        """The pipeline replica this process belongs to (its share of every global batch)."""
        return self.role.pipeline_replica

    @property
    def is_first_stage(self) -> bool:
        """True when this process runs the plan's first stage (it reads the inputs)."""
        return 0 in self.role.stages

    @property
    def is_last_stage(self) -> bool:
        """True when this process runs the plan's last stage (it computes the loss)."""
        return len(self.plan.stages) - 1 in self.role.stages

    def parameters(self) -> list[nn.Parameter]:
        """This process's trained parameters (its stages', each once: Executor.parameters), for the user's optimizer."""
        return self.executor.parameters()

    def optimizer(self, optimizer_class: type[torch.optim.Optimizer], **options: Any) -> torch.optim.Optimizer:
        """`optimizer_class(self.parameters(), **options)`; under a plan with zero 1, its state sharded over each
        stage's data-parallel group (runtime.execution.sharded_state: SGD, Adam or AdamW), its `state_dict()`
        whole (a collective); under zero 2 its step also reduce-scatters the gradients (the pipeline's step leaves
        each copy's own sums). An optimizer built over `parameters()` by hand trains the same, unsharded, at zero 0
        or 1 only (at zero 2 it would step unsummed gradients).

        Raises:
            PlanError: `optimizer_class` is no torch optimizer, or (zero 1) not one whose state shards by element.
        """
        if not (isinstance(optimizer_class, type) and issubclass(optimizer_class, torch.optim.Optimizer)):
            got = getattr(optimizer_class, "__name__", type(optimizer_class).__name__)
            raise PlanError(f"optimizer_class must be a torch.optim.Optimizer class (e.g. torch.optim.Adam), got {got!r:.60}")
        if self.plan.zero:
            check_elementwise(optimizer_class)

        def make(params: list[torch.Tensor]) -> torch.optim.Optimizer:
            return optimizer_class(params, **options)

        return plan_optimizer(make, self.parameters(), self.executor.sync, self.plan.zero)

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> float:
        """One iteration of the plan's schedule on a global batch (every process passes the same one; each takes its
        rows). The gradients replace those of the last step; the caller steps its optimizer. Returns the batch's mean
        loss on every process.

        Raises:
            PlanError: the batch is not the plan's global batch, or inputs and targets differ in length.
            RuntimeFault: an action failed here or on a peer (naming rank, step and action).
        """
        batch = self.plan.global_batch
        if not isinstance(inputs, torch.Tensor) or len(inputs) != batch:
            got = f"{len(inputs)} samples" if isinstance(inputs, torch.Tensor) and inputs.dim() else type(inputs).__name__
            raise PlanError(f"inputs must be a tensor of the plan's global batch ({batch} samples), got {got}")
        if not isinstance(targets, torch.Tensor) or targets.dim() == 0 or len(targets) != batch:
            got = f"{len(targets)} samples" if isinstance(targets, torch.Tensor) and targets.dim() else type(targets).__name__
            raise PlanError(f"targets must be a tensor of {batch} samples (one per input), got {got}")
        if self.sample_shape is not None and tuple(inputs.shape[1:]) != self.sample_shape:
            want = ", ".join(map(str, (batch, *self.sample_shape)))
            raise PlanError(
                f"inputs have shape {tuple(inputs.shape)} but the model was captured with torch.export on inputs of "
                f"shape ({want}) (only the batch dimension may vary): pad or cut every batch to that shape, or give "
                "the model a sample_input(batch_size) of your batches' shape"
            )
        record = self.executor.run(inputs, targets)
        loss = torch.tensor([record.loss], dtype=torch.float64, device=self.device)
        dist.all_reduce(loss)
        return float(loss)

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> float:
        """Clip the whole model's gradient to norm `max_norm` as torch.nn.utils.clip_grad_norm_ does over all of its
        parameters; returns the norm before clipping on every process.

        Raises:
            PlanError: a plan with zero 2 (the gradients are summed over the copies only inside the optimizer's step).
        """
        if self.plan.zero >= 2:
            raise PlanError("clip_grad_norm_ needs the summed gradients, which a plan with zero 2 has only inside the "
                            "sharded optimizer's step (reduce-scattered there): clip with zero 1 or 0")  # fmt: skip
        _check_number("max_norm", max_norm, 0.0)
        _check_number("norm_type", norm_type, 0.0, allow_inf=True, above=True)
        return self.whole.clip_grad_norm_(float(max_norm), float(norm_type))

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The whole model's state under its own state_dict keys, on every process, whatever the plan."""
        return self.whole.state_dict()

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Load a whole-model state (a `state_dict()` of any plan, or the plain model's) on every process."""
        self.whole.load_state_dict(state)


def start_pipeline(
    model: nn.Module, spec: ModelSpec, plan: Plan, loss_fn: LossFn, backend: str | None, timeout_s: float, seed: int = 0
) -> DistributedPipeline:
    """Join the process group torchrun set up and build this process's stages of `model` (its layers: `spec`,
    checked against the plan by the caller): what pipeplan.distribute returns.

    Raises:
        PlanError: an asynchronous schedule, a plan on another number of devices than the job's processes, or
            tensor-parallel stages the runtime does not run (runtime.execution.tp_layers.check_tensor_parallel).
        TrainConfigError: not started by torchrun or a launcher setting its variables.
    """
    if plan.schedule in ASYNCHRONOUS:
        raise PlanError(f"plan schedule {plan.schedule!r} steps inside its schedule (no flush): run it with pipeplan train")
    schedule = plan_schedule(plan)
    layers = list(spec.layers)
    graph = None
    if spec.layer_inputs is not None:
        graph = LayerGraph.measure(layers, spec.layer_inputs, spec.layer_names, spec.sample_input(2))
    check_tensor_parallel(plan, spec.layers, spec.layer_names, graph)  # before the group (sequence lengths: each step's)
    try:
        rank, world, device = init_distributed(backend, timeout_s)
    except TrainConfigError as exc:
        raise TrainConfigError(str(exc).replace("pipeplan train must run", "pipeplan.distribute must run", 1)) from None
    # torch.export fixes every dimension but the batch's: the shape one sample must have (one line, before any work)
    sample = spec.sample_input(2) if spec.recapture is not None else None
    shape = tuple(sample.shape[1:]) if isinstance(sample, torch.Tensor) else None
    return DistributedPipeline(model, layers, graph, Topology(plan, schedule, world), rank, loss_fn, device, timeout_s,
                               seed=seed, sample_shape=shape)  # fmt: skip


def _check_number(name: str, value: object, least: float, allow_inf: bool = False, above: bool = False) -> None:
    """A method's number argument: an int or float (not a bool), finite unless `allow_inf`, >= (or >) `least`.

    Raises:
        PlanError: naming the argument and the value.
    """
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if ok:
        number = float(value)  # type: ignore[arg-type]
        ok = math.isfinite(number) or (allow_inf and number == math.inf)
        ok = ok and (number > least if above else number >= least)
    if not ok:
        bound = f"{'>' if above else '>='} {least:g}"
        raise PlanError(f"{name} must be a {'' if allow_inf else 'finite '}number {bound}, got {value!r:.60}")
