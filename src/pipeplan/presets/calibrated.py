"""Calibrated presets of real systems: DGX A100 and DGX H100 clusters of N nodes, with what such clusters measure.

A calibrated preset carries measured rates, not line rates: the link between two GPUs of a node is NCCL's
effective NVLink/NVSwitch bandwidth (what a ring all-reduce's bus bandwidth shows), the link between nodes one
NIC's measured rate, each node's NIC limit its NICs' measured sum, the cluster's `allreduce` the bus bandwidth a
large all-reduce reaches (inside the node on one node, across nodes otherwise), and each GPU's `matmul_fraction`
the share of its bf16 peak a large matrix multiply reaches. Each number names its source beside it; where no
measurement was found the nominal value stays, said so.

Names: `dgx-a100-8x<N>` and `dgx-h100-8x<N>`, N the number of nodes (1 or more; `calibrated_cluster`).

Note:
    Bus bandwidth (nccl-tests' busbw) is defined so that a ring all-reduce of S bytes over n ranks takes
    2 (n - 1) / n x S / busbw: exactly the ring pipeplan prices over links of that rate (sim.cost.link_model).
    So the intra-node link rate is the measured ring busbw, and the cross-node all-reduce rate is the busbw a
    ring reaches when each node's NICs carry it: NCCL runs one ring channel per NIC, so that bus bandwidth is
    bounded by NICs per node x one NIC's rate (nccl-tests issue #119: 4 HDR NICs per node, 84.8 GB/s average and
    96 GB/s peak busbw over 3 nodes, against 4 x 24 = 96).

    Latencies are not calibrated: no published per-message latency of these systems was found (nccl-tests'
    small-message all-reduce times mix several steps and algorithms: 46 us for 4 bytes over 2 x 8 Hopper GPUs
    with NDR, NVIDIA/nccl issue #1244, is no per-hop latency). They keep presets.clusters' nominal 5 us over
    NVSwitch and 10 us over InfiniBand.

    Device speeds stay their kinds' (core.hardware.devices), so a profile priced for the same kind (an analytic
    profile, presets.gpt_profile) runs at speed 1.0 on these GPUs and a V100 profile at the kinds' ratio.
"""

from __future__ import annotations

import re
from typing import Any

from pipeplan.core.errors import ClusterError
from pipeplan.presets.clusters import IB_US, NVLINK_US

# --- DGX A100 (8 x A100-SXM4-80GB on NVSwitch, 8 x HDR 200 Gb/s InfiniBand per node) ---------------------------

A100_NVSWITCH_BUSBW_GB_PER_S = 232.5
"""nccl-tests all_reduce_perf on one 8 x A100 NVSwitch node (-b 8 -e 4G -f 2 -g 8): 232.54 GB/s busbw at the largest
sizes (NVIDIA/nccl-tests issue #175, 2023; the same run in NVIDIA/nccl issue #1048). Line rate: 300 GB/s."""

A100_HDR_NIC_GB_PER_S = 24.0
"""One HDR 200 Gb/s HCA between two A100 nodes: NCCL all-reduce with NCCL_IB_HCA=mlx5_0 reached 24 GB/s
(NVIDIA/nccl issue #1048, 2023); 3 nodes with 4 HCAs each: 84.8 GB/s average, 96 GB/s peak busbw = 4 x 24
(NVIDIA/nccl-tests issue #119, 2022). Line rate: 25 GB/s."""

A100_MATMUL_FRACTION = 0.737
"""Sustained fp16 matmul rate measured on an A100 80GB: 230 of 312 TFLOP/s (73.7%), an 8192 x 8192 x 8192 `a @ b` timed
as the median of a loop run for at least 3 s (torch.utils.benchmark blocked_autorange, min_run_time=3)
(mli/transformers-benchmarks, README.md "Micro-Benchmarking Summary", measured with its micro_bench.ipynb; the
README's setup is NVIDIA's PyTorch 22.07 container, the A100 run's own software versions are not stated). The
short-burst best shape is higher (A100_MATMUL_BURST_FRACTION); a training step keeps the GPU under load for seconds,
and the sustained rate is the one such a step sees: the burst finder's author calls the power-saturated sustained rate
(MSMF) the one that "matches real training throughput" (stas00/ml-engineering,
compute/accelerator/benchmarks/README.md), and publishes it only for newer GPUs (H200: 702.9 sustained against 828.0
burst TFLOP/s)."""

