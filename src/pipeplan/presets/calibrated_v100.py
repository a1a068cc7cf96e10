"""Calibrated presets of the seeds' V100 clusters: what PipeDream and DAPPLE ran on, with what such clusters measure.

Three families, N the number of servers (1 or more; `v100_cluster`):

- `p3-v100-8x<N>`: N servers of 8 V100 SXM2 16 GB on the DGX-1V hybrid cube-mesh, one 25 Gb/s Ethernet NIC each:
  AWS p3.16xlarge ("8 X 16G V100 GPUs with NVLink, 25Gbps Ethernet", mlsys-seo/ooo-backprop, AWS-doc/README.md).
  PipeDream's Cluster-B (2 x 8 in its Table 2) and DAPPLE's hierarchical setting (servers of 8 GPUs: the DAPPLE
  planner's `Devices::new(16, vec![8, 16])`, AlibabaPAI/DAPPLE, PLANNER_REPRODUCTION.md).
- `nc-v100-4x<N>`: N servers of 4 V100 PCIe 16 GB (no NVLink), 10 Gb/s Ethernet: PipeDream's Cluster-A (Azure
  NC24 v3 servers; the 4-GPU servers and 10 Gb/s are PipeDream's Table 1 as typed, not checked against a stored copy).
- `eth-v100-1x<N>`: N single-V100 servers on 25 Gb/s Ethernet: DAPPLE's flat setting (the planner's
  `Devices::new(16, vec![1, 2, ..., 16])`, the same file).

What is measured and what is not (each number's source is beside it below):

- 25 Gb/s Ethernet: NCCL's all-reduce over it, measured (ETH_25G_NCCL_GB_PER_S). The link between two servers and
  each server's NIC limit are that rate, so a ring across servers (one NIC per server, every crossing at the NIC's
  rate) prices its all-reduce at exactly that bus bandwidth: 2 (n - 1) / n x S / busbw (sim.cost.link_model). No
  `allreduce` field is set: its per-GPU NIC share (link_model.measured_ring_share) is the DGX A100's one-NIC-per-GPU
  rule, and these servers have one NIC for all their GPUs.
- 10 Gb/s Ethernet, PCIe 3.0 peer-to-peer and the DGX-1V's NVLinks: nominal (presets.clusters), no measurement found.
- Matmul fraction: the V100 SXM2's sustained fp16 rate (presets.calibrated.V100_MATMUL_FRACTION); the V100 PCIe's
  was not found (its device carries none). The seeds' profiles are per-layer times measured on V100s, which do not
  read it; an analytic `gpt:` profile on these clusters does.
- Latencies: nominal (50 us over TCP Ethernet, 5 us over NVLink, 10 us through PCIe), as presets.clusters.
"""

from __future__ import annotations

import re
from typing import Any

from pipeplan.core.errors import ClusterError
from pipeplan.core.hardware.devices import GPU_SPECS
from pipeplan.presets.calibrated import V100_MATMUL_FRACTION
from pipeplan.presets.clusters import (
    ETH_10G_GB_PER_S,
    ETH_US,
    PCIE3_P2P_GB_PER_S,
    PCIE_US,
    V100_PCIE_SPEED,
    V100_SPEED,
    dgx1_bandwidth_gb_per_s,
    dgx1_latency_us,
    join_nodes,
)

ETH_25G_NCCL_GB_PER_S = 1.7
"""NCCL all-reduce bus bandwidth over 25 Gb/s TCP Ethernet between two V100 servers: it "maxed out at 1.7GBps" at
large sizes (ring, simple protocol, NCCL 2.9.6; 8 ranks on 2 Azure VMs of 4 V100 PCIe 16GB, whose TCP link
measured 25 Gb/s one way and 21 Gb/s both ways with NTTTCP), NVIDIA/nccl-tests issue #83, 2021; NVIDIA's answer
there: NCCL's rate is its slowest socket's. Line rate: 3.125 GB/s. (The DAPPLE planner assumes 3.0 GB/s for NCCL and
1.0 GB/s for point-to-point over its 25 Gb/s Ethernet, AlibabaPAI/DAPPLE src/environment/ethernet.rs: constants of
a model, not measurements.)"""

ETH_10G_GB_PER_S_NOMINAL = ETH_10G_GB_PER_S
"""10 Gb/s Ethernet at line rate, 1.25 GB/s: nominal, no measurement of NCCL over 10 Gb/s Ethernet was found."""

FAMILIES = ("p3-v100-8x<N>", "nc-v100-4x<N>", "eth-v100-1x<N>")
"""The V100 families' names, N the number of servers."""

