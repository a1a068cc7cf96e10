"""Shared parameters in a run: where each tied weight's copies live, and their gradients summed over every copy.

A parameter held by two layers (models.parameter_sharing) is one object in one process,
but when a plan puts those layers on stages of different processes, each
process holds its own copy (identical at the start: every process builds the
model from the same seed). Each copy's backward adds only its own layers' part
of the gradient, so without an exchange the copies take different steps and
the run trains another model than the one-process run.

Note:
    The exchange replaces the data-parallel all-reduce for these parameters
    rather than following it: every process holding a copy (every stage that
    holds one of the layers, in every data-parallel and pipeline replica) adds
    its own gradient into one all-reduce (sum) over all of them. Each stage's
    loss is already scaled by samples / global batch, so that sum is the
    gradient of the global mean loss, as the data-parallel sum is for a plain
    parameter: one collective, no division, and every copy ends with the same
    bytes, so every copy takes the identical optimizer step. A process joins
    the all-reduce once its last local stage holding the parameter has run its
    last backward (B or W), overlapping the rest of its actions, as GradSync
    does; the executor waits for it before the optimizer steps. One process
    group per distinct set of processes, created by every process in the same
    order (new_group is collective). On an emulated network it takes the time of
    a ring over the devices of the stages holding its parameters, in stage order
    (sim.cost.shared.exchange_devices: the simulator's ring), as a stage's
    data-parallel all-reduce does (runtime.execution.replicas).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch.distributed as dist
from torch import nn

from pipeplan.core.plan import Plan
from pipeplan.models.parameter_sharing import shared_parameters
from pipeplan.runtime.execution.replicas import Launched, finish_all, launch
from pipeplan.runtime.placement import Role, Topology
from pipeplan.runtime.rank_errors import RuntimeFault, TrainConfigError
from pipeplan.runtime.transport.link_emulation import Wire
from pipeplan.sim.cost.shared import exchange_devices


@dataclass(frozen=True, slots=True)
class SharedCopies:
    """One shared parameter in a run: its name, the layers holding it (their names), the stages holding those layers,
    their schedule ranks, the processes holding a copy, and its gradient's bytes."""

    name: str
    layers: tuple[int, ...]
    layer_names: tuple[str, ...]
    stages: tuple[int, ...]
    ranks: tuple[int, ...]
    processes: tuple[int, ...]
    nbytes: int

    @property
    def split(self) -> bool:
        """True when its layers run on more than one pipeline rank: copies on different processes, exchanged."""
        return len(self.ranks) > 1

    def to_json(self) -> dict[str, Any]:
        """The JSON a run's report carries (`shared_parameters`)."""
        return {
            "name": self.name,
            "layers": list(self.layers),
            "layer_names": list(self.layer_names),
            "stages": list(self.stages),
            "processes": list(self.processes),
            "bytes_per_iteration": self.nbytes,
        }

    def describe(self) -> str:
        """One line for a run's report: which layers, which stages, what is exchanged each iteration."""
        layers = ", ".join(f"{i} ({n})" for i, n in zip(self.layers, self.layer_names, strict=True))
        stages = ", ".join(map(str, self.stages))
        return (
            f"{self.name} is held by layers {layers} on stages {stages}: its gradient ({self.nbytes:,} bytes) is "
            f"all-reduced over the {len(self.processes)} processes holding a copy {list(self.processes)} every iteration"
        )


def stage_of_layers(plan: Plan, num_layers: int) -> list[int]:
    """The stage of every layer (a graph's plan: through its layer order)."""
    order = list(plan.layer_order) if plan.layer_order is not None else list(range(num_layers))
    stage_of = [-1] * num_layers
    for s, stage in enumerate(plan.stages):
        for position in range(stage.first_layer, stage.last_layer + 1):
            stage_of[order[position]] = s
    return stage_of


def shared_copies(
    layers: Sequence[nn.Module], topology: Topology, names: Sequence[str] | None = None
) -> tuple[tuple[SharedCopies, nn.Parameter], ...]:
    """Every parameter several of `layers` hold (models.parameter_sharing, in its order), with the stages and processes of
    `topology` holding a copy, and the parameter object itself; `names` names the layers (default: their indices)."""
    layer_names = [str(i) for i in range(len(layers))] if names is None else list(names)
    stage_of = stage_of_layers(topology.plan, len(layers))
    to_rank = topology.schedule.stage_to_rank
    out = []
    for shared in shared_parameters(layers, [str(i) for i in range(len(layers))]):
        first, _, path = shared.name.partition(".")  # named after its first holder's index: "3.weight"
        stages = tuple(sorted({stage_of[i] for i in shared.layers}))
        ranks = tuple(sorted({to_rank[s] for s in stages}))
        processes = tuple(sorted({p for r in ranks for p in topology.stage_group(r)}))
        holders = tuple(layer_names[i] for i in shared.layers)
        name = f"{layer_names[int(first)]}.{path}"
        copies = SharedCopies(name, shared.layers, holders, stages, ranks, processes, shared.nbytes)
        out.append((copies, layers[int(first)].get_parameter(path)))
    return tuple(out)


