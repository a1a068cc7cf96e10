"""The whole model seen from one process of a pipeline: who holds each tensor, its state gathered, its gradient norm.

Every process builds the whole model (the user's module), but trains only the
layers of its own stages. Each entry of the model's `state_dict` (a parameter or
a buffer) is owned by one process: the one running pipeline replica 0, replica 0
of the stage holding the first layer that holds the tensor (models.parameter_sharing's
`holdings`, the one finder of tensors several layers hold: a tensor tied
between layers, such as GPT-2's `lm_head.weight` and `wte.weight`, is owned
once; a tensor no layer holds, by process 0). The copies elsewhere (data-parallel
replicas, the other stages' copies of a tied weight) hold the same values after
each step's gradient exchange, so the owners' tensors are the model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from pipeplan.core.errors import PlanError
from pipeplan.core.plan import Plan
from pipeplan.models.parameter_sharing import holdings
from pipeplan.runtime.execution.replicas import local_tensor
from pipeplan.runtime.execution.tp_layers import TensorParallel
from pipeplan.runtime.placement import Role, Topology


def layer_stages(plan: Plan, num_layers: int) -> list[int]:
    """The (chunk-)stage of `plan` that runs each of the model's layers."""
    order = plan.layer_order if plan.layer_order is not None else range(num_layers)
    stage_of = [0] * num_layers
    for s, stage in enumerate(plan.stages):
        for position in range(stage.first_layer, stage.last_layer + 1):
            stage_of[order[position]] = s
    return stage_of


