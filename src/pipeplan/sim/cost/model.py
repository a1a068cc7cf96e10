"""The cost model of one request: a profile's layer costs, a cluster on the profile's speed scale, the optimizer."""

from __future__ import annotations

import math
from dataclasses import dataclass

from pipeplan.core.checks import check_nonneg_float
from pipeplan.core.errors import PlanError
from pipeplan.core.hardware.cluster import Cluster
from pipeplan.core.limits import OPTIMIZER_FACTOR
from pipeplan.core.profile import ModelProfile
from pipeplan.sim.cost.grad_buckets import check_bucket_bytes
from pipeplan.sim.cost.holding import Holding, holding
from pipeplan.sim.cost.layers import OPTIMIZER_STATE, LayerCosts
from pipeplan.sim.cost.speeds import on_profile_scale


@dataclass(frozen=True)
class CostModel:
    """Everything that prices a plan (ARCHITECTURE.md, "Cost model (sim)"); build it with `CostModel.build`.

    `cluster` has its speeds on the profile's scale (sim.cost.speeds). `layers`
    answers every question about layer times and bytes. `optimizer_factor`
    is optimizer state per parameter byte (memory); `bwd_split`, when set,
    overrides the zero-bubble split of every stage's backward with fractions
    (input, weight). `allreduce_bucket_bytes`, when set, prices each replicated
    stage's gradient all-reduce as DDP runs it, in buckets of that many bytes
    overlapping the last microbatch's backward (sim.cost.grad_buckets); None
    (the default): one all-reduce after the stage's last backward.

    Note: the planners' closed-form floors (planner.bound, planner.search) price
    the unbucketed all-reduce and are built from requests, which never set the
    option: it serves the callers that simulate a given plan (the seeds' DP
    baseline, benchmarks/seed_tables.py).
    """

    profile: ModelProfile
    cluster: Cluster
    layers: LayerCosts
    optimizer_factor: float
    bwd_split: tuple[float, float] | None = None
    allreduce_bucket_bytes: float | None = None

    @classmethod
    def build(
        cls,
        profile: ModelProfile,
        cluster: Cluster,
        scaling: str = "auto",
        optimizer: str = "adam",
        optimizer_factor: float | None = None,
        bwd_split: tuple[float, float] | None = None,
        allreduce_bucket_bytes: float | None = None,
    ) -> CostModel:
        """The cost model of `profile` on `cluster` (optimizer_factor None: the optimizer's own state).

        Raises:
            ProfileError: unknown scaling or optimizer, or a scaling the profile cannot give.
            ClusterError: profile and cluster speeds on different scales (a CPU profile on GPUs).
            PlanError: a bad optimizer_factor, bwd_split or allreduce_bucket_bytes.
        """
        layers = LayerCosts(profile, scaling, optimizer)
        factor = OPTIMIZER_STATE[optimizer] if optimizer_factor is None else optimizer_factor
        check_nonneg_float(PlanError, "optimizer_factor", factor, OPTIMIZER_FACTOR)
        if bwd_split is not None and (len(bwd_split) != 2 or not all(math.isfinite(f) and f >= 0 for f in bwd_split)):
            raise PlanError(f"bwd_split must be two fractions >= 0 (input, weight), got {bwd_split!r}")
        buckets = check_bucket_bytes(allreduce_bucket_bytes)
        return cls(profile, on_profile_scale(cluster, profile), layers, float(factor), bwd_split, buckets)

    @property
    def holding(self) -> Holding:
        """How a device holds the profile's parameters (sim.cost.holding): static bytes and gradient traffic."""
        return holding(self.profile)

    @property
    def scaling(self) -> str:
        """The batch scaling asked for (`auto`, `measured`, `floor`, `linear`)."""
        return self.layers.scaling

    @property
    def optimizer(self) -> str:
        """The optimizer whose steps are counted."""
        return self.layers.optimizer
