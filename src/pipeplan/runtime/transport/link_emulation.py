"""Link emulation: when a transfer on an emulated wire arrives (nominal rate x trace factor, one queue per ordered link).

Note:
    The sender of an ordered link is the only process that puts bytes on it, so it keeps the link's free time and
    stamps each message with its arrival, as the simulator's transfer queue (sim.engine.transfers) times it: a transfer
    issued at t starts at max(t, the link's free time), holds the link for latency + bytes / rate, the rate being
    nominal x the trace's factor (read when the transfer starts and re-read at every step of the trace while it is
    in flight: core.hardware.bandwidth_trace.finish_time, the simulator's own re-timing), and frees the link when it arrives. The
    receiver does not consume the message before that time. The sender's compute is never delayed, transfers on a
    link queue behind each other as on a wire, and compute overlaps them: what a slow network does to a pipeline.
    Times are ms on the trace's clock, which starts when the run starts (every process's clock is set at one
    barrier) and runs across iterations.

    A data-parallel all-reduce (and a shared parameter's exchange) is a ring over its devices in the plan's order, timed
    as the simulator times it (sim.cost.link_model.ring_allreduce_ms): 2(n-1) x the ring's largest latency, then
    2(n-1)/n x its bytes at the ring's slowest nominal rate (or the cluster's measured all-reduce rate and latency),
    that work stretched at every moment by the smallest trace factor of the ring's links (`ring_end`). It starts
    when its last participant starts it, so every participant computes the same end; it does not queue on the links
    behind the pipeline's transfers (nor they behind it), as in the simulator.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from pipeplan.core.hardware.bandwidth_trace import BandwidthTrace, finish_time
from pipeplan.core.hardware.cluster import Cluster
from pipeplan.core.hardware.links import Link
from pipeplan.core.units import gb_per_s_to_bytes_per_s, ms_to_s, s_to_ms, wire_ms
from pipeplan.runtime.rank_errors import TrainConfigError
from pipeplan.sim.cost.types import ring_links


@dataclass(frozen=True, slots=True)
class LinkRate:
    """One emulated ordered link: its nominal rate (bytes/s) and latency (ms)."""

    bytes_per_s: float
    latency_ms: float = 0.0

    def __post_init__(self) -> None:
        if not math.isfinite(self.bytes_per_s) or self.bytes_per_s <= 0:
            raise TrainConfigError(f"an emulated link needs a finite rate > 0 bytes/s, got {self.bytes_per_s}")
        if not math.isfinite(self.latency_ms) or self.latency_ms < 0:
            raise TrainConfigError(f"an emulated link needs a finite latency >= 0 ms, got {self.latency_ms}")


def check_emulated_rate(gb_per_s: float) -> float:
    """Return `gb_per_s` if it is a usable --emulate-gb-per-s, else raise TrainConfigError naming the flag."""
    if isinstance(gb_per_s, bool) or not math.isfinite(gb_per_s) or gb_per_s <= 0:
        raise TrainConfigError(f"--emulate-gb-per-s must be a finite number of GB/s > 0, got {gb_per_s}")
    return gb_per_s


def check_trace_links(trace: BandwidthTrace, devices: Iterable[int]) -> None:
    """Raise TrainConfigError for the first trace step whose link names a device the job does not run on."""
    job = sorted(set(devices))
    for i, step in enumerate(trace.steps):
        if step.link is not None:
            outside = [d for d in step.link if d not in job]
            if outside:
                raise TrainConfigError(
                    f"--bandwidth-trace step {i}: link {list(step.link)} names device {outside[0]}, which this job does "
                    f"not run on (its devices: {job})"
                )


class EmulatedLinks:
    """A job's emulated network: each ordered device pair's rate, a bandwidth trace, and every link's queue.

    Args:
        rates: the nominal rate and latency of each ordered device pair that may carry a transfer.
        trace: factors of the nominal rates over time (None: always 1).
        allreduce: a measured all-reduce's bus rate and latency (a cluster's), which a ring all-reduce runs at instead
            of its links' (None: its links').
    """

    def __init__(
        self, rates: dict[Link, LinkRate], trace: BandwidthTrace | None = None, allreduce: LinkRate | None = None
    ) -> None:
        self.rates = dict(rates)
        self.trace = trace
        self.allreduce = allreduce
        self._segments: dict[Link, tuple[tuple[float, ...], tuple[float, ...]]] = {}
        self._free_ms: dict[Link, float] = {}

    @classmethod
    def uniform(cls, devices: Iterable[int], gb_per_s: float, trace: BandwidthTrace | None = None) -> EmulatedLinks:
        """Every ordered pair of `devices` at `gb_per_s` (10^9 bytes/s), no latency: --emulate-gb-per-s."""
        rate = LinkRate(gb_per_s_to_bytes_per_s(check_emulated_rate(gb_per_s)))
        ids = sorted(set(devices))
        return cls({(a, b): rate for a in ids for b in ids if a != b}, trace)

    @classmethod
    def from_cluster(cls, cluster: Cluster, devices: Iterable[int], trace: BandwidthTrace | None = None) -> EmulatedLinks:
        """Every ordered pair of `devices` at the cluster's rate (NIC caps included) and latency, as sim prices them.

        Raises:
            ClusterError: a pair of the job's devices has no link in the cluster.
        """
        from pipeplan.sim.cost.link_model import link_arrays

        rate, latency = link_arrays(cluster)
        ids = sorted(set(devices))
        links = {}
        for a in ids:
            for b in ids:
                if a != b:
                    cluster.require_link(a, b)
                    links[(a, b)] = LinkRate(float(rate[a, b]), float(latency[a, b]))
        measured = cluster.allreduce_bytes_per_s
        allreduce = LinkRate(measured, cluster.allreduce_latency_ms) if measured is not None else None
        return cls(links, trace, allreduce)

    def free_ms(self, link: Link) -> float:
        """When `link` finishes the transfers queued on it so far (0 before any)."""
        return self._free_ms.get(link, 0.0)

    def transfer(self, link: Link, nbytes: int, issued_ms: float) -> tuple[float, float]:
        """Queue `nbytes` on `link` at `issued_ms`; return (start, arrival) in ms on the trace's clock.

        Raises:
            TrainConfigError: the link is not emulated (a device pair outside the job).
        """
        spec = self._rate(link)
        start = max(issued_ms, self._free_ms.get(link, 0.0))
        work_ms = wire_ms(nbytes, spec.bytes_per_s)
        if self.trace is None or not self.trace.affects(link):
            end = start + spec.latency_ms + work_ms
        else:
            segments = self._segments.get(link)
            if segments is None:
                segments = self._segments[link] = self.trace.segments(link)
            end = finish_time(*segments, start + spec.latency_ms, work_ms)
        self._free_ms[link] = end
        return start, end

    def factor_at(self, link: Link, t_ms: float) -> float:
        """The trace's factor on `link` at `t_ms` (1 without a trace)."""
        return 1.0 if self.trace is None else self.trace.factor_at(link, t_ms)

    def ring_parts(self, devices: tuple[int, ...], nbytes: float) -> tuple[float, float]:
        """A ring all-reduce of `nbytes` over `devices` (in that order) at the nominal rates: (total ms, latency ms),
        2(n-1)/n x nbytes / the ring's slowest rate + 2(n-1) x its largest latency (0 for fewer than 2 devices).

        Raises:
            TrainConfigError: two neighbours on the ring have no emulated link.
        """
        n = len(devices)
        if n < 2:
            return 0.0, 0.0
        ring = [self._rate(link) for link in ring_links(devices)]
        rate = min(r.bytes_per_s for r in ring) if self.allreduce is None else self.allreduce.bytes_per_s
        latency = max(r.latency_ms for r in ring) if self.allreduce is None else self.allreduce.latency_ms
        fixed = 2 * (n - 1) * latency
        return wire_ms(2 * (n - 1) / n * nbytes, rate) + fixed, fixed

    def ring_end(self, devices: tuple[int, ...], nbytes: float, start_ms: float) -> float:
        """When a ring all-reduce of `nbytes` over `devices` that starts at `start_ms` (trace ms) ends: after its latency,
        its work at each moment at the smallest factor of the ring's links (start + ring_parts' total when no step of
        the trace changes them).

        Raises:
            TrainConfigError: two neighbours on the ring have no emulated link.
        """
        total, latency = self.ring_parts(devices, nbytes)
        factors = self.trace.ring_segments(ring_links(devices)) if self.trace is not None else None
        if factors is None:
            return start_ms + total
        return finish_time(*factors, start_ms + latency, total - latency)

    def ring_slowest(self, devices: tuple[int, ...], nbytes: float) -> tuple[float, float]:
        """The longest a ring all-reduce of `nbytes` over `devices` can take under the trace: (ms, the ring's lowest
        factor), its work all at that factor after its latency.

        Raises:
            TrainConfigError: two neighbours on the ring have no emulated link.
        """
        total, latency = self.ring_parts(devices, nbytes)
        factors = self.trace.ring_segments(ring_links(devices)) if self.trace is not None else None
        lowest = min(factors[1]) if factors is not None else 1.0
        return latency + (total - latency) / lowest, lowest

    def _rate(self, link: Link) -> LinkRate:
        spec = self.rates.get(link)
        if spec is None:
            raise TrainConfigError(
                f"no emulated link {list(link)}: the emulated devices are {sorted({d for p in self.rates for d in p})}"
            )
        return spec


