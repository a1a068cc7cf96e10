"""Built-in clusters, written as `pipeplan.cluster/1` objects (GB/s, microseconds, GiB).

Each builder returns the JSON a user could have written, so a preset goes
through exactly the reader a file goes through (io/cluster_json.py).

Note:
    Device `speed` is relative to the profile's reference device, and every
    built-in profile was measured on a V100, so V100 = 1.0 here. The other
    speeds are estimates of training throughput relative to a V100:
    - A100 = 2.0: Lambda Labs expects 1.95x-2.5x over a V100 for language-
      model training ("NVIDIA A100 GPU Benchmarks for Deep Learning", 2020);
      a run in plain fp32 without TF32 would only get the fp32 peak ratio
      19.5 / 15.7 = 1.24x, one with TF32 or bf16 gets the tensor cores.
    - H100 = 5.0: the A100's 2.0 times 2.5, below the dense bf16 peak ratio
      989 / 312 = 3.2 because real training reaches a smaller share of peak.
    - V100 PCIe = 0.89: its 14 TFLOPS fp32 peak over the SXM2's 15.7 (lower
      clock at 250 W).
    For an exact number, profile the model on (or project it to) the target
    GPU and use speed 1.0.

    Link rates are nominal per-direction peaks: NVLink 2 (V100) 25 GB/s per
    link, NVLink 3 (A100) 12 links x 25 = 300 GB/s per GPU, NVLink 4 (H100)
    18 links x 25 = 450 GB/s per GPU (NVIDIA V100, A100 and H100 whitepapers);
    Ethernet and InfiniBand at line rate (25 Gb/s = 3.125 GB/s).
    Latencies are end-to-end point-to-point message latencies, not wire
    latencies: 5 us over NVLink/NVSwitch, 10 us through PCIe and host memory
    or InfiniBand, 50 us over TCP Ethernet (order-of-magnitude figures; for
    the activations moved between pipeline stages, bandwidth dominates).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pipeplan.core.hardware.devices import GPU_SPECS

V100_SPEED = 1.0
V100_PCIE_SPEED = 0.89
A100_SPEED = 2.0
H100_SPEED = 5.0

NVLINK2_GB_PER_S = 25.0
NVSWITCH_A100_GB_PER_S = 300.0
NVSWITCH_H100_GB_PER_S = 450.0
# V100 pairs without a direct NVLink in a DGX-1 talk through PCIe and the
# inter-socket link via host memory: ~10 GB/s (PCIe 3.0 x16 peak is 15.75 GB/s).
DGX1_HOST_PATH_GB_PER_S = 10.0
PCIE3_P2P_GB_PER_S = 12.0  # PCIe 3.0 x16 peer-to-peer under one switch: ~12 of 15.75 GB/s peak
ETH_25G_GB_PER_S = 25 / 8
ETH_10G_GB_PER_S = 10 / 8
IB_EDR_GB_PER_S = 100 / 8
IB_HDR_GB_PER_S = 200 / 8
IB_NDR_GB_PER_S = 400 / 8
NVLINK_US = 5.0
PCIE_US = 10.0
IB_US = 10.0
ETH_US = 50.0

# DGX-1 with V100 (hybrid cube-mesh): number of NVLinks between GPU pairs, from
# `nvidia-smi topo -m` on a DGX-1V (NV1/NV2 entries) and the DGX-1 V100 system
# architecture whitepaper. Each V100 has 6 links: GPUs 0-3 and 4-7 form two
# fully connected quads, and GPU i links to GPU i+4 with two links. Pairs not
# listed (e.g. 0-5, 1-6) have no NVLink.
DGX1_NVLINKS: dict[tuple[int, int], int] = {
    (0, 1): 1, (0, 2): 1, (0, 3): 2, (0, 4): 2,
    (1, 2): 2, (1, 3): 1, (1, 5): 2,
    (2, 3): 2, (2, 6): 1,
    (3, 7): 1,
    (4, 5): 1, (4, 6): 1, (4, 7): 2,
    (5, 6): 2, (5, 7): 1,
    (6, 7): 2,
}  # fmt: skip


def dgx1_bandwidth_gb_per_s() -> list[list[float]]:
    """8x8 GB/s between the V100s of one DGX-1: 25 per NVLink, the host path where there is none."""
    matrix = [[0.0] * 8 for _ in range(8)]
    for a in range(8):
        for b in range(8):
            if a != b:
                links = DGX1_NVLINKS.get((min(a, b), max(a, b)), 0)
                matrix[a][b] = links * NVLINK2_GB_PER_S if links else DGX1_HOST_PATH_GB_PER_S
    return matrix


def dgx1_latency_us() -> list[list[float]]:
    """8x8 microseconds within a DGX-1: NVLink pairs are faster than host-path pairs."""
    return [
        [0.0 if a == b else (NVLINK_US if (min(a, b), max(a, b)) in DGX1_NVLINKS else PCIE_US) for b in range(8)]
        for a in range(8)
    ]


def _uniform(n: int, value: float) -> list[list[float]]:
    """n x n with value off the diagonal."""
    return [[0.0 if a == b else value for b in range(n)] for a in range(n)]


def join_nodes(
    name: str,
    nodes: list[tuple[dict[str, Any], list[list[float]], list[list[float]]]],
    inter_gb_per_s: float,
    inter_us: float,
    nic_gb_per_s: float | None,
    notes: str,
) -> dict[str, Any]:
    """Matrix form of several nodes, each (device, intra GB/s matrix, intra us matrix), joined by one network."""
    devices: list[dict[str, Any]] = []
    owner: list[tuple[int, int]] = []  # (node, index inside the node) per device
    for node, (device, intra, _) in enumerate(nodes):
        for k in range(len(intra)):
            devices.append({**device, "node": node})
            owner.append((node, k))
    n = len(devices)
    bandwidth = [[0.0] * n for _ in range(n)]
    latency = [[0.0] * n for _ in range(n)]
    for a, (node_a, ka) in enumerate(owner):
        for b, (node_b, kb) in enumerate(owner):
            if a == b:
                continue
            if node_a == node_b:
                bandwidth[a][b] = nodes[node_a][1][ka][kb]
                latency[a][b] = nodes[node_a][2][ka][kb]
            else:
                bandwidth[a][b] = inter_gb_per_s
                latency[a][b] = inter_us
    result: dict[str, Any] = {
        "format": "pipeplan.cluster/1",
        "name": name,
        "devices": devices,
        "bandwidth_gb_per_s": bandwidth,
        "latency_us": latency,
        "notes": notes,
    }
    if nic_gb_per_s is not None:
        result["nic_gb_per_s"] = nic_gb_per_s
    return result


def _dgx1_node() -> tuple[dict[str, Any], list[list[float]], list[list[float]]]:
    """One DGX-1V: 8 V100 SXM2 16 GB on the hybrid cube-mesh."""
    device = {"kind": "V100", "memory_gb": GPU_SPECS["V100"].memory_gib, "speed": V100_SPEED}
    return device, dgx1_bandwidth_gb_per_s(), dgx1_latency_us()


def _dgx_a100_node() -> tuple[dict[str, Any], list[list[float]], list[list[float]]]:
    """One DGX A100: 8 A100 SXM4 40 GB on NVSwitch, 300 GB/s between any two."""
    device = {"kind": "A100", "memory_gb": GPU_SPECS["A100"].memory_gib, "speed": A100_SPEED}
    return device, _uniform(8, NVSWITCH_A100_GB_PER_S), _uniform(8, NVLINK_US)


def _description(
    name: str,
    *,
    nodes: int,
    gpus_per_node: int,
    device: dict[str, Any],
    intra: float,
    inter: float,
    nic: float,
    latency: tuple[float, float],
    notes: str,
) -> dict[str, Any]:
    """Description form of a homogeneous cluster."""
    return {
        "format": "pipeplan.cluster/1",
        "name": name,
        "nodes": nodes,
        "gpus_per_node": gpus_per_node,
        "device": device,
        "intra_node_gb_per_s": intra,
        "inter_node_gb_per_s": inter,
        "nic_gb_per_s": nic,
        "latency_us": {"intra": latency[0], "inter": latency[1]},
        "notes": notes,
    }


def v100_8x1() -> dict[str, Any]:
    """One DGX-1 with 8 V100s: non-uniform NVLink (2 links, 1 link, or none via the host)."""
    return join_nodes("v100-8x1", [_dgx1_node()], 0.0, 0.0, None, "one DGX-1V, 8 x V100 SXM2 16GB, hybrid cube-mesh NVLink")


def v100_8x2_25g() -> dict[str, Any]:
    """Two DGX-1 servers joined by one 25 Gb/s Ethernet NIC each (DAPPLE's hierarchical setting)."""
    return join_nodes(
        "v100-8x2-25g",
        [_dgx1_node(), _dgx1_node()],
        ETH_25G_GB_PER_S,
        ETH_US,
        ETH_25G_GB_PER_S,
        "2 x DGX-1V; one 25 Gb/s NIC per server, shared by its 8 GPUs",
    )


def v100_1x16_25g() -> dict[str, Any]:
    """16 single-V100 servers on 25 Gb/s Ethernet (DAPPLE's flat setting)."""
    device = {"kind": "V100", "speed": V100_SPEED}
    return _description(
        "v100-1x16-25g", nodes=16, gpus_per_node=1, device=device,
        intra=0.0, inter=ETH_25G_GB_PER_S, nic=ETH_25G_GB_PER_S, latency=(0.0, ETH_US),
        notes="16 x 1 V100 SXM2 16GB; one 25 Gb/s NIC per server",
    )  # fmt: skip


def a100_8x2() -> dict[str, Any]:
    """Two DGX A100: NVSwitch inside, 8 x 200 Gb/s HDR InfiniBand (one HCA per GPU) between them."""
    device = {"kind": "A100", "speed": A100_SPEED}
    # A GPU pair across nodes runs at its own HCA's 25 GB/s; the node's 8 HCAs
    # together (200 GB/s) are the shared per-node NIC limit.
    return _description(
        "a100-8x2", nodes=2, gpus_per_node=8, device=device,
        intra=NVSWITCH_A100_GB_PER_S, inter=IB_HDR_GB_PER_S, nic=8 * IB_HDR_GB_PER_S, latency=(NVLINK_US, IB_US),
        notes="2 x DGX A100 40GB; NVSwitch 300 GB/s; 8 x HDR 200 Gb/s per node",
    )  # fmt: skip


def _dgx_h100(name: str, nodes: int) -> dict[str, Any]:
    """DGX H100 nodes: NVSwitch 450 GB/s inside, 8 x 400 Gb/s NDR InfiniBand (one ConnectX-7 per GPU)."""
    device = {"kind": "H100", "speed": H100_SPEED}
    return _description(
        name, nodes=nodes, gpus_per_node=8, device=device,
        intra=NVSWITCH_H100_GB_PER_S, inter=IB_NDR_GB_PER_S, nic=8 * IB_NDR_GB_PER_S, latency=(NVLINK_US, IB_US),
        notes=f"{nodes} x DGX H100 80GB; NVSwitch 450 GB/s; 8 x NDR 400 Gb/s per node",
    )  # fmt: skip


def h100_8x4() -> dict[str, Any]:
    """Four DGX H100 (32 GPUs)."""
    return _dgx_h100("h100-8x4", 4)


def h100_8x128() -> dict[str, Any]:
    """128 DGX H100 (1024 GPUs, a SuperPOD-sized cluster); the network is modelled as non-blocking."""
    return _dgx_h100("h100-8x128", 128)


def pcie_4x4_10g() -> dict[str, Any]:
    """4 servers with 4 V100 PCIe 16 GB each on PCIe 3.0, joined by 10 Gb/s Ethernet."""
    device = {"kind": "V100", "speed": V100_PCIE_SPEED}
    return _description(
        "pcie-4x4-10g", nodes=4, gpus_per_node=4, device=device,
        intra=PCIE3_P2P_GB_PER_S, inter=ETH_10G_GB_PER_S, nic=ETH_10G_GB_PER_S, latency=(PCIE_US, ETH_US),
        notes="4 x 4 V100 PCIe 16GB; no NVLink; one 10 Gb/s NIC per server",
    )  # fmt: skip


def hetero_a100_v100() -> dict[str, Any]:
    """One DGX A100 (node 0) and one DGX-1V (node 1), joined by 100 Gb/s EDR InfiniBand."""
    return join_nodes(
        "hetero-a100-v100",
        [_dgx_a100_node(), _dgx1_node()],
        IB_EDR_GB_PER_S,
        IB_US,
        IB_EDR_GB_PER_S,
        "node 0: DGX A100 40GB (speed 2.0); node 1: DGX-1V (speed 1.0); one 100 Gb/s EDR link per node",
    )


CLUSTER_BUILDERS: dict[str, Callable[[], dict[str, Any]]] = {
    "v100-8x1": v100_8x1,
    "v100-8x2-25g": v100_8x2_25g,
    "v100-1x16-25g": v100_1x16_25g,
    "a100-8x2": a100_8x2,
    "h100-8x4": h100_8x4,
    "h100-8x128": h100_8x128,
    "pcie-4x4-10g": pcie_4x4_10g,
    "hetero-a100-v100": hetero_a100_v100,
}
