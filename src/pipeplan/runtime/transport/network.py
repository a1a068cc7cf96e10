"""The network a training job runs on: real, or emulated (--emulate-gb-per-s, --bandwidth-trace) on the real transport.

`NetworkSettings` is torch-free, so `train` checks it before any process starts; `make_wire` and `shared_origin`
run on every process of the job.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from pipeplan.core.hardware.bandwidth_trace import BandwidthTrace
from pipeplan.core.hardware.cluster import Cluster
from pipeplan.io.bandwidth_trace_json import read_bandwidth_trace
from pipeplan.runtime.rank_errors import TrainConfigError
from pipeplan.runtime.transport.link_emulation import EmulatedLinks, Wire, check_emulated_rate, check_trace_links


@dataclass(frozen=True, slots=True)
class NetworkSettings:
    """How to emulate the links: `gb_per_s` on every link, else `cluster`'s link rates (a file or built-in name);
    `trace` a bandwidth trace file whose clock starts with the run; `trace_steps` its steps as the launcher read them
    (`loaded`), so that no process reads the file again (None: read from `trace` when needed); `cluster_value` the
    cluster as the launcher read it (None: read from `cluster` when needed)."""

    trace: str | None = None
    gb_per_s: float | None = None
    cluster: str | None = None
    trace_steps: BandwidthTrace | None = None
    cluster_value: Cluster | None = None

    def loaded(self) -> NetworkSettings:
        """These settings with the trace file and the cluster read once, here (their values carried from now on).

        Raises:
            CostError: the trace is missing, not JSON, or has a bad entry (naming it).
            ClusterError: the cluster does not read.
        """
        return replace(self, trace_steps=self.read_trace(), cluster_value=self.read_cluster())

    def read_cluster(self) -> Cluster | None:
        """The cluster that gives the links their rates (None without one).

        Raises:
            ClusterError: the cluster does not read.
        """
        if self.cluster_value is not None or self.cluster is None:
            return self.cluster_value
        from pipeplan.presets.resolve import load_cluster

        return load_cluster(self.cluster)

    def read_trace(self) -> BandwidthTrace | None:
        """The bandwidth trace (None without one).

        Raises:
            CostError: the file is missing, not JSON, or has a bad entry (naming it).
        """
        if self.trace_steps is not None:
            return self.trace_steps
        return None if self.trace is None else read_bandwidth_trace(self.trace)

    def links(self, devices: Iterable[int]) -> EmulatedLinks:
        """The emulated links between `devices` (the job's), checked.

        Raises:
            TrainConfigError: no rate to emulate, a bad rate, or a trace step naming a device outside the job.
            CostError, ClusterError: an unreadable trace or cluster.
        """
        ids = sorted(set(devices))
        self.require_rate()
        trace = self.read_trace()
        if trace is not None:
            check_trace_links(trace, ids)
        if self.gb_per_s is not None:
            return EmulatedLinks.uniform(ids, check_emulated_rate(self.gb_per_s), trace)
        cluster = self.read_cluster()
        assert cluster is not None
        return EmulatedLinks.from_cluster(cluster, ids, trace)

    def require_rate(self) -> None:
        """Raise TrainConfigError when nothing gives the links a rate to emulate."""
        if self.gb_per_s is None and self.cluster is None and self.cluster_value is None:
            raise TrainConfigError(
                f"--bandwidth-trace {self.trace} needs a rate to emulate: give --emulate-gb-per-s X (GB/s on every link), "
                "or --plan with a cluster file that gives each link's rate"
            )


def make_wire(settings: NetworkSettings, devices: tuple[int, ...]) -> Wire:
    """This process's end of the emulated network for a job whose process i runs devices[i]; its clock is set by
    `shared_origin` when the run starts."""
    return Wire(settings.links(devices), devices, origin_s=time.perf_counter())


def shared_origin() -> float:
    """The run's start on this process's perf_counter: process 0's moment on one host (perf_counter is one clock
    there), else the end of a barrier (processes on other hosts then disagree by the barrier's skew). Collective."""
    import torch.distributed as dist

    from pipeplan.runtime.transport.exchange import all_gather_json

    dist.barrier()
    here = time.perf_counter()
    everyone: list[list[Any]] = all_gather_json([socket.gethostname(), here])  # [host, moment] each
    hosts = {str(host) for host, _ in everyone}
    return float(everyone[0][1]) if len(hosts) == 1 else here