def check_asynchronous_sharing(layers: Sequence[nn.Module], names: Sequence[str], plan: Plan, schedule: str) -> None:
    """Refuse an asynchronous plan (`schedule`: pipemare) that puts the layers holding one parameter on different stages.

    Its stages step at different times, each on its own minibatch's gradients, so copies on two stages could never
    take one step: they would drift apart (no process needed: checked before any starts).

    Raises:
        TrainConfigError: naming the parameter, its layers and stages, and the way out.
    """
    stage_of = stage_of_layers(plan, len(layers))
    for shared in shared_parameters(layers, names):
        stages = sorted({stage_of[i] for i in shared.layers})
        if len(stages) > 1:
            held = ", ".join(names[i] for i in shared.layers)
            raise TrainConfigError(
                f"--schedule {schedule} cannot split shared parameter {shared.name} (held by layers {held}) over "
                f"stages {stages}: asynchronous stages step at different times, so its copies would drift apart; run a "
                "synchronous --schedule (1f1b, gpipe, zb-h1, ...), or untie it in the model"
            )


class SharedGradSync:
    """The all-reduce (sum) of every shared parameter's gradient over the processes holding a copy of it.

    Every process must construct it at the same point (new_group is collective), with the same `copies`.

    Args:
        copies: the run's shared parameters (shared_copies), the same on every process.
        params: this process's object of each of `copies` it holds, by index into `copies`.
        holders: this process's local stages holding each of those parameters, by the same index.
        role: this process's role.
        timeout_s: bound on the wait for the peers.
        wire: the emulated network (None: the real one); with it, `plan` (whose devices the rings run over).
    """

    def __init__(
        self,
        copies: Sequence[SharedCopies],
        params: dict[int, nn.Parameter],
        holders: dict[int, tuple[int, ...]],
        role: Role,
        timeout_s: float,
        wire: Wire | None = None,
        plan: Plan | None = None,
    ) -> None:
        self.timeout = timedelta(seconds=timeout_s)
        self.process = role.process
        self.wire = wire
        groups: dict[tuple[int, ...], dist.ProcessGroup] = {}
        for c in copies:  # every process, in the same order: one group per distinct set of processes
            if len(c.processes) > 1 and c.processes not in groups:
                groups[c.processes] = dist.new_group(list(c.processes), timeout=self.timeout)
        # one bucket per group this process is in: its parameters in `copies`' order, the stages that must finish first,
        # and the devices of its emulated ring (every stage holding one of its parameters, in stage order)
        self.buckets: list[tuple[dist.ProcessGroup, tuple[int, ...], list[nn.Parameter], frozenset[int], tuple[int, ...]]]
        self.buckets = []
        for members, group in groups.items():
            mine = [i for i, c in enumerate(copies) if c.processes == members and i in params]
            if mine:
                stages = frozenset(s for i in mine for s in holders[i])
                held = tuple(sorted({s for i in mine for s in copies[i].stages}))
                ring = exchange_devices(plan, held) if plan is not None else ()
                self.buckets.append((group, members, [params[i] for i in mine], stages, ring))
        self._done: set[int] = set()
        self._started: set[int] = set()
        self._pending: list[Launched] = []

    def begin(self) -> None:
        """A new iteration: no stage's backward has finished."""
        self._done.clear()
        self._started.clear()
        self._pending = []

    def stage_done(self, stage: int) -> None:
        """Local `stage` ran its last backward: launch every bucket whose stages have all finished (without waiting)."""
        self._done.add(stage)
        for b, (group, members, params, stages, ring) in enumerate(self.buckets):
            if b in self._started or not stages <= self._done:
                continue
            self._started.add(b)
            what = f"shared parameters' gradient all-reduce over processes {list(members)}"
            self._pending.append(launch(params, group, what, self.wire, ring))

    def finish(self) -> None:
        """Wait for every launched all-reduce and write the sums back into the gradients."""
        if len(self._started) != len(self.buckets):
            missing = [b for b in range(len(self.buckets)) if b not in self._started]
            raise RuntimeFault(f"shared parameters' buckets {missing} never had all their stages' backwards run")
        finish_all(self._pending, self.timeout)
        self._pending = []
