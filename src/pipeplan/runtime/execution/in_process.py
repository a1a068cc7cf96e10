"""A plan's stages and schedule in one process: the user's own layers split by the plan, the actions walked in order.

`split_layers` gives the plan's stages as `nn.Sequential`s that share the
user's layer objects (no copy: an optimizer over the model's parameters
steps them). `InProcessPipeline.step` runs one iteration of the plan's
schedule in this process: every pipeline replica's microbatches, each rank's
actions in that rank's order, interleaved so that an action runs once what
it needs has run (the same dependencies the distributed runtime waits for
over the wire). Activations and gradients pass between stages in memory. The
losses and the gradients are those of the distributed run (each microbatch's
loss scaled by its share of the global batch); the timing is not: one
process does every rank's work, one action at a time. Each layer call draws
its random numbers (dropout) from the seed the distributed run gives it
(models.layer_rng: the pipeline's seed, its step count, the microbatch's
first sample, the layer), and the caller's generator state is restored after
each forward.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from pipeplan.core.errors import DeadlockError, PlanError
from pipeplan.core.plan import Plan
from pipeplan.core.schedule import Action, Schedule
from pipeplan.models.layer_rng import RngKey
from pipeplan.models.stage import LossFn, StageModule
from pipeplan.runtime.execution.optim import distinct
from pipeplan.schedules.plan_schedule import plan_schedule
from pipeplan.schedules.registry import ASYNCHRONOUS


def model_layers(model: nn.Module | Sequence[nn.Module]) -> list[nn.Module]:
    """The ordered layers of `model`: an nn.Sequential's children (an nn.ModuleList's items), or a sequence of modules.

    Raises:
        PlanError: naming `model` when it is neither, or holds something that is not an nn.Module.
    """
    if isinstance(model, nn.Sequential | nn.ModuleList | list | tuple):
        layers = list(model)
    else:
        raise PlanError(
            f"model must be an nn.Sequential, an nn.ModuleList or a list of nn.Module layers (the chain the profile "
            f"measured), got {type(model).__name__}{f' {model!r}' if isinstance(model, int | float | str) else ''}"
        )
    for i, layer in enumerate(layers):
        if not isinstance(layer, nn.Module):
            raise PlanError(f"model layer {i} must be an nn.Module, got {type(layer).__name__}")
    return layers


def split_layers(model: nn.Module | Sequence[nn.Module], plan: Plan) -> list[nn.Sequential]:
    """One nn.Sequential per (chunk-)stage of `plan`, holding the model's own layer objects.

    Raises:
        PlanError: the model's layer count is not the plan's.
    """
    layers = model_layers(model)
    if len(layers) != plan.num_layers:
        raise PlanError(
            f"model has {len(layers)} layers but the plan's stages cover {plan.num_layers} (layers 0-{plan.num_layers - 1}): "
            "give the model the plan's profile measured"
        )
    return [nn.Sequential(*layers[s.first_layer : s.last_layer + 1]) for s in plan.stages]


class InProcessPipeline:
    """One process running a plan's schedule on the user's layers (see the module docstring for what it is not).

    `seed` is the run's seed of the layers' random numbers; `step_index` the step the next `step` seeds them with
    (0 first, then one more after each step; set it to resume a run's numbering).
    """

    def __init__(self, model: nn.Module | Sequence[nn.Module], plan: Plan, loss_fn: LossFn, seed: int = 0) -> None:
        if not callable(loss_fn):
            raise PlanError(f"loss_fn must be a function (output, target) -> loss, got {type(loss_fn).__name__} {loss_fn!r:.60}")
        if plan.schedule in ASYNCHRONOUS:
            raise PlanError(f"plan schedule {plan.schedule!r} is asynchronous (no flush): one iteration has no end here")
        self.plan = plan
        self.schedule: Schedule = plan_schedule(plan)
        split = self.schedule.split_backward
        self.stages = [
            StageModule(s, list(seq), s == 0, s == len(plan.stages) - 1, split, range(st.first_layer, st.last_layer + 1))
            for (s, seq), st in zip(enumerate(split_layers(model, plan)), plan.stages, strict=True)
        ]
        self.loss_fn = loss_fn
        self.seed = seed
        self.step_index = 0

    def parameters(self) -> list[torch.nn.Parameter]:
        """Every stage's parameters (the model's own), each once (a tied weight two stages hold is one), for an optimizer."""
        return distinct(p for stage in self.stages for p in stage.module.parameters())

    def step(self, inputs: torch.Tensor, targets: torch.Tensor, on_action: Callable[[int, Action], None] | None = None) -> float:
        """Run one iteration on a global batch; gradients accumulate into the parameters; return the mean loss.

        `on_action(pipeline_replica, action)` is called after every action, in the order they ran.

        Raises:
            PlanError: the batch is not the plan's global batch, or inputs and targets differ in length.
        """
        batch = self.plan.global_batch
        if len(inputs) != batch:
            raise PlanError(f"inputs hold {len(inputs)} samples but the plan's global batch is {batch}")
        if len(targets) != len(inputs):
            raise PlanError(f"targets hold {len(targets)} samples but inputs hold {len(inputs)}")
        per_replica = batch // self.plan.pipeline_replicas
        total = 0.0
        for replica in range(self.plan.pipeline_replicas):
            part = slice(replica * per_replica, (replica + 1) * per_replica)
            total += self._replica(inputs[part], targets[part], part.start, lambda a, r=replica: on_action and on_action(r, a))
        self.step_index += 1
        return total

    def _replica(self, inputs: torch.Tensor, targets: torch.Tensor, offset: int, notify: Callable[[Action], object]) -> float:
        """One pipeline replica's microbatches (its rows from `offset` of the global batch) through the schedule;
        the sum of their scaled losses."""
        b, last = self.plan.microbatch_size, len(self.stages) - 1
        scale = b / self.plan.global_batch
        acts: dict[tuple[int, int], torch.Tensor] = {}
        grads: dict[tuple[int, int], torch.Tensor | None] = {}
        done: set[tuple[int, str, int]] = set()
        loss = 0.0
        cursors = [0] * self.schedule.num_ranks
        remaining = sum(len(rank) for rank in self.schedule.ranks)
        while remaining:
            progressed = False
            for r, actions in enumerate(self.schedule.ranks):
                while cursors[r] < len(actions) and self._ready(actions[cursors[r]], done, last):
                    a = actions[cursors[r]]
                    stage, i = self.stages[a.stage], a.microbatch
                    if a.op == "F":
                        x = inputs[i * b : (i + 1) * b] if a.stage == 0 else acts.pop((a.stage - 1, i))
                        target = targets[i * b : (i + 1) * b] if a.stage == last else None
                        key = RngKey(self.seed, self.step_index, offset + i * b)
                        out = stage.forward(i, x, target, self.loss_fn if a.stage == last else None, scale, key)
                        if a.stage == last:
                            loss += float(out.detach())
                        else:
                            acts[(a.stage, i)] = out.detach()
                    elif a.op in ("B", "I"):
                        grad = None if a.stage == last else grads.pop((a.stage + 1, i))
                        back = stage.backward if a.op == "B" else stage.backward_input
                        grads[(a.stage, i)] = back(i, grad)
                    elif a.op == "W":
                        stage.backward_weight(i)
                    done.add((a.stage, a.op, i))
                    notify(a)
                    cursors[r] += 1
                    remaining -= 1
                    progressed = True
            if not progressed:
                waiting = [str(actions[c]) for actions, c in zip(self.schedule.ranks, cursors, strict=True) if c < len(actions)]
                raise DeadlockError(f"schedule {self.schedule.name!r} cannot go on: every rank waits ({', '.join(waiting)})")
        return loss

    @staticmethod
    def _ready(a: Action, done: set[tuple[int, str, int]], last: int) -> bool:
        """Whether what action `a` needs has run (the runtime's receive dependencies, and W after I)."""
        s, i = a.stage, a.microbatch
        if a.op == "F":
            return s == 0 or (s - 1, "F", i) in done
        if a.op in ("B", "I"):
            return (s, "F", i) in done and (s == last or (s + 1, "B", i) in done or (s + 1, "I", i) in done)
        if a.op == "W":
            return (s, "I", i) in done
        raise PlanError(f"action {a} (op {a.op}) has no place in a synchronous iteration")
