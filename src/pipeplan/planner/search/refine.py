"""Simulator-in-the-loop improvement: device placement by swaps and moves, then stage boundaries by +-delta layers."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from pipeplan.core.errors import PipeplanError
from pipeplan.core.hardware.cluster import Cluster
from pipeplan.core.plan import Plan, Stage
from pipeplan.planner.search.scoring import Evaluator

IMPROVES = 1 - 1e-9
"""A change is kept when it lowers the time below this fraction of the current one."""

SMALL_PLAN_DEVICES = 32
"""Single-device swaps and moves are tried only on plans with at most this many devices."""


def with_rank_devices(plan: Plan, rank_devices: list[tuple[int, ...]]) -> Plan | None:
    """`plan` with rank r on rank_devices[r] (chunk-stages follow their rank); None if invalid."""
    p = plan.num_ranks
    stages = tuple(Stage(s.first_layer, s.last_layer, rank_devices[i % p]) for i, s in enumerate(plan.stages))
    try:
        return dataclasses.replace(plan, stages=stages)
    except PipeplanError:
        return None


def twin_classes(cluster: Cluster) -> tuple[int, ...]:
    """Per device, the smallest id of its twins: same node, speed and memory, same links to every other device.

    Swapping twins maps a plan onto an isomorphic one with the same time, so the local search skips it.
    A device is compared only with the earlier class representatives of its own (node, speed, memory), rows and
    columns as whole arrays, and a described cluster's untouched devices of one node at once (LinkMatrix.twins).
    """
    devices = cluster.devices
    classes = list(range(len(devices)))
    representatives: dict[tuple[int, float, float], list[int]] = {}
    for b, device in enumerate(devices):
        group = representatives.setdefault((device.node, device.speed, device.memory_bytes), [])
        twin = next((a for a in group if _twins(cluster, a, b)), None)
        if twin is None:
            group.append(b)
        else:
            classes[b] = twin
    return tuple(classes)


def _twins(cluster: Cluster, a: int, b: int) -> bool:
    """Whether a and b have the same bandwidth and latency to and from every other device, and a->b equals b->a."""
    return cluster.bandwidth_bytes_per_s.twins(a, b) and cluster.latency_ms.twins(a, b)


def placement_moves(plan: Plan, cluster: Cluster, twins: tuple[int, ...]) -> Iterator[list[tuple[int, ...]]]:
    """Neighbouring placements, in a fixed order: swap two ranks' device sets, then (small plans) swap
    two devices of different ranks, then replace a used device by an unused one; swaps of twins are skipped."""
    p = plan.num_ranks
    ranks = [plan.stages[r].devices for r in range(p)]
    for a in range(p):
        for b in range(a + 1, p):
            if len(ranks[a]) == len(ranks[b]):
                moved = list(ranks)
                moved[a], moved[b] = ranks[b], ranks[a]
                yield moved
    slots = [(r, i) for r in range(p) for i in range(len(ranks[r]))]
    if len(slots) > SMALL_PLAN_DEVICES:
        return
    for x, (ra, ia) in enumerate(slots):
        for rb, ib in slots[x + 1 :]:
            if ra == rb or twins[ranks[ra][ia]] == twins[ranks[rb][ib]]:
                continue
            moved = [list(d) for d in ranks]
            moved[ra][ia], moved[rb][ib] = ranks[rb][ib], ranks[ra][ia]
            yield [tuple(d) for d in moved]
    used = {d for devs in ranks for d in devs}
    for ra, ia in slots:
        seen: set[int] = set()
        for spare in range(cluster.num_devices):
            if spare not in used and twins[spare] not in seen and twins[spare] != twins[ranks[ra][ia]]:
                seen.add(twins[spare])
                moved = [list(d) for d in ranks]
                moved[ra][ia] = spare
                yield [tuple(d) for d in moved]


def improve_placement(plan: Plan, evaluator: Evaluator, max_evaluations: int = 400, twins: tuple[int, ...] | None = None) -> Plan:
    """First-improvement hill climbing over placement_moves, scored by the simulator.

    `twins`: the cluster's twin_classes when the caller has them (computed here for small plans otherwise).
    """
    best = evaluator.score(plan).time_ms
    if twins is None:
        small = plan.devices_per_pipeline * plan.pipeline_replicas <= SMALL_PLAN_DEVICES
        twins = twin_classes(evaluator.cluster) if small else ()
    evaluations = 0
    improved = True
    while improved and evaluations < max_evaluations:
        improved = False
        for rank_devices in placement_moves(plan, evaluator.cluster, twins):
            candidate = with_rank_devices(plan, rank_devices)
            if candidate is None:
                continue
            evaluations += 1
            # a move whose floor cannot beat the best is not simulated (it counts as an evaluation all the same)
            if evaluator.floor(candidate) < best * IMPROVES and (time := evaluator.score(candidate).time_ms) < best * IMPROVES:
                plan, best, improved = candidate, time, True
                break
            if evaluations >= max_evaluations:
                break
    return plan


def shift_boundary(plan: Plan, boundary: int, delta: int) -> Plan | None:
    """Move the cut after stage `boundary` by `delta` layers; None if a stage would become empty."""
    stages = list(plan.stages)
    left, right = stages[boundary], stages[boundary + 1]
    cut = left.last_layer + delta
    if cut < left.first_layer or cut >= right.last_layer:
        return None
    stages[boundary] = Stage(left.first_layer, cut, left.devices)
    stages[boundary + 1] = Stage(cut + 1, right.last_layer, right.devices)
    return dataclasses.replace(plan, stages=tuple(stages))


def refine_boundaries(plan: Plan, evaluator: Evaluator, max_evaluations: int = 400) -> Plan:
    """Move each stage boundary by +-delta layers (delta halving down to 1) while the simulated time improves."""
    best = evaluator.score(plan).time_ms
    layers = plan.num_layers
    delta = 1
    while delta * 4 * len(plan.stages) <= layers:
        delta *= 2
    evaluations = 0
    while delta >= 1 and evaluations < max_evaluations:
        improved = False
        for boundary in range(len(plan.stages) - 1):
            for step in (delta, -delta):
                while evaluations < max_evaluations:
                    candidate = shift_boundary(plan, boundary, step)
                    if candidate is None:
                        break
                    evaluations += 1
                    if evaluator.floor(candidate) >= best * IMPROVES:  # cannot improve: not simulated
                        break
                    time = evaluator.score(candidate).time_ms
                    if time >= best * IMPROVES:
                        break
                    plan, best, improved = candidate, time, True
        if not improved:
            delta //= 2
    return plan
