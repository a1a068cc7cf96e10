"""Tests of sim.cost_model: CostModel.build's defaults and checks."""

from __future__ import annotations

import math

import pytest

from pipeplan.core.errors import ClusterError, PlanError, ProfileError
from pipeplan.core.hardware.cluster import Cluster, Device
from pipeplan.core.profile import LayerProfile, ModelProfile
from pipeplan.presets.resolve import load_cluster
from pipeplan.sim.cost.model import CostModel


def profile(reference_device: str = "V100") -> ModelProfile:
    """Two layers measured at batch 4 on `reference_device`."""
    return ModelProfile(
        "toy", 4, (LayerProfile("a", 1.0, 2.0, 1e6, 1e8), LayerProfile("b", 1.0, 2.0, 1e6, 1e8)), reference_device
    )


def cluster() -> Cluster:
    """Two in-memory devices of speed 2 (speed_reference None)."""
    devices = (Device(0, "gpu", 2**34, 2.0), Device(1, "gpu", 2**34, 2.0))
    return Cluster("two", devices, ((0.0, 1e10), (1e10, 0.0)), ((0.0, 1e-3), (1e-3, 0.0)))


@pytest.mark.parametrize(("optimizer", "factor"), [("adam", 2.0), ("sgd", 0.0), ("sgd_momentum", 1.0)])
def test_optimizer_factor_defaults_to_the_optimizer_state(optimizer: str, factor: float) -> None:
    """Adam keeps two moments (2.0), SGD none (0.0), SGD with momentum one buffer (1.0)."""
    model = CostModel.build(profile(), cluster(), optimizer=optimizer)
    assert model.optimizer_factor == factor
    assert model.optimizer == optimizer


def test_an_explicit_optimizer_factor_wins() -> None:
    """optimizer_factor given overrides the optimizer's own state, as a float."""
    assert CostModel.build(profile(), cluster(), optimizer="sgd", optimizer_factor=3).optimizer_factor == 3.0
    assert CostModel.build(profile(), cluster(), optimizer="adam", optimizer_factor=0.0).optimizer_factor == 0.0


def test_build_defaults_to_auto_scaling_adam_and_no_split() -> None:
    """A plain build asks for auto scaling (floor for a one-size profile), Adam and no bwd_split."""
    model = CostModel.build(profile(), cluster())
    assert (model.scaling, model.layers.mode, model.optimizer, model.bwd_split) == ("auto", "floor", "adam", None)
    assert CostModel.build(profile(), cluster(), "linear").layers.mode == "linear"


def test_build_puts_the_cluster_on_the_profile_scale() -> None:
    """The model's cluster has speeds relative to the profile's device: an H100 profile on h100-8x4 runs at 1.0."""
    model = CostModel.build(profile("H100"), load_cluster("h100-8x4"))
    assert {d.speed for d in model.cluster.devices} == {1.0}
    assert model.cluster.speed_reference == "H100"
    unchanged = cluster()
    assert CostModel.build(profile(), unchanged).cluster is unchanged


def test_build_refuses_a_cpu_profile_on_gpus() -> None:
    """A CPU profile on a GPU cluster is a ClusterError from the build."""
    with pytest.raises(ClusterError, match=r"measured on 'cpu' but cluster 'h100-8x4' has GPUs"):
        CostModel.build(profile("cpu"), load_cluster("h100-8x4"))


@pytest.mark.parametrize("factor", [-1.0, math.nan, math.inf])
def test_a_bad_optimizer_factor_is_a_plan_error(factor: float) -> None:
    """optimizer_factor must be a finite number >= 0; the error names it and the value."""
    with pytest.raises(PlanError, match=r"optimizer_factor must be a finite number >= 0, got"):
        CostModel.build(profile(), cluster(), optimizer_factor=factor)


@pytest.mark.parametrize("split", [(0.5,), (0.2, 0.3, 0.5), (-0.1, 1.1), (1.0, -0.5)])
def test_a_bad_bwd_split_is_a_plan_error(split: tuple[float, ...]) -> None:
    """bwd_split must be two fractions >= 0; the error quotes the value."""
    with pytest.raises(PlanError, match=r"bwd_split must be two fractions >= 0 \(input, weight\), got \("):
        CostModel.build(profile(), cluster(), bwd_split=split)  # type: ignore[arg-type]


def test_a_good_bwd_split_is_kept() -> None:
    """A pair of fractions >= 0 (zero allowed) is stored as given."""
    assert CostModel.build(profile(), cluster(), bwd_split=(0.0, 1.0)).bwd_split == (0.0, 1.0)


def test_a_nan_bwd_split_is_a_plan_error() -> None:
    """A NaN fraction is not a fraction >= 0: PlanError at build time."""
    with pytest.raises(PlanError, match=r"bwd_split must be two fractions >= 0"):
        CostModel.build(profile(), cluster(), bwd_split=(0.5, math.nan))


def test_unknown_scaling_or_optimizer_is_a_profile_error() -> None:
    """The build passes scaling and optimizer checks on to LayerCosts: ProfileError naming the value."""
    with pytest.raises(ProfileError, match=r"got 'cubic'"):
        CostModel.build(profile(), cluster(), "cubic")
    with pytest.raises(ProfileError, match=r"got 'adagrad'"):
        CostModel.build(profile(), cluster(), optimizer="adagrad")
    with pytest.raises(ProfileError, match=r"--batch-scaling measured needs"):
        CostModel.build(profile(), cluster(), "measured")
