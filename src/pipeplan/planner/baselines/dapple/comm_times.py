"""DAPPLE's communication times: stage-to-stage transfers (split-concat) and the all-reduce of a stage's weights.

The rule of the authors' planner (HPGO, `split_concat.rs`, `data_parallel.rs`),
which the paper leaves open: a transfer into a stage on one machine pays the
cross-machine point-to-point rate for the share of senders on other machines;
into a stage spread over machines it pays the cross-machine collective rate
unless senders and receivers fit one machine together. An all-reduce over n
GPUs moves 2 (n-1)/n of the weights at the collective rate, or inside one
machine at the local rate times floor(n/2) (the links of an NVLink cube mesh).
HPGO hard-codes V100 rates (HPGO_RATES); the baseline reads them from the
cluster (rates_of).
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeplan.core.hardware.cluster import Cluster
from pipeplan.planner.baselines.dapple.gpus import Machines
from pipeplan.sim.cost.link_model import device_nodes, link_arrays


@dataclass(frozen=True, slots=True)
class LinkRates:
    """Bytes/s: `local` (inside a machine), `remote_p2p` (between machines, one pair) and `remote_collective`
    (between machines, a collective or many pairs)."""

    local: float = 25e9
    remote_p2p: float = 1e9
    remote_collective: float = 3e9


HPGO_RATES = LinkRates()
"""The constants hard-coded in HPGO (V100 NVLink 25 GB/s, Ethernet 1 GB/s point to point, 3 GB/s NCCL)."""


def rates_of(cluster: Cluster) -> LinkRates:
    """The cluster's rates: the slowest link inside a machine, the slowest between machines for both remote kinds
    (effective rates, NIC caps applied); a rate that has no link (one machine, one GPU each) is the other one."""
    rate, _ = link_arrays(cluster)
    within, between = rate.extremes(device_nodes(cluster)) if cluster.num_devices > 1 else (1e9, 1e9)
    within = within if within != float("inf") else between
    between = between if between != float("inf") else within
    return LinkRates(float(within), float(between), float(between))


def transfer_s(machines: Machines, rates: LinkRates, senders: int, receivers: int, num_bytes: float) -> float:
    """Seconds to move `num_bytes` from GPU set `senders` to GPU set `receivers` (bitmasks), split evenly."""
    if machines.within_one(receivers):
        home = machines.machine_of(receivers.bit_length() - 1)
        remote = senders.bit_count() - machines.on_machine(senders, home)
        if remote:
            return num_bytes / senders.bit_count() * remote / rates.remote_p2p
        return num_bytes / rates.local
    if machines.within_one(senders | receivers):
        return num_bytes / rates.local
    return num_bytes / rates.remote_collective


def allreduce_s(machines: Machines, rates: LinkRates, gpus: int, param_bytes: float) -> float:
    """Seconds to all-reduce `param_bytes` of weights over GPU set `gpus` (0 for one GPU)."""
    n = gpus.bit_count()
    if n == 1:
        return 0.0
    share = 2.0 * param_bytes * (n - 1) / n
    if machines.within_one(gpus):
        return share / rates.local / (n // 2)
    return share / rates.remote_collective


def spread_allreduce_s(rates: LinkRates, n: int, param_bytes: float) -> float:
    """allreduce_s over n GPUs spanning machines."""
    return 0.0 if n == 1 else 2.0 * param_bytes * (n - 1) / n / rates.remote_collective