A100_MATMUL_BURST_FRACTION = 0.859
"""Largest bf16 matmul throughput found on an A100 SXM in a short burst: 267.9 of 312 TFLOP/s (85.9%), shape
6912x16384x2048, CUDA 12.1, the mean of 100 matmuls after 50 warm-up at the best shape of a search
(stas00/ml-engineering, compute/accelerator/README.md, "Maximum Achievable Matmul FLOPS comparison table", its
mamf-finder.py). Not used to price anything: the ceiling A100_MATMUL_FRACTION's sustained rate sits below."""

A100_HBM_FRACTION = 0.88
"""Largest HBM read bandwidth a hand-written streaming kernel reached on an A100 80GB SXM: 1.80 of 2.04 TB/s (88%),
confirmed by Nsight Compute; the same thread cites a GTC talk where no kernel passed ~90% (NVIDIA developer forums,
"Trouble to Reach Peak Bandwidth of A100", 2025). Prices memory-bound operators (presets.gpt_profile)."""

# --- DGX H100 (8 x H100-SXM5-80GB on NVSwitch, 8 x NDR 400 Gb/s InfiniBand per node) ----------------------------

H100_NVLINK_RING_GB_PER_S = 370.0
"""NCCL's effective NVLink 4 bandwidth on H100, seen as busbw of non-all-reduce collectives or of all-reduce with
NCCL_ALGO=RING: ~370 GB/s, the 450 GB/s line rate less ~20% protocol overhead (S. Jeaugey, NVIDIA, in
NVIDIA/nccl-tests issue #212, 2024)."""

H100_NVLS_BUSBW_GB_PER_S = 476.0
"""all_reduce_perf on one 8 x H100 node with NVLink SHARP (NCCL's default there): 476 GB/s busbw, "in the expected
range for H100" (NVIDIA/nccl-tests issue #290, 2025); NVIDIA quotes a peak of ~480 GB/s on 8 GPUs (issue #212)."""

H100_NDR_NIC_GB_PER_S = 47.0
"""One NDR 400 Gb/s ConnectX-7 through NCCL: 46-48 GB/s per NIC (NVIDIA, in NVIDIA/nccl-tests issue #290, 2025;
48-49 GB/s in issue #267). Line rate: 50 GB/s."""

H100_MATMUL_FRACTION = 0.801
"""Largest bf16 matmul throughput found on an H100 SXM: 792.1 of 989 TFLOP/s (80.1%), shape 6144x17920x2816,
CUDA 12.1 (stas00/ml-engineering, compute/accelerator/README.md, the same table as the A100's). A short-burst
figure, unlike the A100's: no sustained H100 measurement was found. The same source's sustained rate for the H200
(the H100's compute with more memory) is 702.9 of 828.0 burst TFLOP/s (0.849 of it, compute/accelerator/
benchmarks/README.md); it is not borrowed here, and no published H100 run is simulated to check either."""

NICS_PER_NODE = 8
"""DGX A100 and DGX H100 have one compute NIC per GPU (NVIDIA DGX A100 and DGX H100 user guides)."""

V100_MATMUL_FRACTION = 0.76
"""Sustained fp16 matmul rate measured on a V100 16GB: 95 of 125 TFLOP/s (76%), the same 8192^3 `a @ b` loop of at
least 3 s as A100_MATMUL_FRACTION's (mli/transformers-benchmarks, README.md "Micro-Benchmarking Summary")."""

MATMUL_FRACTIONS: dict[str, float] = {
    "A100-80GB": A100_MATMUL_FRACTION,
    "A100": A100_MATMUL_FRACTION,
    "H100": H100_MATMUL_FRACTION,
    "V100": V100_MATMUL_FRACTION,
}
"""The measured matmul fraction of each GPU kind that has one (the A100 40GB shares the 80GB's compute)."""

HBM_FRACTIONS: dict[str, float] = {"A100-80GB": A100_HBM_FRACTION}
"""The measured achievable fraction of nominal HBM bandwidth of each GPU kind that has one (the A100 40GB's HBM2 is
another memory; no measurement of it is at hand, so it and every other kind use the nominal bandwidth)."""

