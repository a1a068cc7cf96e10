"""The one cost function of layers: forward, backward, I/W, bytes and optimizer time of any set of layers at any microbatch size.

Every part of pipeplan that needs a layer's time asks `LayerCosts` (planners,
the simulator's cost model, compare, train's prediction). How times follow
the number of samples x a device processes (a microbatch of b samples split
over r replicas gives x = b / r):

- `measured` (a profile measured at several batch sizes): between measured
  sizes, linear interpolation; beyond them, the nearest segment extended; a
  time never falls below the smallest time measured for that layer (the
  measured floor). Exact at every measured size. Bytes (activation, saved,
  cut) are interpolated the same way (never below 0), so a layer whose bytes
  are affine in x, not linear, is still exact.
- `floor` (a profile measured at one size P): a per-layer fixed part that
  does not shrink with x plus a part that scales by x / P,
  F(x) = f + (F(P) - f) * x / P, with f = min(F(P), kernels * launch floor +
  weight traffic / memory bandwidth of the reference device): a forward reads
  the weights (1 kernel), a backward reads them and writes their gradients
  (2 kernels). Bytes scale by x / P.
- `linear`: F(x) = F(P) * x / P, the plain scaling most papers assume (and
  pipeplan used before), for comparison. Nothing is estimated from the
  device's memory bandwidth: no floor and no optimizer-step estimate.
- `auto` (the default): `measured` when the profile has several sizes, else `floor`.

Optimizer steps do not depend on the batch: a layer's measured step time for
the chosen optimizer when the profile has it; otherwise (measured and floor
modes) the step's memory traffic over the reference device's bandwidth plus
one launch floor (Adam reads weights, gradients and two moments and writes
weights and moments: 7 bytes per parameter byte; SGD 3; SGD with momentum 5).

Note:
    Under `linear` the sums are taken in layer order and scaled as
    sum * (b / P) / (r * speed), the exact arithmetic pipeplan used before
    costs followed the microbatch size, so every plan scores exactly what it
    scored then (tests/test_linear_golden.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from pipeplan.core.errors import ProfileError
from pipeplan.core.hardware.devices import GpuSpec, device_spec
from pipeplan.core.profile import ModelProfile
from pipeplan.core.shared_params import overlap_bytes
from pipeplan.core.units import gb_per_s_to_bytes_per_s, ms_per_byte, us_to_ms, wire_ms
from pipeplan.sim.cost.holding import PLAIN, Holding
from pipeplan.sim.cost.speeds import profile_kind

SCALINGS = ("auto", "measured", "floor", "linear")
"""How times follow the microbatch size (module docstring)."""

OPTIMIZER_STATE = {"adam": 2.0, "sgd": 0.0, "sgd_momentum": 1.0}
"""Optimizer state per parameter byte (Adam: two moments; SGD with momentum: one buffer)."""


def static_factor(optimizer_factor: float, held: Holding = PLAIN) -> float:
    """Bytes a device holds per parameter byte of its stage: the weights, their gradients, the master copy and the
    optimizer's state as `held` says (sim.cost.holding; PLAIN: 2 + optimizer_factor)."""
    return held.factor(optimizer_factor)


def static_bytes(param_bytes: Any, optimizer_factor: float, held: Holding = PLAIN) -> Any:
    """The static memory of `param_bytes` (a number or an array) without ZeRO: param_bytes x static_factor, THE
    formula every planner and the cost model use (ARCHITECTURE.md, "Memory per device"); `held` from
    sim.cost.holding.holding(profile) (CostModel.holding)."""
    return param_bytes * static_factor(optimizer_factor, held)


OPTIMIZER_TRAFFIC = {"adam": 7.0, "sgd": 3.0, "sgd_momentum": 5.0}
"""Bytes one optimizer step reads and writes per parameter byte, for the estimate of an unmeasured step."""

FWD_KERNELS, BWD_KERNELS = 1, 2
"""Kernels per layer assumed by the floor of one-size profiles: a forward, and input- plus weight-gradient backward."""


@dataclass(frozen=True, slots=True)
class StageWork:
    """Costs of a set of layers for one microbatch on one device: ms, and bytes held.

    `bwd_input_ms` / `bwd_weight_ms` are None when the profile did not
    measure the zero-bubble split (the simulator then halves the backward).
    """

    fwd_ms: float
    bwd_ms: float
    bwd_input_ms: float | None
    bwd_weight_ms: float | None
    saved_bytes: float
    param_bytes: float
    optimizer_ms: float


