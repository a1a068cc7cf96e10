"""Tests of the Plan and Stage values: contiguity, replicas and device checks."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from pipeplan.core.errors import PlanError
from pipeplan.core.plan import Plan, Stage


def test_replica_devices_are_replica_major() -> None:
    """With 2 pipeline replicas and 2 replicas of stage 0, devices[0:2] serve pipeline 0 and [2:4] pipeline 1."""
    plan = Plan((Stage(0, 1, (0, 1, 4, 5)), Stage(2, 3, (2, 6))), 2, 4, 2, "1f1b")
    assert plan.replicas_of(0) == 2 and plan.replicas_of(1) == 1
    assert plan.replica_devices(0, 1) == (4, 5) and plan.replica_devices(1, 1) == (6,)
    assert plan.devices_per_pipeline == 3 and plan.global_batch == 16


def test_a_device_in_two_stages_is_named_alone() -> None:
    """The error names only the device used twice, not the whole device list."""
    with pytest.raises(PlanError, match=r"uses device\(s\) \[3\] in two stages"):
        Plan((Stage(0, 0, (0, 1, 2, 3)), Stage(1, 1, (3, 4, 5, 6))), 1, 2, 4, "1f1b")


def test_stages_must_be_contiguous() -> None:
    """A gap between stages names the stage and the expected first layer."""
    with pytest.raises(PlanError, match="stage 1 starts at layer 3, expected 2"):
        Plan((Stage(0, 1, (0,)), Stage(3, 4, (1,))), 1, 2, 1, "1f1b")


def test_stage_devices_must_split_over_pipeline_replicas() -> None:
    """A stage whose device count is not a multiple of pipeline_replicas is rejected with both numbers."""
    with pytest.raises(PlanError, match="stage 0 has 3 devices, not a multiple of pipeline_replicas=2"):
        Plan((Stage(0, 0, (0, 1, 2)),), 2, 2, 1, "1f1b")


def test_layer_order_must_be_a_permutation_and_the_identity_is_none() -> None:
    """A layer order that repeats or misses a layer is refused naming the position; the identity is stored as None."""
    stages = (Stage(0, 1, (0,)), Stage(2, 3, (1,)))
    assert Plan(stages, 1, 2, 1, "1f1b", layer_order=(0, 1, 2, 3)).layer_order is None
    assert Plan(stages, 1, 2, 1, "1f1b", layer_order=(0, 2, 1, 3)).layer_order == (0, 2, 1, 3)
    with pytest.raises(PlanError, match="position 2 names layer 1 twice"):
        Plan(stages, 1, 2, 1, "1f1b", layer_order=(0, 1, 1, 3))
    with pytest.raises(PlanError, match="layer_order must list each of the stages' 4 layers once, got 3"):
        Plan(stages, 1, 2, 1, "1f1b", layer_order=(0, 1, 2))


def test_a_tensor_parallel_stage_counts_replicas_times_tp_devices() -> None:
    """A stage's devices are replicas x tp per pipeline replica, each group of tp listed together."""
    plan = Plan((Stage(0, 1, (0, 1, 2, 3, 8, 9, 10, 11), tp=2), Stage(2, 3, (4, 5, 6, 7, 12, 13, 14, 15), tp=4)), 2, 4, 4, "1f1b")
    assert [plan.replicas_of(s) for s in (0, 1)] == [2, 1]
    assert [plan.data_parallel_of(s) for s in (0, 1)] == [4, 2]
    assert plan.replica_devices(0, 1) == (8, 9, 10, 11) and plan.devices_per_pipeline == 8
    assert plan.tensor_parallel_or_sharded and not sample_plan_2d().tensor_parallel_or_sharded


def sample_plan_2d() -> Plan:
    """A plan without tensor parallelism or sharding."""
    return Plan((Stage(0, 1, (0, 1)), Stage(2, 3, (2, 3))), 1, 4, 4, "1f1b")


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Stage(0, 1, (0, 1, 2), tp=2), "stage 0..1 has 3 devices, not a multiple of its tp 2"),
        (lambda: Stage(0, 1, (0, 1), tp=0), "stage 0..1 tp must be an integer >= 1, got 0"),
        (lambda: Stage(0, 1, (0, 1), tp=True), "stage 0..1 tp must be an integer >= 1, got True"),
        (lambda: Stage(0, 1, (0,), sequence_parallel=True), "stage 0..1 sequence_parallel needs tp > 1"),
        (lambda: Stage(0, 1, (0, 1), tp=2, sequence_parallel=1), "sequence_parallel must be true or false, got 1"),
        (
            lambda: Plan((Stage(0, 1, (0, 1, 2, 3), tp=4),), 2, 1, 1, "1f1b"),
            "stage 0 has 4 devices, not a multiple of pipeline_replicas x tp = 2 x 4",
        ),
        (lambda: Plan((Stage(0, 1, (0, 1)),), 1, 1, 2, "1f1b", zero=3), "plan zero must be 0 .* got 3"),
        (
            lambda: Plan((Stage(0, 1, (0, 1), tp=2), Stage(2, 2, (2,))), 1, 1, 2, "1f1b", zero=1),
            "plan zero 1 shards state over a stage's data-parallel replicas, but every stage has one",
        ),
        (
            lambda: Plan((Stage(0, 0, (0, 1), tp=2), Stage(1, 1, (0, 1))), 1, 2, 2, "interleaved", chunks=2),
            "chunk-stage 1 must have the tp and sequence_parallel of stage 0",
        ),
    ],
)
def test_bad_tensor_parallel_or_sharding_fields_name_field_and_value(build: Callable[[], object], message: str) -> None:
    """tp, sequence_parallel and zero are refused with the field and the value."""
    with pytest.raises(PlanError, match=message):
        build()


def test_sharding_is_allowed_once_some_stage_is_replicated() -> None:
    """zero 2 with one replicated stage is a plan; its unreplicated stage shards nothing (d = 1)."""
    plan = Plan((Stage(0, 1, (0, 1, 2, 3), tp=2), Stage(2, 2, (4,))), 1, 1, 2, "1f1b", zero=2)
    assert plan.zero == 2 and [plan.data_parallel_of(s) for s in (0, 1)] == [2, 1]