def slowest_link(links: EmulatedLinks) -> tuple[Link, float, float]:
    """The job's emulated link with the lowest rate it can ever see: (link, bytes/s, the trace's factor there).

    The rate is the nominal one times the smallest factor the trace gives the link at any time (1.0 without a step
    slowing it), so a transfer on it never runs slower than this.
    """
    trace = links.trace
    named = set(trace.links()) if trace is not None else set()
    unnamed: list[float] = []  # links no step names see only the "all" steps: one walk of the trace serves them all

    def lowest(link: Link) -> float:
        if trace is None or not trace.affects(link):
            return 1.0
        if link in named:
            return trace.min_factor(link)
        if not unnamed:
            unnamed.append(trace.min_factor(link))
        return unnamed[0]

    link = min(links.rates, key=lambda x: (links.rates[x].bytes_per_s * lowest(x), x))
    factor = lowest(link)
    return link, links.rates[link].bytes_per_s * factor, factor


def check_emulation_time(links: EmulatedLinks, rate_what: str, timeout_s: float, message_bytes: float | None) -> None:
    """Refuse an emulated network a run cannot finish on, before any process starts: a link whose lowest rate is
    below core.limits.EMULATED_BYTES_PER_S, or (when the largest message's bytes are known: a plan and its profile)
    one that takes longer than `timeout_s` (--timeout: how long a rank waits for a peer) on the slowest link.

    `rate_what` names where the nominal rates come from (`--emulate-gb-per-s 0.5`, or the cluster).

    Raises:
        TrainConfigError: naming the rate, the trace's factor, the estimate and the way out.
    """
    from pipeplan.core.limits import EMULATED_BYTES_PER_S, show

    if not links.rates:
        return
    link, rate, factor = slowest_link(links)
    slowed = f" x factor {factor:g} of --bandwidth-trace" if factor != 1.0 else ""
    what = f"emulated link {link[0]}->{link[1]} ({rate_what}{slowed})"
    if not EMULATED_BYTES_PER_S.allows(rate):
        raise TrainConfigError(
            f"{EMULATED_BYTES_PER_S.message(what, rate)}; raise --emulate-gb-per-s or the trace's lowest factor"
        )
    if message_bytes is not None and message_bytes / rate > timeout_s:
        seconds = message_bytes / rate
        raise TrainConfigError(
            f"{what}: the plan's largest message, {show(round(message_bytes))} bytes, takes {seconds:.3g} s at "
            f"{show(round(rate))} bytes/s, longer than --timeout {timeout_s:g} s (how long a rank waits for a peer), so "
            f"the run cannot finish; raise --timeout above {seconds:.3g}, or the emulated rate"
        )