_NAME = re.compile(r"(?P<family>p3-v100-8|nc-v100-4|eth-v100-1)x(?P<nodes>[1-9][0-9]{0,4})")
_PREFIXES = ("p3-v100-", "nc-v100-", "eth-v100-")


def is_v100_name(spec: str) -> bool:
    """Whether spec looks like a V100 calibrated preset's name (one of the families' prefixes), valid or not."""
    return spec.lower().startswith(_PREFIXES)


def v100_cluster(spec: str) -> dict[str, Any]:
    """The `pipeplan.cluster/1` object of a V100 calibrated preset name (`p3-v100-8x2`: two p3.16xlarge).

    Raises:
        ClusterError: a name that is no V100 family with N >= 1 servers, naming the families.
    """
    match = _NAME.fullmatch(spec)
    if match is None:
        raise ClusterError(
            f"unknown calibrated cluster {spec!r}: the V100 calibrated presets are {', '.join(FAMILIES)} "
            "(N servers, N >= 1, e.g. p3-v100-8x2)"
        )
    nodes = int(match["nodes"])
    family = match["family"]
    if family == "p3-v100-8":
        return p3_v100(nodes)
    return nc_v100(nodes) if family == "nc-v100-4" else eth_v100(nodes)


def v100_sxm2_device() -> dict[str, Any]:
    """A V100 SXM2 16 GB (the built-in profiles' reference device, speed 1.0) with its measured matmul fraction."""
    return {
        "kind": "V100",
        "memory_gb": GPU_SPECS["V100"].memory_gib,
        "speed": V100_SPEED,
        "matmul_fraction": V100_MATMUL_FRACTION,
    }


def p3_v100(nodes: int) -> dict[str, Any]:
    """`nodes` p3.16xlarge: the DGX-1V's NVLink matrix inside (nominal), NCCL's measured 25 Gb/s rate between."""
    node = (v100_sxm2_device(), dgx1_bandwidth_gb_per_s(), dgx1_latency_us())
    return join_nodes(
        f"p3-v100-8x{nodes}",
        [node] * nodes,
        ETH_25G_NCCL_GB_PER_S,
        ETH_US,
        ETH_25G_NCCL_GB_PER_S if nodes > 1 else None,
        f"{nodes} x AWS p3.16xlarge (8 x V100 SXM2 16GB, DGX-1V hybrid cube-mesh, nominal NVLink), calibrated: "
        "25 Gb/s Ethernet at NCCL's measured 1.7 GB/s per server; fp16 matmuls at 76% of peak, sustained "
        "(sources in pipeplan/presets/calibrated_v100.py)",
    )


def nc_v100(nodes: int) -> dict[str, Any]:
    """`nodes` servers of 4 V100 PCIe on PCIe 3.0 and 10 Gb/s Ethernet, both nominal (module note)."""
    return _servers(
        f"nc-v100-4x{nodes}", nodes, 4, {"kind": "V100", "speed": V100_PCIE_SPEED},
        PCIE3_P2P_GB_PER_S, PCIE_US, ETH_10G_GB_PER_S_NOMINAL,
        f"{nodes} x 4 V100 PCIe 16GB (PipeDream's Cluster-A), nominal: PCIe 3.0 12 GB/s, 10 Gb/s Ethernet 1.25 GB/s "
        "(no measurement found; pipeplan/presets/calibrated_v100.py)",
    )  # fmt: skip


def eth_v100(nodes: int) -> dict[str, Any]:
    """`nodes` single-V100 servers on 25 Gb/s Ethernet at NCCL's measured rate (DAPPLE's flat setting)."""
    return _servers(
        f"eth-v100-1x{nodes}", nodes, 1, v100_sxm2_device(), 0.0, 0.0, ETH_25G_NCCL_GB_PER_S,
        f"{nodes} x 1 V100 SXM2 16GB (DAPPLE's flat setting), calibrated: 25 Gb/s Ethernet at NCCL's measured 1.7 GB/s; "
        "fp16 matmuls at 76% of peak, sustained (sources in pipeplan/presets/calibrated_v100.py)",
    )  # fmt: skip


def _servers(
    name: str, nodes: int, per: int, device: dict[str, Any], intra: float, intra_us: float, nic: float, notes: str
) -> dict[str, Any]:
    """Description form of `nodes` servers of `per` GPUs, one NIC of `nic` GB/s each (the link between servers)."""
    return {
        "format": "pipeplan.cluster/1",
        "name": name,
        "nodes": nodes,
        "gpus_per_node": per,
        "device": device,
        "intra_node_gb_per_s": intra,
        "inter_node_gb_per_s": nic,
        "nic_gb_per_s": nic,
        "latency_us": {"intra": intra_us, "inter": ETH_US},
        "notes": notes,
    }
