"""Seeded random planning instances: small models on small clusters with uneven links (exact-gap studies, tests)."""

from __future__ import annotations

import random

from pipeplan.core.hardware.cluster import Cluster, Device
from pipeplan.core.profile import LayerProfile, ModelProfile
from pipeplan.core.units import s_to_ms, us_to_s
from pipeplan.planner.request import PlanRequest

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
    latency = tuple(
        tuple(0.0 if a == b else s_to_ms(us_to_s(rng.uniform(2.0, 50.0))) for b in range(devices)) for a in range(devices)
    )  # 2 to 50 us
    return Cluster(f"random-{seed}-{devices}", devs, bandwidth, latency)


def fuzz_request(seed: int, large: bool = False) -> PlanRequest:
    """A seeded random planning request built from the real profiles and random clusters (planner fuzzing).

    The profile is a shared one, 40 % of the time a random slice of at least 3
    layers of it (cut bytes kept). The cluster has 1-8 nodes of 1-8 devices
    (`large`: 9-32 nodes of 4 or 8), intra-node 5-300 GB/s and inter-node 1-50
    GB/s, half the time with per-pair noise (x0.3-1.0), a NIC limit on 60 % of
    multi-node clusters, heterogeneous speeds and kinds on 30 %, and a device
    with 8-80 GiB on 20 % of devices (else 32 GiB). The global batch is one of
    8..1024; microbatch size and schedule are left open most of the time.
    """
    from pipeplan.presets.resolve import list_profiles, load_profile

    rng = random.Random(seed)
    profile = load_profile(rng.choice(sorted(list_profiles())))
    if rng.random() < 0.4 and profile.num_layers > 4:
        a = rng.randrange(0, profile.num_layers - 3)
        b = rng.randrange(a + 3, profile.num_layers + 1)
        cuts = profile.cut_bytes[a : b - 1] if profile.cut_bytes is not None else None
        profile = ModelProfile(f"{profile.name}[{a}:{b}]", profile.batch_size, profile.layers[a:b], cut_bytes=cuts)
    if large:
        nodes, per = rng.choice([9, 12, 16, 24, 32]), rng.choice([4, 8])
    else:
        nodes, per = rng.choice([1, 1, 2, 2, 3, 4, 5, 8]), rng.choice([1, 2, 3, 4, 6, 8])
    n = nodes * per
    hetero = rng.random() < 0.3
    devices = []
    for i in range(n):
        node = i // per
        speed = 1.0
        if hetero:
            speed = round(rng.uniform(0.4, 2.5), 2) if rng.random() < 0.5 else (1.5 if node % 2 else 1.0)
        memory = rng.choice([8, 16, 32, 40, 80]) * GIB if rng.random() < 0.2 else 32 * GIB
        devices.append(Device(i, rng.choice(["a", "b"]) if hetero else "gpu", memory, speed, node))
    intra, inter = rng.uniform(5, 300) * 1e9, rng.uniform(1, 50) * 1e9
    noisy = rng.random() < 0.5

    def rate(a: int, b: int) -> float:
        base = intra if devices[a].node == devices[b].node else inter
        return base * (rng.uniform(0.3, 1.0) if noisy else 1.0)

    bandwidth = tuple(tuple(0.0 if a == b else rate(a, b) for b in range(n)) for a in range(n))
    near, far = s_to_ms(5e-6), s_to_ms(20e-6)  # 5 and 20 us, through seconds: the floats the golden plans were made with
    latency = tuple(
        tuple(0.0 if a == b else (near if devices[a].node == devices[b].node else far) for b in range(n)) for a in range(n)
    )
    nic = rng.uniform(5, 50) * 1e9 if nodes > 1 and rng.random() < 0.6 else None
    cluster = Cluster(f"fuzz-{seed}", tuple(devices), bandwidth, latency, nic)
    batch = rng.choice([8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024])
    size = rng.choice([None, None, None, 1, 2, 4])
    if size is not None and batch % size:
        size = None
    schedule = rng.choice(["auto"] * 6 + ["1f1b", "gpipe", "zb-h1", "kfkb", "interleaved-1f1b", "list"])
    return PlanRequest(profile, cluster, batch, size, schedule)


def every_cut(layers: int, parts: int) -> list[list[tuple[int, int]]]:
    """Every split of `layers` layers into `parts` contiguous non-empty chunks, as (first, last) pairs."""
    import itertools

    out = []
    for inner in itertools.combinations(range(1, layers), parts - 1):
        edges = [0, *inner, layers]
        out.append([(edges[i], edges[i + 1] - 1) for i in range(parts)])
    return out