class Wire:
    """One process's end of the emulated network: stamps each message it sends with its arrival, and holds each
    message it receives until that arrival.

    Args:
        links: the job's emulated links (the sender's queues live here).
        devices: the device of each process (process i runs devices[i]).
        origin_s: the run's start on `clock` (the trace's time 0), the same moment on every process.
        clock: seconds (time.perf_counter, the clock the executor's spans use).
        sleep: how to wait (time.sleep).
    """

    def __init__(
        self,
        links: EmulatedLinks,
        devices: tuple[int, ...],
        origin_s: float,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.links = links
        self.devices = devices
        self.origin_s = origin_s
        self._clock = clock
        self._sleep = sleep

    def now_ms(self) -> float:
        """Ms since the run started (the trace's clock)."""
        return s_to_ms(self._clock() - self.origin_s)

    def send(self, src: int, dst: int, nbytes: int) -> tuple[float, float]:
        """Queue a message of `nbytes` from process `src` to process `dst` now; its (start, arrival) in trace ms."""
        return self.links.transfer((self.devices[src], self.devices[dst]), nbytes, self.now_ms())

    def deliver(self, arrival_ms: float) -> None:
        """Return at `arrival_ms` on the trace's clock (at once when it has passed)."""
        wait_s = ms_to_s(arrival_ms - self.now_ms())
        if wait_s > 0:
            self._sleep(wait_s)


def check_allreduce_time(
    links: EmulatedLinks, rate_what: str, timeout_s: float, allreduces: Iterable[tuple[int, tuple[int, ...], float]]
) -> None:
    """Refuse, before any process starts, a data-parallel all-reduce (stage, its ring's devices, its gradient bytes:
    a plan's stages priced by its profile) that takes longer than `timeout_s` on its emulated ring at the ring's
    lowest trace factor: its participants hold the sums that long, and every peer waits for them at most --timeout.

    `rate_what` names where the nominal rates come from (`--emulate-gb-per-s 0.5`, or the cluster).

    Raises:
        TrainConfigError: naming the stage, its devices and bytes, the time, the factor and the way out.
    """
    from pipeplan.core.limits import show

    for stage, devices, nbytes in allreduces:
        ms, factor = links.ring_slowest(devices, nbytes)
        seconds = ms_to_s(ms)
        if seconds > timeout_s:
            slowed = f" x factor {factor:g} of --bandwidth-trace" if factor != 1.0 else ""
            raise TrainConfigError(
                f"stage {stage}'s data-parallel all-reduce of {show(round(nbytes))} bytes over devices {list(devices)} "
                f"takes {seconds:.3g} s on its emulated ring ({rate_what}{slowed}), longer than --timeout {timeout_s:g} s "
                f"(how long a rank waits for a peer), so the run cannot finish; raise --timeout above {seconds:.3g}, or "
                "the emulated rate"
            )
