"""Seeded random planning instances: small models on small clusters with uneven links (exact-gap studies, tests)."""

from __future__ import annotations

import random

from pipeplan.core.cluster import Cluster, Device
from pipeplan.core.profile import LayerProfile, ModelProfile

GIB = float(1 << 30)


def random_profile(seed: int, layers: int, batch_size: int = 8) -> ModelProfile:
    """A chain of `layers` layers with random times (fwd 1-10 ms, bwd 1-3x fwd) and sizes.

    Activations 1-64 MiB per profile batch, parameters 0-512 MiB, so transfers,
    all-reduce and memory all matter at some sizes.
    """
    rng = random.Random(seed)
    out = []
    for i in range(layers):
        fwd = rng.uniform(1.0, 10.0)
        out.append(
            LayerProfile(
                name=f"layer{i}",
                fwd_ms=round(fwd, 3),
                bwd_ms=round(fwd * rng.uniform(1.0, 3.0), 3),
                activation_bytes=float(rng.randint(1, 64) << 20),
                param_bytes=float(rng.randint(0, 512) << 20),
            )
        )
    return ModelProfile(f"random-{seed}-{layers}", batch_size, tuple(out), "random")


def random_cluster(seed: int, devices: int, memory_gib: float = 16.0) -> Cluster:
    """`devices` devices with a random asymmetric bandwidth matrix (1-50 GB/s) and latencies (2-50 us).

    Speeds are 1.0 or, with probability 1/4, 0.5-2.0; nodes hold two devices each.
    """
    rng = random.Random(seed * 7919 + devices)
    devs = tuple(
        Device(i, "gpu", memory_gib * GIB, round(rng.uniform(0.5, 2.0), 2) if rng.random() < 0.25 else 1.0, i // 2)
        for i in range(devices)
    )
    bandwidth = tuple(tuple(0.0 if a == b else rng.uniform(1.0, 50.0) * 1e9 for b in range(devices)) for a in range(devices))
    latency = tuple(tuple(0.0 if a == b else rng.uniform(2.0, 50.0) * 1e-6 for b in range(devices)) for a in range(devices))
    return Cluster(f"random-{seed}-{devices}", devs, bandwidth, latency)
