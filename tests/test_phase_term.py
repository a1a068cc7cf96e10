"""Tests of the phase terms of the all-plan bound: exact where one phase binds, never above exact's optimum."""

from __future__ import annotations

import math

from bound_exact import exact_ms
from pipeplan.core.hardware.cluster import Cluster, Device
from pipeplan.core.profile import LayerProfile, ModelProfile
from pipeplan.planner.bound.phase_term import phase_term
from pipeplan.planner.bound.shape_bounds import ShapeBounds, lower_bound
from pipeplan.planner.request import PlanRequest

GIB = float(1 << 30)


def four_layers() -> PlanRequest:
    """Four equal layers with a small backward-input part (1 of 8 ms) on four devices, batch 4, one device per stage."""
    layer = LayerProfile(
        "same", fwd_ms=4.0, bwd_ms=8.0, activation_bytes=1e3, param_bytes=1e3, bwd_input_ms=1.0, bwd_weight_ms=7.0
    )
    devices = tuple(Device(i, "gpu", 16 * GIB, 1.0, 0) for i in range(4))
    links = tuple(tuple(0.0 if a == c else 1e12 for c in range(4)) for a in range(4))
    cluster = Cluster("four", devices, links, tuple(tuple(0.0 for _ in range(4)) for _ in range(4)))
    return PlanRequest(ModelProfile("four", 4, (layer,) * 4, "random"), cluster, 4, replication="none")


def test_backward_phase_binds_with_one_microbatch() -> None:
    """One microbatch of 4: no backward starts before the 16 ms forward path, then 32 ms of backwards over four
    devices: 24 ms, above the 20 ms path and the 12 ms of work spread over the devices."""
    request = four_layers()
    bounds = ShapeBounds(request)
    assert math.isclose(phase_term(bounds, 1, 4), 24.0, rel_tol=1e-12)
    assert bounds.terms(1, 4)[1] == 20.0


def test_bound_with_phases_is_below_exact() -> None:
    """The bound, phase terms included, stays at most exact's optimum on that instance."""
    request = four_layers()
    assert lower_bound(request).ms <= exact_ms(request) * (1 + 1e-12)
