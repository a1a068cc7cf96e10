"""The predictions to hold a run against.

- The plan's prediction (`predict_plan`): the plan simulated with the profile
  and cluster it was made for, before anything runs: what `pipeplan plan`
  promised. It covers the whole step: forwards, backwards, transfers,
  all-reduce and the optimizer step; and each process's peak memory.
- The re-profiled prediction (`train --predict`): every stage profiled where
  it runs, at the plan's microbatch size, after training; the cluster is
  this job's processes as devices of speed 1 (they are the machine the
  profile was measured on), with the latency and bandwidth of a ping-pong
  between processes 0 and 1 over the job's own backend. It covers what
  `Executor.run` does, not the optimizer step.
"""

from __future__ import annotations

import copy
import dataclasses
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from pipeplan.core.hardware.cluster import Cluster, Device
from pipeplan.core.layer_profile import LayerCurve, LayerProfile
from pipeplan.core.plan import Plan
from pipeplan.core.profile import ModelProfile
from pipeplan.core.schedule import Schedule
from pipeplan.core.units import s_to_ms
from pipeplan.profiler.measure import Measurement, measure_layers, profile_module
from pipeplan.runtime.measurement.probe import link_fit
from pipeplan.runtime.transport.exchange import gather_json
from pipeplan.sim.cost.memory import memory_per_device
from pipeplan.sim.cost.model import CostModel
from pipeplan.sim.cost.plan_costs import plan_costs
from pipeplan.sim.engine.simulator import simulate
from pipeplan.sim.plan_sim import simulate_plan
from pipeplan.sim.result import SimResult