@dataclass(frozen=True, slots=True)
class LayerArrays:
    """Per-layer values at one number of samples: ms and bytes (numpy arrays over the layers).

    `shared[i]` is the part of `saved[i]` that layer i - 1 saves too (core.profile.LayerProfile.shared_bytes).
    """

    fwd: np.ndarray
    bwd: np.ndarray
    bwd_input: np.ndarray | None
    bwd_weight: np.ndarray | None
    saved: np.ndarray
    activation: np.ndarray
    shared: np.ndarray

    def saved_of(self, index: np.ndarray) -> float:
        """Bytes a device holds for one microbatch of the layers `index` (distinct, increasing): their saved bytes,
        a storage two neighbours both save counted once."""
        held = float(self.saved[index].sum())
        if index.size > 1 and self.shared.any():
            inner = index[1:][np.diff(index) == 1]  # layers whose predecessor is in the set
            held -= float(self.shared[inner].sum())
        return held


_STAGES_KEPT = 1 << 16
"""LayerCosts.stage keeps at most this many ranges' costs (then starts over): a bound on its memory."""


def check_scaling(scaling: str) -> str:
    """Return scaling if it is one of SCALINGS, else raise ProfileError naming the value."""
    if scaling not in SCALINGS:
        raise ProfileError(f"--batch-scaling must be one of {', '.join(SCALINGS)}, got {scaling!r}")
    return scaling


def check_optimizer(optimizer: str) -> str:
    """Return optimizer if pipeplan knows it, else raise ProfileError naming the value."""
    if optimizer not in OPTIMIZER_STATE:
        raise ProfileError(f"--optimizer must be one of {', '.join(OPTIMIZER_STATE)}, got {optimizer!r}")
    return optimizer


def interpolate(sizes: np.ndarray, values: np.ndarray, x: float, floor: np.ndarray) -> np.ndarray:
    """Piecewise-linear values (one row per layer, one column per size) at x, segments extended, never below `floor`."""
    exact = np.flatnonzero(sizes == x)
    if exact.size:
        return values[:, exact[0]].copy()
    k = int(np.searchsorted(sizes, x, side="right")) - 1
    k = min(max(k, 0), len(sizes) - 2)
    lo, hi = sizes[k], sizes[k + 1]
    out = values[:, k] + (values[:, k + 1] - values[:, k]) * ((x - lo) / (hi - lo))
    return np.maximum(out, floor)


def _in_order_sum(values: np.ndarray, layers: Sequence[int]) -> float:
    """values[layers] added one after another from 0.0, in the order given: the float a Python loop (or sum()) over
    them gives, bit for bit (np.cumsum adds in order; np.sum would add pairwise)."""
    index = np.fromiter(layers, dtype=np.int64)
    return float(np.cumsum(values[index])[-1]) if index.size else 0.0