_NAME = re.compile(r"dgx-(?P<gpu>a100|h100)-8x(?P<nodes>[1-9][0-9]{0,5})")
FAMILIES = ("dgx-a100-8x<N>", "dgx-h100-8x<N>")
"""The calibrated families' names, N the number of nodes."""


def is_calibrated_name(spec: str) -> bool:
    """Whether spec looks like a calibrated preset's name (starts `dgx-`), valid or not."""
    return spec.lower().startswith("dgx-")


def calibrated_cluster(spec: str) -> dict[str, Any]:
    """The `pipeplan.cluster/1` object of a calibrated preset name (`dgx-a100-8x4`: four DGX A100).

    Raises:
        ClusterError: a name that is no calibrated family with N >= 1 nodes, naming the families.
    """
    match = _NAME.fullmatch(spec)
    if match is None:
        raise ClusterError(
            f"unknown calibrated cluster {spec!r}: the calibrated presets are {' and '.join(FAMILIES)} "
            "(N nodes of 8 GPUs, N >= 1, e.g. dgx-a100-8x4)"
        )
    nodes = int(match["nodes"])
    return dgx_a100(nodes) if match["gpu"] == "a100" else dgx_h100(nodes)


def dgx_a100(nodes: int) -> dict[str, Any]:
    """`nodes` DGX A100 80GB: measured NVSwitch ring rate inside, one measured HDR NIC per GPU between nodes."""
    allreduce = A100_NVSWITCH_BUSBW_GB_PER_S if nodes == 1 else NICS_PER_NODE * A100_HDR_NIC_GB_PER_S
    return _dgx(
        f"dgx-a100-8x{nodes}", nodes, {"kind": "A100-80GB", "matmul_fraction": A100_MATMUL_FRACTION},
        A100_NVSWITCH_BUSBW_GB_PER_S, A100_HDR_NIC_GB_PER_S, allreduce,
        f"{nodes} x DGX A100 80GB, calibrated: NVSwitch ring 232.5 GB/s and HDR 24 GB/s per NIC as NCCL measures them; "
        "fp16/bf16 matmuls at 73.7% of peak, sustained (sources in pipeplan/presets/calibrated.py)",
    )  # fmt: skip


def dgx_h100(nodes: int) -> dict[str, Any]:
    """`nodes` DGX H100: measured NVLink 4 ring rate inside, one measured NDR NIC per GPU between nodes; a one-node
    all-reduce at NVLink SHARP's measured bus bandwidth."""
    allreduce = H100_NVLS_BUSBW_GB_PER_S if nodes == 1 else NICS_PER_NODE * H100_NDR_NIC_GB_PER_S
    return _dgx(
        f"dgx-h100-8x{nodes}", nodes, {"kind": "H100", "matmul_fraction": H100_MATMUL_FRACTION},
        H100_NVLINK_RING_GB_PER_S, H100_NDR_NIC_GB_PER_S, allreduce,
        f"{nodes} x DGX H100, calibrated: NVLink ring 370 GB/s (476 GB/s all-reduce with NVLink SHARP) and NDR 47 GB/s "
        "per NIC as NCCL measures them; bf16 matmuls at 80.1% of peak (sources in pipeplan/presets/calibrated.py)",
    )  # fmt: skip


def _dgx(name: str, nodes: int, device: dict[str, Any], intra: float, nic: float, allreduce: float, notes: str) -> dict[str, Any]:
    """Description form of `nodes` 8-GPU servers, one NIC per GPU; the all-reduce's per-step latency is the slowest
    link's nominal latency (module note)."""
    return {
        "format": "pipeplan.cluster/1",
        "name": name,
        "nodes": nodes,
        "gpus_per_node": 8,
        "device": device,
        "intra_node_gb_per_s": intra,
        "inter_node_gb_per_s": nic,
        "nic_gb_per_s": NICS_PER_NODE * nic,
        "latency_us": {"intra": NVLINK_US, "inter": IB_US},
        "allreduce": {"gb_per_s": allreduce, "latency_us": NVLINK_US if nodes == 1 else IB_US},
        "notes": notes,
    }
