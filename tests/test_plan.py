"""Tests of the Plan and Stage values: contiguity, replicas and device checks."""

from __future__ import annotations

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
