"""A plan: stages with their devices, replication, microbatching and the schedule."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from dataclasses import dataclass

from pipeplan.core.checks import check_nonneg_int, check_positive_int
from pipeplan.core.errors import PlanError
from pipeplan.core.limits import ACTIONS, DEVICES, LAYERS, SAMPLES, Limit
from pipeplan.core.schedule import Action

LAYER_INDEX = Limit(LAYERS.value - 1, "", f"a profile has at most {LAYERS.value:,} layers")
DEVICE_INDEX = Limit(DEVICES.value - 1, "", f"a cluster has at most {DEVICES.value:,} devices")


@dataclass(frozen=True, slots=True)
class Stage:
    """Layers [first_layer, last_layer] (inclusive) on `devices`.

    `devices` lists the stage's devices in every pipeline replica, replica-major:
    with rp pipeline replicas and r data-parallel replicas of the stage,
    devices[i*r:(i+1)*r] serve pipeline replica i (len(devices) = r * rp).
    With a tensor-parallel degree `tp` = t > 1 every data-parallel replica is a group of t devices, listed
    together: devices[(i*r + j)*t : (i*r + j + 1)*t] is the tensor-parallel group of data-parallel replica j in
    pipeline replica i (len(devices) = t * r * rp; a stage's processes = replicas x t). `sequence_parallel`
    (only with t > 1) also splits the activations a block keeps whole under plain tensor parallelism (layer norms,
    dropout) along the sequence (Korthikanti et al. 2022).
    """

    first_layer: int
    last_layer: int
    devices: tuple[int, ...]
    tp: int = 1
    sequence_parallel: bool = False

    def __post_init__(self) -> None:
        check_nonneg_int(PlanError, "stage first_layer", self.first_layer)
        check_nonneg_int(PlanError, "stage last_layer", self.last_layer)
        LAYER_INDEX.check(PlanError, "stage last_layer", self.last_layer)
        if self.last_layer < self.first_layer:
            raise PlanError(f"stage last_layer {self.last_layer} is before first_layer {self.first_layer}")
        if not isinstance(self.devices, tuple) or not self.devices:
            raise PlanError(f"stage {self.first_layer}..{self.last_layer} must have at least one device, got {self.devices!r}")
        if not _plain_device_ids(self.devices):
            for d in self.devices:
                check_nonneg_int(PlanError, f"stage {self.first_layer}..{self.last_layer} device", d)
                DEVICE_INDEX.check(PlanError, f"stage {self.first_layer}..{self.last_layer} device", d)
            if len(set(self.devices)) != len(self.devices):
                raise PlanError(f"stage {self.first_layer}..{self.last_layer} lists a device twice: {self.devices}")
        if type(self.tp) is not int or self.tp != 1 or self.sequence_parallel is not False:
            self._check_tensor_parallel()

    def _check_tensor_parallel(self) -> None:
        """tp: an integer >= 1 dividing the device count; sequence_parallel: a bool, true only with tp > 1."""
        where = f"stage {self.first_layer}..{self.last_layer}"
        if type(self.tp) is not int or self.tp != 1:
            check_positive_int(PlanError, f"{where} tp", self.tp)
            TP_DEGREE.check(PlanError, f"{where} tp", self.tp)
            if len(self.devices) % self.tp:
                raise PlanError(
                    f"{where} has {len(self.devices)} devices, not a multiple of its tp {self.tp} (each data-parallel "
                    "replica is a tensor-parallel group of tp devices)"
                )
        if self.sequence_parallel is not False:
            if self.sequence_parallel is not True:
                raise PlanError(f"{where} sequence_parallel must be true or false, got {self.sequence_parallel!r}")
            if self.tp == 1:
                raise PlanError(f"{where} sequence_parallel needs tp > 1 (it splits what tensor parallelism keeps whole), got 1")


TP_DEGREE = Limit(1024, "", "a tensor-parallel group has at most 1,024 devices")


def _plain_device_ids(devices: tuple[object, ...]) -> bool:
    """Whether `devices` are distinct plain ints within DEVICE_INDEX: the common case, checked by whole-tuple builtins
    (a stage on 8,192 devices is checked in well under a millisecond). False sends Stage to the per-device checks,
    which accept int subclasses and name the first bad value."""
    if set(map(type, devices)) != {int}:
        return False
    ids: tuple[int, ...] = devices  # type: ignore[assignment]
    return min(ids) >= 0 and DEVICE_INDEX.allows(max(ids)) and len(set(ids)) == len(ids)


MEMORY_MARGIN = 0.10
"""An adaptive run's default memory budget is the smallest device's memory less this share (adapt.budget): room for
what the cost model does not count (the framework's own buffers, the allocator's fragmentation, receive buffers)."""


@dataclass(frozen=True, slots=True)
class AdaptiveSetting:
    """What an adaptive (Ada-Grouper) run of a kfkb plan starts from: the plan's `k` is the first iteration's,
    `k_choices` the k the controller may pick (ascending, each 1..microbatches), `memory_budget_bytes` the most any
    device may hold at any k (the controller keeps every candidate under it)."""

    k_choices: tuple[int, ...]
    memory_budget_bytes: float

    def __post_init__(self) -> None:
        choices = self.k_choices
        if not isinstance(choices, tuple) or not choices:
            raise PlanError(f"plan adaptive.k_choices must list at least one k, got {choices!r}")
        for k in choices:
            check_positive_int(PlanError, "plan adaptive.k_choices entry", k)
        if any(b <= a for a, b in itertools.pairwise(choices)):
            raise PlanError(f"plan adaptive.k_choices must be ascending without repeats, got {list(choices)}")
        budget = self.memory_budget_bytes
        if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not math.isfinite(budget) or budget <= 0:
            raise PlanError(f"plan adaptive.memory_budget_bytes must be a finite number of bytes > 0, got {budget!r}")


@dataclass(frozen=True, slots=True)
class Plan:
    """Everything needed to run one synchronous iteration.

    `pipeline_replicas` copies of the whole pipeline each take
    global_batch / pipeline_replicas samples; see `Stage.devices` for which
    devices serve which pipeline replica (`replica_devices`).
    `chunks` is v for interleaved schedules (the stage list then holds p*v
    chunk-stages). `order` holds the explicit per-rank order for cost-dependent
    schedules (`list`), else None. `layer_order` is the order in which the
    plan places the profile's layers (a topological order of its DAG,
    core.dag): `Stage.first_layer` / `last_layer` are positions in it; None
    (and the identity, stored as None) means positions are layer indices.
    `adaptive`: for a kfkb plan, the setting its runs adapt k with (None: k stays fixed).
    `zero`: how much of each stage's state is sharded over its data-parallel group (the stage's d = devices / tp
    copies, pipeline replicas included): 0 none, 1 the optimizer state (ZeRO-1, Megatron's distributed optimizer),
    2 the gradients too (ZeRO-2). A stage with d = 1 shards nothing.
    """

    stages: tuple[Stage, ...]
    pipeline_replicas: int
    microbatches: int
    microbatch_size: int
    schedule: str
    k: int = 1
    chunks: int = 1
    order: tuple[tuple[Action, ...], ...] | None = None
    layer_order: tuple[int, ...] | None = None
    adaptive: AdaptiveSetting | None = None
    zero: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.stages, tuple) or not self.stages:
            raise PlanError("plan must have at least one stage")
        check_positive_int(PlanError, "plan pipeline_replicas", self.pipeline_replicas)
        check_positive_int(PlanError, "plan microbatches", self.microbatches)
        check_positive_int(PlanError, "plan microbatch_size", self.microbatch_size)
        check_positive_int(PlanError, "plan k", self.k)
        check_positive_int(PlanError, "plan chunks", self.chunks)
        DEVICES.check(PlanError, "plan pipeline_replicas", self.pipeline_replicas)
        SAMPLES.check(PlanError, "plan microbatch_size", self.microbatch_size)
        SAMPLES.check(PlanError, "plan global batch (pipeline_replicas x microbatches x microbatch_size)", self.global_batch)
        if self.order is not None:
            ACTIONS.check(PlanError, "plan order", sum(map(len, self.order)))
        if not isinstance(self.schedule, str) or not self.schedule:
            raise PlanError(f"plan schedule must be a schedule name, got {self.schedule!r}")
        expected = 0
        for i, stage in enumerate(self.stages):
            if stage.first_layer != expected:
                raise PlanError(f"stage {i} starts at layer {stage.first_layer}, expected {expected} (stages must be contiguous)")
            expected = stage.last_layer + 1
        if self.chunks > 1 and len(self.stages) % self.chunks:
            raise PlanError(f"plan has {len(self.stages)} stages, not a multiple of chunks={self.chunks}")
        for i, stage in enumerate(self.stages):
            if len(stage.devices) % self.pipeline_replicas:
                raise PlanError(
                    f"stage {i} has {len(stage.devices)} devices, not a multiple of pipeline_replicas={self.pipeline_replicas}"
                )
            if stage.tp > 1 and len(stage.devices) % (self.pipeline_replicas * stage.tp):
                raise PlanError(
                    f"stage {i} has {len(stage.devices)} devices, not a multiple of pipeline_replicas x tp = "
                    f"{self.pipeline_replicas} x {stage.tp}"
                )
            rank_stage = self.stages[i % self.num_ranks]
            rank_devices = rank_stage.devices
            if i >= self.num_ranks and stage.devices is not rank_devices and stage.devices != rank_devices:
                raise PlanError(
                    f"chunk-stage {i} must run on the devices of stage {i % self.num_ranks} "
                    f"({self.stages[i % self.num_ranks].devices}), got {stage.devices}"
                )
            if i >= self.num_ranks and (stage.tp, stage.sequence_parallel) != (rank_stage.tp, rank_stage.sequence_parallel):
                raise PlanError(
                    f"chunk-stage {i} must have the tp and sequence_parallel of stage {i % self.num_ranks} "
                    f"({rank_stage.tp}, {rank_stage.sequence_parallel}), got ({stage.tp}, {stage.sequence_parallel})"
                )
        self._check_zero()
        self._check_layer_order()
        self._check_adaptive()
        ranks = self.stages[: self.num_ranks]
        if len(set().union(*(s.devices for s in ranks))) != sum(len(s.devices) for s in ranks):
            used = [d for s in ranks for d in s.devices]
            twice = sorted(d for d, n in Counter(used).items() if n > 1)
            raise PlanError(f"plan uses device(s) {twice[:10]} in two stages")

    def _check_zero(self) -> None:
        """zero: 0, 1 or 2, and sharding only where some stage has a data-parallel group to shard over."""
        if self.zero == 0:
            return
        if isinstance(self.zero, bool) or self.zero not in (1, 2):
            raise PlanError(f"plan zero must be 0 (none), 1 (optimizer state) or 2 (and gradients), got {self.zero!r}")
        if all(self.data_parallel_of(s) == 1 for s in range(self.num_ranks)):
            raise PlanError(
                f"plan zero {self.zero} shards state over a stage's data-parallel replicas, but every stage has one "
                "(d = 1): set zero 0, or replicate a stage"
            )

    def _check_adaptive(self) -> None:
        """adaptive: only on a kfkb plan (the schedule whose k it changes), every k within 1..microbatches.

        The plan's k is the first iteration's; a run may change it to any of k_choices (the file reader also
        checks that the plan's k is one of them, io.plan_json)."""
        setting = self.adaptive
        if setting is None:
            return
        if not isinstance(setting, AdaptiveSetting):
            raise PlanError(f"plan adaptive must be an AdaptiveSetting or None, got {type(setting).__name__}")
        if self.schedule != "kfkb":
            raise PlanError(
                f"plan adaptive: an adaptive setting changes kfkb's k, but the plan's schedule is {self.schedule!r}; "
                "make the schedule kfkb (1f1b is kfkb with k 1) or leave out the adaptive block"
            )
        if setting.k_choices[-1] > self.microbatches:
            raise PlanError(
                f"plan adaptive.k_choices holds k={setting.k_choices[-1]}, above the plan's microbatches "
                f"{self.microbatches} (k lies in 1..microbatches)"
            )

    def _check_layer_order(self) -> None:
        """layer_order: a permutation of the stages' layers; the identity is stored as None."""
        order = self.layer_order
        if order is None:
            return
        n = self.num_layers
        if not isinstance(order, tuple) or len(order) != n:
            got = len(order) if isinstance(order, (tuple, list)) else repr(order)
            raise PlanError(f"plan layer_order must list each of the stages' {n} layers once, got {got} entries")
        seen = [False] * n
        for p, v in enumerate(order):
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < n or seen[v]:
                what = "twice" if isinstance(v, int) and 0 <= v < n else f"outside 0..{n - 1}"
                raise PlanError(f"plan layer_order position {p} names layer {v!r} {what}")
            seen[v] = True
        if all(v == p for p, v in enumerate(order)):
            object.__setattr__(self, "layer_order", None)

    @property
    def num_layers(self) -> int:
        """Number of layers covered by the stages."""
        return self.stages[-1].last_layer + 1

    @property
    def num_ranks(self) -> int:
        """Pipeline ranks: stages / chunks."""
        return len(self.stages) // self.chunks

    def replicas_of(self, stage: int) -> int:
        """Data-parallel replicas of `stage` within one pipeline replica (each a tensor-parallel group of tp devices)."""
        return len(self.stages[stage].devices) // (self.pipeline_replicas * self.stages[stage].tp)

    def data_parallel_of(self, stage: int) -> int:
        """The data-parallel degree d of `stage`: its copies over all pipeline replicas (devices / tp), the group
        its gradients are all-reduced (or its state sharded, `zero`) over."""
        return len(self.stages[stage].devices) // self.stages[stage].tp

    def replica_devices(self, stage: int, replica: int = 0) -> tuple[int, ...]:
        """The devices of `stage` that serve pipeline replica `replica` (replicas_of x tp of them)."""
        n = len(self.stages[stage].devices) // self.pipeline_replicas
        return self.stages[stage].devices[replica * n : (replica + 1) * n]

    @property
    def devices_per_pipeline(self) -> int:
        """Devices used by one pipeline replica."""
        return sum(len(self.stages[s].devices) // self.pipeline_replicas for s in range(self.num_ranks))

    @property
    def tensor_parallel_or_sharded(self) -> bool:
        """Whether any stage is tensor-parallel (tp > 1) or the plan shards state (zero > 0): a 3D plan."""
        return self.zero > 0 or any(s.tp > 1 for s in self.stages)

    @property
    def all_devices(self) -> tuple[int, ...]:
        """Every device the plan uses, sorted."""
        return tuple(sorted(d for s in self.stages[: self.num_ranks] for d in s.devices))

    @property
    def global_batch(self) -> int:
        """Samples per iteration over all pipeline replicas."""
        return self.pipeline_replicas * self.microbatches * self.microbatch_size