class WholeModel:
    """The model's state_dict entries, each with its owning process, and the parameters this process counts once.

    Args:
        model: the user's module (its state_dict keys name the entries).
        layers: its layers as the plan splits them (the module's own objects).
        topology: the plan on the job's processes.
        role: this process's role.
        device: where the collective tensors travel (the process group's device).
        tensor_parallel: this process's split blocks (runtime.execution.tp_layers): trained in place of the model's
            dense blocks, whose parameters this process has freed (on the meta device); their entries are gathered
            from the shards for `state_dict`, and `load_state_dict` shards a state's values into them.
    """

    def __init__(
        self,
        model: nn.Module,
        layers: Sequence[nn.Module],
        topology: Topology,
        role: Role,
        device: torch.device,
        tensor_parallel: TensorParallel | None = None,
    ) -> None:
        self.model = model
        self.device = device
        self.tensor_parallel = tensor_parallel or TensorParallel()
        blocks = [block for _, block in self.tensor_parallel.blocks.values()]
        dense = {id(p) for block, _ in self.tensor_parallel.blocks.values() for p in block.parameters()}
        stage_of = layer_stages(topology.plan, len(layers))
        first_layer = {key: holding.layers[0] for key, holding in holdings(layers, buffers=True).items()}
        self.owner: dict[str, int] = {}
        for key, tensor in model.state_dict(keep_vars=True).items():
            index = first_layer.get(id(tensor))
            self.owner[key] = 0 if index is None else topology.process(stage_of[index], 0, 0)
        own = set(role.stages) if role.replica == 0 and role.pipeline_replica == 0 else set()
        self.counted: list[nn.Parameter] = []
        """The parameters whose gradients this process adds to the global norm: each trained one exactly once."""
        for param in model.parameters():  # unique by identity
            index = first_layer.get(id(param))
            if param.requires_grad and index is not None and stage_of[index] in own and id(param) not in dense:
                self.counted.append(param)
        # a tensor-parallel stage: its split blocks' weights in place of the model's dense blocks (tp_layers)
        self.trained = [p for block in blocks for p in block.parameters() if p.requires_grad]
        """The split blocks' weights, which the model's parameters do not hold (clipped beside them, on every copy)."""
        self.counted = self.tensor_parallel.counted(self.counted + (self.trained if own else []))

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The whole model's state, every entry from its owner (a collective: every process calls it, gets it all).

        The keys and order are the model's own `state_dict`'s; the values are detached CPU copies.
        """
        gathered = self.tensor_parallel.dense_values()  # the split blocks' shards, whole, for the freed blocks
        local = {key: gathered.get(id(t), t).detach() for key, t in self.model.state_dict(keep_vars=True).items()}
        out: dict[str, torch.Tensor] = {}
        groups: dict[tuple[int, torch.dtype], list[str]] = {}
        for key, tensor in local.items():
            groups.setdefault((self.owner[key], tensor.dtype), []).append(key)
        me = dist.get_rank()
        for (owner, dtype), keys in sorted(groups.items(), key=lambda item: (item[0][0], str(item[0][1]))):
            shapes = [local[k] for k in keys]
            if owner == me:
                bucket = _flatten_dense_tensors([t.detach() for t in shapes]).to(self.device)
            else:
                bucket = torch.empty(sum(t.numel() for t in shapes), dtype=dtype, device=self.device)
            dist.broadcast(bucket, src=owner)
            for key, value in zip(keys, _unflatten_dense_tensors(bucket, shapes), strict=True):
                out[key] = value.detach().to("cpu", copy=True)
        return {key: out[key] for key in local}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Copy a whole-model state into the model (every process loads it all; its stages' tensors are the ones used).

        Raises:
            PlanError: a key missing or unexpected, or an entry of another shape (one line naming the first).
        """
        if not isinstance(state, dict):
            raise PlanError(f"state must be a dict of the model's state_dict keys to tensors, got {type(state).__name__}")
        expected = self.model.state_dict()
        missing = [key for key in expected if key not in state]
        unexpected = [key for key in state if key not in expected]
        if missing or unexpected:
            raise PlanError(
                f"state holds {len(state)} entries but the model's state_dict {len(expected)}: missing "
                f"{_few(missing)}, unexpected {_few(unexpected)}: load a state_dict() of the same model"
            )
        for key, tensor in expected.items():
            value = state[key]
            if not isinstance(value, torch.Tensor) or value.shape != tensor.shape:
                got = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
                raise PlanError(f"state[{key!r}] is {got} but the model's is {tuple(tensor.shape)}: the state is another model's")
        held = self.model.state_dict(keep_vars=True)
        key_of = {id(tensor): key for key, tensor in held.items()}
        freed = {key for key, tensor in held.items() if tensor.is_meta}  # a split block's: its shards take the value
        self.model.load_state_dict({key: value for key, value in state.items() if key not in freed}, strict=not freed)
        self.tensor_parallel.read_dense(lambda dense: state[key_of[id(dense)]])

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> float:
        """Scale every gradient of this process by min(1, max_norm / (total + 1e-6)), `total` the norm of the whole
        model's gradient (each parameter once, over every stage): torch.nn.utils.clip_grad_norm_'s rule. A
        collective; returns the total norm on every process."""
        grads = [local_tensor(p.grad.detach()) for p in self.counted if p.grad is not None]
        norms = [torch.linalg.vector_norm(g, norm_type).to(torch.float64) for g in grads]
        if math.isinf(norm_type):
            part = torch.stack(norms).max() if norms else torch.zeros((), dtype=torch.float64)
            total = part.to(self.device)
            dist.all_reduce(total, op=dist.ReduceOp.MAX)
        else:
            part = torch.stack(norms).pow(norm_type).sum() if norms else torch.zeros((), dtype=torch.float64)
            total = part.to(self.device)
            dist.all_reduce(total)
            total = total.pow(1.0 / norm_type)
        norm = float(total)
        scale = min(1.0, max_norm / (norm + 1e-6))
        if scale < 1.0:
            seen: set[int] = set()
            for p in [*self.model.parameters(), *self.trained]:
                if p.grad is not None and id(p) not in seen:
                    seen.add(id(p))
                    p.grad.detach().mul_(scale)
        return norm


def _few(keys: Sequence[str]) -> str:
    """Up to three keys for a message, and how many more."""
    if not keys:
        return "none"
    shown = ", ".join(repr(k) for k in keys[:3])
    return shown + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")
