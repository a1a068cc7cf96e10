"""The emulated network of a train job (--emulate-gb-per-s, --bandwidth-trace), checked against the job's devices and
priced before any process starts: its slowest link, its largest message and its replicated stages' all-reduces."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipeplan.api.train.train_inputs import Loaded
    from pipeplan.core.hardware.cluster import Cluster
    from pipeplan.core.plan import Plan
    from pipeplan.core.profile import ModelProfile
    from pipeplan.runtime.transport.network import NetworkSettings


def network_for_train(
    trace: str | None,
    gb_per_s: float | None,
    cluster: Loaded[Cluster] | None,
    plan_devices: Sequence[int] | None,
    local: int | None,
    timeout_s: float = 300.0,
    message_bytes: float | None = None,
    allreduces: Sequence[tuple[int, tuple[int, ...], float]] = (),
) -> NetworkSettings | None:
    """The emulated network, checked against the job's devices (the plan's, else one per process: --local N or
    torchrun's WORLD_SIZE) and priced: its slowest link's lowest rate above the floor, and the largest message
    (`message_bytes`, when known) moved within `timeout_s` (link_emulation.check_emulation_time), and each of
    `allreduces` (stage_allreduces) on its ring as well (check_allreduce_time). None for the real one. The trace is
    read here, once (NetworkSettings.loaded); `cluster` (the links' rates without `gb_per_s`) is as the launcher read
    it (api.train.train_inputs): the --local launcher's workers get both in its TrainConfig and open no file.

    Raises:
        TrainConfigError: no rate to emulate, a bad rate, a trace naming a device the job does not run on, a rate
            the run cannot finish on.
        CostError, ClusterError: an unreadable trace or cluster.
    """
    if trace is None and gb_per_s is None:
        return None
    from pipeplan.runtime.transport.link_emulation import check_allreduce_time, check_emulated_rate, check_emulation_time
    from pipeplan.runtime.transport.network import NetworkSettings

    if gb_per_s is not None:
        check_emulated_rate(gb_per_s)
    rated = None if gb_per_s is not None else cluster
    # the trace read once, here: every process of the job runs these steps
    settings = NetworkSettings(trace, gb_per_s, None if rated is None else rated.spec,
                               cluster_value=None if rated is None else rated.get()).loaded()  # fmt: skip
    world = local if local is not None else int(os.environ.get("WORLD_SIZE", "0"))
    devices = list(plan_devices) if plan_devices is not None else list(range(world))
    if devices:
        rates = f"--emulate-gb-per-s {gb_per_s:g}" if gb_per_s is not None else f"cluster {settings.cluster}'s rate"
        links = settings.links(devices)
        check_emulation_time(links, rates, timeout_s, message_bytes)
        check_allreduce_time(links, rates, timeout_s, allreduces)
    else:  # a torchrun worker: each process checks the devices again when it builds its wire
        settings.require_rate()
    return settings


def largest_message_bytes(
    plan: Plan | None, profile: ModelProfile | str | None, cluster: Cluster | str | None, scaling: str
) -> float | None:
    """Bytes of the largest activation (or its gradient) one microbatch of `plan` sends across a stage boundary, from
    its profile's cut bytes (before any split over replicated stages: an upper bound on one message), or None
    without a plan, profile and cluster (values, or names: api.arguments.load_profile) to price it with."""
    if plan is None or profile is None or cluster is None or len(plan.stages) < 2:
        return None
    from pipeplan.api.arguments import load_cluster, load_profile
    from pipeplan.sim.cost.chain_view import chain_view
    from pipeplan.sim.cost.model import CostModel

    chain, model = chain_view(plan, CostModel.build(load_profile(profile), load_cluster(cluster), scaling))
    return max(model.layers.cut_bytes(s.last_layer, chain.microbatch_size) for s in chain.stages[:-1])


def stage_allreduces(
    plan: Plan | None, profile: ModelProfile | str | None, cluster: Cluster | str | None, scaling: str
) -> list[tuple[int, tuple[int, ...], float]]:
    """Each replicated stage of `plan` as (stage, its devices: the all-reduce's ring, its parameters' bytes from the
    profile), or none without a plan, profile and cluster (values, or names) to price them with."""
    if plan is None or profile is None or cluster is None:
        return []
    from pipeplan.api.arguments import load_cluster, load_profile
    from pipeplan.sim.cost.chain_view import chain_view
    from pipeplan.sim.cost.model import CostModel

    chain, model = chain_view(plan, CostModel.build(load_profile(profile), load_cluster(cluster), scaling))
    return [
        (s, stage.devices, model.layers.stage(range(stage.first_layer, stage.last_layer + 1), 1, 1, 1.0).param_bytes)
        for s, stage in enumerate(chain.stages)
        if len(stage.devices) > 1
    ]