def measure_link(device: torch.device, rounds: int = 20, large_bytes: int = 1 << 22) -> tuple[float, float]:
    """(latency ms, bandwidth bytes/s) between processes 0 and 1 from ping-pongs of 8 bytes and of `large_bytes`.

    A collective call: every process must make it; processes other than 0
    and 1 only wait. With one process returns (0, inf).
    """
    if dist.get_world_size() < 2:
        return 0.0, float("inf")
    rank = dist.get_rank()
    results = []
    for size in (8, large_bytes):
        buf = torch.zeros(size // 4, dtype=torch.float32, device=device)
        times = []
        for _ in range(rounds):
            if rank == 0:
                t0 = time.perf_counter()
                dist.send(buf, 1)
                dist.recv(buf, 1)
                times.append((time.perf_counter() - t0) / 2)
            elif rank == 1:
                dist.recv(buf, 0)
                dist.send(buf, 0)
        results.append(statistics.median(times) if times else 0.0)
    info = torch.tensor(results, dtype=torch.float64)
    dist.broadcast(info, 0)
    small, large = float(info[0]), float(info[1])
    latency_s, bandwidth = link_fit([8.0, float(large_bytes)], [small, large])
    return s_to_ms(latency_s), bandwidth


def local_cluster(world_size: int, latency_ms: float, bandwidth: float) -> Cluster:
    """This job's processes as `world_size` identical devices joined by one measured link each way."""
    devices = tuple(Device(i, "local", 1e12, 1.0, 0) for i in range(world_size))
    bw = tuple(tuple(0.0 if a == b else min(bandwidth, 1e15) for b in range(world_size)) for a in range(world_size))
    lat = tuple(tuple(0.0 if a == b else latency_ms for b in range(world_size)) for a in range(world_size))
    return Cluster("local", devices, bw, lat)


def profile_layers(layers: Sequence[nn.Module], inputs: torch.Tensor, batch_size: int, runs: int = 10) -> ModelProfile:
    """Per-layer profile of copies of `layers` on `batch_size` rows of `inputs` (the training layers stay untouched)."""
    copies = [copy.deepcopy(layer) for layer in layers]
    rows = inputs[torch.arange(batch_size) % len(inputs)]
    return profile_module(copies, rows, batch_size, runs=runs, warmup=3, name="runtime")


def profile_stages(
    layers: Sequence[nn.Module], inputs: torch.Tensor, plan: Plan, owned: Sequence[int], runs: int = 10, warmup: int = 3
) -> ModelProfile | None:
    """Each process profiles the layers of the stages in `owned` at the same time; process 0 gets the whole profile.

    A collective call. Profiling every stage where it runs, concurrently,
    measures each layer under the load of a running job (on a shared CPU the
    others compete for cores as they do in training), as on a cluster each
    device would profile its own stage. `owned` is empty on processes whose
    stages another process already profiles (data-parallel copies).
    """
    b = plan.microbatch_size
    rows = inputs[torch.arange(b) % len(inputs)]
    mine: list[tuple[int, LayerProfile]] = []
    for s in owned:
        first, last = plan.stages[s].first_layer, plan.stages[s].last_layer
        with torch.no_grad():
            x = rows
            for layer in layers[:first]:
                x = layer(x)
        measured = measure_layers([copy.deepcopy(m) for m in layers[first : last + 1]], x.detach(), b, runs=runs, warmup=warmup)
        mine.extend((first + i, layer) for i, layer in enumerate(stage_calibrated(measured).layers))
    parts: list[list[list[Any]]] | None = gather_json([[i, _layer_json(layer)] for i, layer in mine])  # [index, layer] rows
    if parts is None:
        return None
    by_index = {int(i): _layer_from(layer) for part in parts for i, layer in part}
    ordered = tuple(by_index[i] for i in range(plan.num_layers))
    cuts = tuple(float(layer.activation_bytes) for layer in ordered[:-1])
    return ModelProfile("runtime", b, ordered, reference_device="local", cut_bytes=cuts, measured=True)


def _layer_json(layer: LayerProfile) -> dict[str, Any]:
    """A layer as JSON values for gather_json (its tuples become lists); `_layer_from` reads it back."""
    return dataclasses.asdict(layer)


def _layer_from(obj: dict[str, Any]) -> LayerProfile:
    """The layer `_layer_json` wrote, its lists tuples again."""
    curve = obj["curve"]
    return LayerProfile(**{
        **obj,
        "optimizer_ms": tuple((str(name), float(ms)) for name, ms in obj["optimizer_ms"]),
        "curve": None if curve is None else LayerCurve(**{k: None if v is None else tuple(v) for k, v in curve.items()}),
    })  # fmt: skip


def stage_calibrated(measured: Measurement) -> ModelProfile:
    """The layers of one stage with times scaled so that they add up to the stage measured as one chain.

    Note:
        A stage runs its layers back to back, so its weights and gradients
        compete for the caches; timed one by one, a layer finds them warm.
        For memory-bound layers (small microbatches) the difference is large
        (a chain of four 1024x1024 linear layers at batch 4: backward 11 ms as
        a chain, 6.5 ms as the sum of its layers on a shared CPU), and the
        simulator only ever adds a stage's layers up. The per-layer split is kept.
    """
    profile = measured.to_profile("stage")
    fwd_sum = sum(layer.fwd_ms for layer in profile.layers)
    bwd_sum = sum(layer.bwd_ms for layer in profile.layers)
    f = measured.whole_fwd_ms / fwd_sum if fwd_sum > 0 and measured.whole_fwd_ms > 0 else 1.0
    b = measured.whole_bwd_ms / bwd_sum if bwd_sum > 0 and measured.whole_bwd_ms > 0 else 1.0
    layers = tuple(replace(layer, fwd_ms=layer.fwd_ms * f, bwd_ms=layer.bwd_ms * b) for layer in profile.layers)
    return replace(profile, layers=layers)


def median_profile(profiles: Sequence[ModelProfile]) -> ModelProfile:
    """One profile whose layer times are the medians over `profiles` (the same model measured several times)."""
    layers = tuple(
        replace(
            group[0],
            fwd_ms=statistics.median(layer.fwd_ms for layer in group),
            bwd_ms=statistics.median(layer.bwd_ms for layer in group),
        )
        for group in zip(*(p.layers for p in profiles), strict=True)
    )
    return replace(profiles[0], layers=layers)


@dataclass(frozen=True, slots=True)
class PlanPrediction:
    """The plan's simulated step (ms, whole step) and each process's predicted peak bytes, process order."""

    result: SimResult
    memory_bytes: tuple[float, ...]
    profile: str
    cluster: str

    @property
    def step_ms(self) -> float:
        """The simulated step: forwards, backwards, transfers, all-reduce and optimizer."""
        return self.result.iteration_time


TRAIN_OPTIMIZERS = {"adam": "adam", "sgd": "sgd"}
"""train's --optimizer -> the cost model's optimizer (whose step time the profile measured)."""


def predict_plan(
    plan: Plan,
    profile: ModelProfile,
    cluster: Cluster,
    optimizer: str,
    scaling: str,
    names: tuple[str, str],
    bucket_bytes: float | None = None,
) -> PlanPrediction:
    """Simulate `plan` with the profile and cluster it was made for (module docstring); with `bucket_bytes` each
    replicated stage's all-reduce in DDP's buckets, as the run makes it (CostModel.allreduce_bucket_bytes).

    Raises:
        PlanError, ProfileError, ClusterError: the plan does not match the profile or cluster, or a bad scaling.
    """
    model = CostModel.build(
        profile, cluster, scaling, TRAIN_OPTIMIZERS.get(optimizer, optimizer), allreduce_bucket_bytes=bucket_bytes
    )
    result = simulate_plan(plan, model, record=False)
    memory = memory_per_device(plan, model, result)
    return PlanPrediction(result, tuple(memory[d] for d in plan.all_devices), *names)


def predict(plan: Plan, schedule: Schedule, profile: ModelProfile, cluster: Cluster) -> SimResult:
    """Simulate `schedule` under the cost model of `plan` with `profile` on `cluster` (no optimizer time)."""
    return simulate(schedule, plan_costs(plan, CostModel.build(profile, cluster, "linear")))


def plan_on_processes(plan: Plan) -> Plan:
    """The plan with each device id replaced by its process index (the local cluster's device ids)."""
    index = {d: i for i, d in enumerate(plan.all_devices)}
    stages = tuple(replace(s, devices=tuple(index[d] for d in s.devices)) for s in plan.stages)
    return replace(plan, stages=stages)
