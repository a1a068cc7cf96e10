"""Tests of planner.plan_space against brute force: every shape, microbatch size and split of the space."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeplan.planner.plan_space import (
    EXACT_COVERED,
    EXACT_SCHEDULES,
    allows_order,
    divisors,
    full_splits,
    microbatch_sizes,
    power_of_two,
    shapes,
    shapes_with_counts,
    tensor_degrees,
)
from pipeplan.planner.request import PlanRequest
from planner_instances import random_cluster, random_profile


def _request(devices: int, batch: int, size: int | None, replication: str) -> PlanRequest:
    return PlanRequest(random_profile(0, 4), random_cluster(0, devices), batch, microbatch_size=size, replication=replication)


@given(st.integers(1, 5000))
def test_divisors_are_every_divisor_ascending(n: int) -> None:
    assert divisors(n) == [d for d in range(1, n + 1) if n % d == 0]


def test_power_of_two() -> None:
    assert [n for n in range(0, 70) if power_of_two(n)] == [1, 2, 4, 8, 16, 32, 64]


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 9), st.integers(1, 96), st.booleans(), st.sampled_from(["any", "none"]))
def test_shapes_are_every_replica_count_and_size_by_brute_force(devices: int, batch: int, fixed: bool, replication: str) -> None:
    size = next((b for b in (3, 2, 1) if batch % b == 0), 1) if fixed else None
    request = _request(devices, batch, size, replication)
    expected = [
        (rp, b)
        for rp in range(1, devices + 1)
        if batch % rp == 0 and (replication == "any" or rp == 1)
        for b in range(1, batch // rp + 1)
        if (batch // rp) % b == 0 and (size is None or b == size)
    ]
    assert shapes(request) == expected
    assert shapes_with_counts(request) == [(rp, batch // (rp * b), b) for rp, b in expected]


def test_microbatch_sizes_filter_and_the_requests_own() -> None:
    request = _request(4, 48, None, "any")
    assert microbatch_sizes(request, 48) == [1, 2, 3, 4, 6, 8, 12, 16, 24, 48]
    assert microbatch_sizes(request, 48, power_of_two) == [1, 2, 4, 8, 16]
    # a request's size is the whole space, whatever a planner's filter keeps
    assert microbatch_sizes(_request(4, 48, 6, "any"), 48, power_of_two) == [6]
    assert microbatch_sizes(_request(4, 48, 6, "any"), 12 * 5, power_of_two) == [6]
    assert microbatch_sizes(_request(4, 48, 6, "any"), 8) == []


@given(st.integers(1, 200), st.integers(1, 300))
def test_full_splits_use_every_device(devices: int, batch: int) -> None:
    expected = [(devices // g, g) for g in range(1, devices + 1) if devices % g == 0 and batch % (devices // g) == 0]
    assert full_splits(devices, batch) == expected


def test_exact_schedules() -> None:
    assert EXACT_SCHEDULES == (("1f1b", 1), ("zb-h1", 1), ("kfkb", 2), ("kfkb", 3), ("kfkb", 4), ("gpipe", 1))
    assert set(EXACT_COVERED) == {"gpipe", "1f1b", "kfkb", "zb-h1"}


def test_allows_order_is_auto_or_list() -> None:
    assert [n for n in ("auto", "list", "1f1b", "gpipe", "kfkb", "zb-h1", "interleaved-1f1b") if allows_order(n)] == [
        "auto",
        "list",
    ]


def test_tensor_degrees_are_one_without_splits_else_those_a_server_and_every_width_allow() -> None:
    """No split layer: [1] (every current instance plans as before); with splits: t in 1, 2, 4, 8 dividing the
    smallest server's device count and every split layer's width."""
    import dataclasses

    from pipeplan.core.hardware.cluster import Cluster, Device
    from pipeplan.core.profile import TensorSplit

    plain = _request(8, 16, None, "any")
    assert tensor_degrees(plain) == [1]
    assert tensor_degrees(dataclasses.replace(plain, tensor_parallel=1)) == [1]
    widths = (16, 12)  # 8 does not divide 12
    layers = tuple(dataclasses.replace(x, tp=TensorSplit("block", widths[i % 2])) for i, x in enumerate(plain.profile.layers))
    profile = dataclasses.replace(plain.profile, layers=layers)
    for per_node, expected in ((8, [1, 2, 4]), (2, [1, 2]), (6, [1, 2])):
        devices = tuple(Device(i, "A100", 80 * 2**30, 1.0, i // per_node) for i in range(2 * per_node))
        n = len(devices)
        links = tuple(tuple(0.0 if a == b else 1e9 for b in range(n)) for a in range(n))
        cluster = Cluster("c", devices, links, tuple(tuple(0.0 for _ in range(n)) for _ in range(n)))
        assert tensor_degrees(PlanRequest(profile, cluster, 16)) == expected
        # a forced degree is the only one, even past a server (the plan then notes it): 4 divides both widths
        assert tensor_degrees(PlanRequest(profile, cluster, 16, tensor_parallel=4)) == [4]