class LayerCosts:
    """Times and bytes of layers at any number of samples, under one scaling mode (module docstring).

    Args:
        profile: the per-layer profile.
        scaling: one of SCALINGS.
        optimizer: the optimizer whose step time counts (a key of OPTIMIZER_STATE).

    Raises:
        ProfileError: an unknown scaling or optimizer, or `measured` for a profile measured at one size.
    """

    def __init__(self, profile: ModelProfile, scaling: str = "auto", optimizer: str = "adam") -> None:
        self.profile = profile
        self.scaling = check_scaling(scaling)
        self.optimizer = check_optimizer(optimizer)
        several = len(profile.sizes) > 1
        if scaling == "measured" and not several:
            raise ProfileError(
                f"--batch-scaling measured needs a profile measured at several batch sizes; {profile.name!r} has only "
                f"{profile.batch_size} (profile it with `pipeplan profile`, or use --batch-scaling floor or linear)"
            )
        self.mode = ("measured" if several else "floor") if scaling == "auto" else scaling
        kind = profile_kind(profile)
        self.spec: GpuSpec | None = device_spec(kind) if kind is not None else None
        self._arrays: dict[float, LayerArrays] = {}
        self._stages: dict[tuple[int, int, int, int, float], StageWork] = {}
        self.split_memo: dict[Any, Any] = {}
        """What sim.cost.tensor_parallel keeps per (t, sequence parallelism) for this profile."""

    # ---- per-layer values ------------------------------------------------------------------------------
    @cached_property
    def _reference(self) -> dict[str, np.ndarray | None]:
        """Per-layer values at the profile's batch size."""
        layers = self.profile.layers
        split = all(layer.bwd_input_ms is not None for layer in layers)
        return {
            "fwd": np.array([layer.fwd_ms for layer in layers]),
            "bwd": np.array([layer.bwd_ms for layer in layers]),
            "bwd_input": np.array([layer.bwd_input_ms for layer in layers], dtype=float) if split else None,
            "bwd_weight": np.array([layer.bwd_weight_ms for layer in layers], dtype=float) if split else None,
            "saved": np.array([layer.saved_bytes or 0.0 for layer in layers]),
            "activation": np.array([layer.activation_bytes for layer in layers]),
            "shared": np.array([layer.shared_bytes for layer in layers], dtype=float),
            "params": np.array([layer.param_bytes for layer in layers]),
        }

    @cached_property
    def _curves(self) -> dict[str, np.ndarray | None]:
        """Per-layer values at every measured size: arrays (layers x sizes); cuts (cuts x sizes)."""
        layers = self.profile.layers
        out: dict[str, np.ndarray | None] = {"sizes": np.array(self.profile.sizes, dtype=float)}
        for key, field in (("fwd", "fwd_ms"), ("bwd", "bwd_ms"), ("saved", "saved_bytes"), ("activation", "activation_bytes")):
            out[key] = np.array([getattr(layer.curve, field) for layer in layers], dtype=float)
        split = all(layer.curve is not None and layer.curve.bwd_input_ms is not None for layer in layers)
        out["bwd_input"] = np.array([layer.curve.bwd_input_ms for layer in layers], dtype=float) if split else None
        out["bwd_weight"] = np.array([layer.curve.bwd_weight_ms for layer in layers], dtype=float) if split else None
        zeros = (0.0,) * len(self.profile.sizes)
        out["shared"] = np.array([layer.curve.shared_bytes or zeros for layer in layers], dtype=float)  # type: ignore[union-attr]
        out["cuts"] = np.array(self.profile.cut_curves, dtype=float).reshape(len(layers) - 1, len(self.profile.sizes))
        return out

    @cached_property
    def fixed_ms(self) -> dict[str, np.ndarray]:
        """The floor model's per-layer fixed part of fwd, bwd, I and W (zeros without a known reference device)."""
        ref = self._reference
        params = ref["params"]
        assert params is not None
        if self.spec is None:
            zeros = np.zeros(len(params))
            return {"fwd": zeros, "bwd": zeros, "bwd_input": zeros, "bwd_weight": zeros}
        launch = us_to_ms(self.spec.launch_us)
        per_byte = ms_per_byte(gb_per_s_to_bytes_per_s(self.spec.hbm_gb_per_s))
        fixed = {
            "fwd": FWD_KERNELS * launch + params * per_byte,
            "bwd": BWD_KERNELS * launch + 2 * params * per_byte,
            "bwd_input": launch + params * per_byte,
            "bwd_weight": launch + params * per_byte,
        }
        out = {}
        for key, value in fixed.items():
            measured = ref[key]
            out[key] = np.minimum(value, measured) if measured is not None else value
        return out

    def arrays(self, samples: float) -> LayerArrays:
        """Every layer's values for `samples` samples on one device (cached per sample count)."""
        got = self._arrays.get(samples)
        if got is not None:
            return got
        if self.mode == "measured":
            got = self._measured(samples)
        else:
            ref = self._reference
            ratio = samples / self.profile.batch_size
            times = {}
            for key in ("fwd", "bwd", "bwd_input", "bwd_weight"):
                value = ref[key]
                if value is None or samples == self.profile.batch_size:
                    times[key] = value
                elif self.mode == "floor":
                    fixed = self.fixed_ms[key]
                    times[key] = fixed + (value - fixed) * ratio
                else:
                    times[key] = value * ratio
            saved, activation, shared = ref["saved"], ref["activation"], ref["shared"]
            assert saved is not None and activation is not None and shared is not None
            if samples != self.profile.batch_size:
                saved, activation, shared = saved * ratio, activation * ratio, shared * ratio
            got = LayerArrays(times["fwd"], times["bwd"], times["bwd_input"], times["bwd_weight"], saved, activation, shared)  # type: ignore[arg-type]
        self._arrays[samples] = got
        return got

    def _measured(self, samples: float) -> LayerArrays:
        """Interpolated curves at `samples` (module docstring)."""
        curves = self._curves
        sizes = curves["sizes"]
        assert sizes is not None

        def at(key: str, times: bool) -> np.ndarray | None:
            values = curves[key]
            if values is None:
                return None
            floor = values.min(axis=1) if times else np.zeros(len(values))
            return interpolate(sizes, values, samples, floor)

        fwd, bwd, saved, activation = at("fwd", True), at("bwd", True), at("saved", False), at("activation", False)
        shared = at("shared", False)
        assert fwd is not None and bwd is not None and saved is not None and activation is not None and shared is not None
        return LayerArrays(fwd, bwd, at("bwd_input", True), at("bwd_weight", True), saved, activation, np.minimum(shared, saved))

    # ---- the questions the rest of pipeplan asks ------------------------------------------------------
    def stage(self, layers: Sequence[int], microbatch_size: int, replicas: int = 1, speed: float = 1.0) -> StageWork:
        """Costs of `layers` (a range or any set of layer indices) for one microbatch of `microbatch_size` samples,
        split evenly over `replicas` devices of relative `speed`: per device, ms and bytes. A range's costs are kept
        (up to _STAGES_KEPT): a search prices each layer range on many devices."""
        if type(layers) is range and layers.step == 1:
            key = (layers.start, layers.stop, microbatch_size, replicas, speed)
            work = self._stages.get(key)
            if work is None:
                if len(self._stages) >= _STAGES_KEPT:
                    self._stages.clear()
                work = self._stages[key] = self._stage(layers, microbatch_size, replicas, speed)
            return work
        return self._stage(layers, microbatch_size, replicas, speed)

    def _stage(self, layers: Sequence[int], microbatch_size: int, replicas: int, speed: float) -> StageWork:
        """stage, computed."""
        selected = sorted(set(layers))
        profile_layers = self.profile.layers
        params = _in_order_sum(self._reference["params"], selected)  # type: ignore[arg-type]
        if self.profile.shared_params:  # a parameter several of these layers hold is held once
            params -= overlap_bytes(self.profile.shared_params, set(selected))
        optimizer = self.optimizer_ms(selected, speed)
        if self.mode == "linear":
            chosen = [profile_layers[i] for i in selected]
            scale = microbatch_size / self.profile.batch_size
            split = all(layer.bwd_input_ms is not None for layer in chosen)
            inp = sum(layer.bwd_input_ms for layer in chosen) * scale / (replicas * speed) if split else None  # type: ignore[misc]
            wgt = sum(layer.bwd_weight_ms for layer in chosen) * scale / (replicas * speed) if split else None  # type: ignore[misc]
            members = set(selected)
            shared = sum(profile_layers[i].shared_bytes for i in selected[1:] if i - 1 in members)
            return StageWork(
                sum(layer.fwd_ms for layer in chosen) * scale / (replicas * speed),
                sum(layer.bwd_ms for layer in chosen) * scale / (replicas * speed),
                inp,
                wgt,
                (sum(layer.saved_bytes or 0.0 for layer in chosen) - shared) * scale / replicas,
                params,
                optimizer,
            )
        arrays = self.arrays(microbatch_size / replicas)
        index = np.asarray(selected, dtype=np.int64)

        def total(values: np.ndarray | None) -> float | None:
            return None if values is None else float(values[index].sum()) / speed

        fwd, bwd = total(arrays.fwd), total(arrays.bwd)
        assert fwd is not None and bwd is not None
        return StageWork(fwd, bwd, total(arrays.bwd_input), total(arrays.bwd_weight), arrays.saved_of(index), params, optimizer)

    def cut_bytes(self, last_layer: int, microbatch_size: int) -> float:
        """Bytes crossing a cut after `last_layer` for one whole microbatch (before any split over replicas)."""
        cuts = self.profile.cut_bytes
        assert cuts is not None
        if self.mode != "measured":
            return cuts[last_layer] * (microbatch_size / self.profile.batch_size)
        curves = self._curves
        sizes, values = curves["sizes"], curves["cuts"]
        assert sizes is not None and values is not None
        row = values[last_layer : last_layer + 1]
        return float(interpolate(sizes, row, float(microbatch_size), np.zeros(1))[0])

    def optimizer_ms(self, layers: Sequence[int], speed: float = 1.0) -> float:
        """One step of the optimizer over `layers`' parameters on a device of relative `speed`: measured, else estimated."""
        return _in_order_sum(self.optimizer_steps_ms, layers) / speed

    @cached_property
    def optimizer_steps_ms(self) -> np.ndarray:
        """Per layer, one step of the optimizer over its parameters on a speed-1 device: measured, else estimated (0
        without either). Computed once: summing it per stage walked every layer's fields at every stage cost (half of
        planning a 20,000-layer chain)."""
        out = np.zeros(self.profile.num_layers)
        for i, layer in enumerate(self.profile.layers):
            measured = layer.optimizer_step_ms(self.optimizer)
            if measured is not None:
                out[i] = measured
            elif self.mode != "linear" and self.spec is not None and layer.param_bytes > 0:
                traffic = OPTIMIZER_TRAFFIC[self.optimizer] * layer.param_bytes
                out[i] = us_to_ms(self.spec.launch_us) + wire_ms(traffic, gb_per_s_to_bytes_per_s(self.spec.hbm_gb_per_s))
        return out

    def per_layer_ms(self, samples: float) -> np.ndarray:
        """Forward + backward ms of every layer for `samples` samples on a speed-1 device (planner heuristics)."""
        arrays = self.arrays(samples)
        return arrays.fwd + arrays.bwd
