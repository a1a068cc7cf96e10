"""Shared by the tests: cost models in one line."""

from __future__ import annotations

from typing import Any

from pipeplan.core.hardware.cluster import Cluster
from pipeplan.core.profile import ModelProfile
from pipeplan.sim.cost.model import CostModel


def linear_model(profile: ModelProfile, cluster: Cluster, **options: Any) -> CostModel:
    """The cost model with plain b/P scaling: the closed forms of the cost-model tests hold exactly under it."""
    return CostModel.build(profile, cluster, "linear", **options)


def default_model(profile: ModelProfile, cluster: Cluster, **options: Any) -> CostModel:
    """The cost model a plain `pipeplan plan` uses (batch scaling auto, Adam)."""
    return CostModel.build(profile, cluster, **options)
