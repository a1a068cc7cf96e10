"""What each process of a resumed job will load its checkpoint into, known before any process starts: the job's
fingerprint and every process's stages and optimizer, built as the workers build them (the same model, plan,
schedule and stage modules), so the launcher checks a checkpoint's names, shapes and dtypes against the model."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from pipeplan.models.stage import StageModule
from pipeplan.models.traced.graph_stage import GraphStage
from pipeplan.runtime.execution.optim import distinct, make_optimizer
from pipeplan.runtime.placement import Topology
from pipeplan.runtime.training.train_config import TrainConfig

Targets = dict[int, tuple[dict[int, nn.Module], torch.optim.Optimizer]]
"""process -> (its stages' modules by stage index, an optimizer over their parameters)."""


def resume_targets(config: TrainConfig, world: int) -> tuple[dict[str, Any], Targets]:
    """The fingerprint this job writes and checks, and each process's stage modules and optimizer (no process group,
    no weights trained: only names, shapes and dtypes are read).

    Raises:
        PipeplanError: the model, plan or schedule do not fit (as a worker would say it).
    """
    model = config.build()
    plan, schedule = config.resolve(len(model.layers), world)
    topology = Topology(plan, schedule, world)
    order = list(plan.layer_order) if plan.layer_order is not None else list(range(len(model.layers)))
    built: dict[int, nn.Module] = {}
    targets: Targets = {}
    for role in topology.roles:
        for s in role.stages:
            if s not in built:
                first, last = plan.stages[s].first_layer, plan.stages[s].last_layer
                is_last = s == schedule.num_stages - 1
                if model.graph is None:
                    built[s] = StageModule(s, model.layers[first : last + 1], s == 0, is_last, False).module
                else:
                    built[s] = GraphStage(s, model.layers, model.graph, order, first, last, is_last, False).module
        modules = {s: built[s] for s in sorted(role.stages)}
        params = distinct(p for s in sorted(modules) for p in modules[s].parameters())
        targets[role.process] = (modules, make_optimizer(config.optimizer, params, config.lr))
    return config.fingerprint(plan, schedule, world), targets
