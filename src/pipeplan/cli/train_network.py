"""What `pipeplan train` checks before any process starts about the network it runs on (--emulate-gb-per-s,
--bandwidth-trace) and about adapting k to it (--adaptive)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipeplan.runtime.transport.network import NetworkSettings


def network_for_train(
    trace: str | None,
    gb_per_s: float | None,
    cluster: str | None,
    plan_devices: Sequence[int] | None,
    local: int | None,
) -> NetworkSettings | None:
    """The emulated network, checked against the job's devices (the plan's, else one per process: --local N or
    torchrun's WORLD_SIZE): None for the real one.

    Raises:
        TrainConfigError: no rate to emulate, a bad rate, a trace naming a device the job does not run on.
        CostError, ClusterError: an unreadable trace or cluster.
    """
    from pipeplan.runtime.transport.network import network_settings

    settings = network_settings(trace, gb_per_s, cluster)
    if settings is None:
        return None
    world = local if local is not None else int(os.environ.get("WORLD_SIZE", "0"))
    devices = list(plan_devices) if plan_devices is not None else list(range(world))
    if devices:
        settings.links(devices)
    else:  # a torchrun worker: each process checks the devices again when it builds its wire
        settings.require_rate()
        settings.read_trace()
    return settings


def adaptive_lines(adaptive: dict[str, Any]) -> list[str]:
    """The human summary of an adaptive run: k per iteration, each switch with its reason, the controller's cost."""
    ks = adaptive["k"]
    switches = [d for d in adaptive["decisions"] if d["switched"] and d["iteration"] < len(ks)]  # not after the last
    lines = [f"adaptive:  k per step {ks}; {len(switches)} switch{'es' if len(switches) != 1 else ''}"]
    lines += [f"           before step {d['iteration'] + 1}: {d['reason']}" for d in switches]
    decision_ms = [d["decision_ms"] for d in adaptive["decisions"]]
    if decision_ms and adaptive["iteration_ms"]:
        share = sum(decision_ms) / sum(adaptive["iteration_ms"])
        lines.append(
            f"           controller: {max(decision_ms):.2f} ms per decision at most, {share:.2%} of the iterations' time"
        )
    return lines
