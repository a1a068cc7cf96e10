"""A model's DAG seen through a plan: layer orders, the chain profile of an order, stages as sets of layers.

A partition of a DAG into stages S1..Sp whose every prefix union S1 ∪ .. ∪ Sk
is a down-set (closed under inputs) is exactly a topological order of the
layers in which every stage is a contiguous range. A plan therefore carries
a layer order (`Plan.layer_order`) and contiguous stages over it; pricing it
is pricing the chain profile of that order (`reorder`). A chain profile
(`layer_inputs` None) has one order, the identity.

The bytes that cross the boundary after position k are the outputs of the
live set: layers at positions <= k with a consumer at a position > k, in
increasing position order (a tensor made in stage 1 and consumed in stage 3
crosses both boundaries). A layer without consumers (the model's output, a
side output) crosses nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from pipeplan.core.errors import PlanError
from pipeplan.core.plan import Plan
from pipeplan.core.profile import LayerCurve, LayerProfile, ModelProfile, live_cuts

__all__ = ["check_order", "consumers_of", "inputs_of", "live_cuts", "order_from_stages", "reorder", "stage_layers"]


def inputs_of(profile: ModelProfile) -> tuple[tuple[int, ...], ...]:
    """Per layer, the indices of the layers it consumes (a chain's layer i consumes layer i - 1)."""
    if profile.layer_inputs is not None:
        return profile.layer_inputs
    return tuple(() if i == 0 else (i - 1,) for i in range(profile.num_layers))


def consumers_of(inputs: Sequence[Sequence[int]]) -> tuple[tuple[int, ...], ...]:
    """Per layer, the indices of the layers that consume its output (ascending)."""
    out: list[list[int]] = [[] for _ in inputs]
    for v, sources in enumerate(inputs):
        for u in sources:
            out[u].append(v)
    return tuple(tuple(c) for c in out)


def is_identity(order: Sequence[int]) -> bool:
    """True when `order` is 0, 1, 2, ...: the profile's own order."""
    return all(v == i for i, v in enumerate(order))


def layer_label(profile: ModelProfile, index: int) -> str:
    """'layer 4 (node5:Conv2d)': a layer by index and name, for messages."""
    return f"layer {index} ({profile.layers[index].name})"


def check_order(profile: ModelProfile, order: Sequence[int]) -> tuple[int, ...]:
    """`order` as a tuple when it is a permutation of the profile's layers that puts every input before its consumer.

    Raises:
        PlanError: naming the position and layer that repeats, is unknown or missing, or comes before one of its inputs.
    """
    n = profile.num_layers
    if len(order) != n:
        raise PlanError(f"the layer order has {len(order)} entries but profile {profile.name!r} has {n} layers")
    position = [-1] * n
    for p, v in enumerate(order):
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < n:
            raise PlanError(f"the layer order's position {p} names layer {v!r}, not a layer index 0..{n - 1}")
        if position[v] >= 0:
            raise PlanError(f"the layer order places {layer_label(profile, v)} twice (positions {position[v]} and {p})")
        position[v] = p
    for v, sources in enumerate(inputs_of(profile)):
        for u in sources:
            if position[u] > position[v]:
                raise PlanError(
                    f"the layer order puts {layer_label(profile, v)} (position {position[v]}) before its input "
                    f"{layer_label(profile, u)} (position {position[u]})"
                )
    return tuple(order)


def reorder(profile: ModelProfile, order: Sequence[int]) -> ModelProfile:
    """The chain profile of `order`: layers in that order, inputs renumbered, cut bytes (and cut curves) of the live sets.

    The identity order gives `profile` itself. A layer keeps its shared bytes
    (a tensor it saves with the layer before it) only when that layer stays
    right before it; otherwise both hold their copy. Shared parameter groups
    name their layers' new positions.

    Raises:
        PlanError: `order` is not a topological order of the profile's layers (check_order).
    """
    order = check_order(profile, order)
    if is_identity(order):
        return profile
    position = {v: p for p, v in enumerate(order)}
    old_inputs = inputs_of(profile)
    inputs = tuple(tuple(sorted(position[u] for u in old_inputs[v])) for v in order)
    layers = tuple(_placed(profile.layers[v], p > 0 and order[p - 1] == v - 1) for p, v in enumerate(order))
    cut_bytes = live_cuts([layer.activation_bytes for layer in layers], inputs)
    cut_curves = None
    if profile.batch_sizes is not None:
        per_size = [
            live_cuts([layer.curve.activation_bytes[j] for layer in layers], inputs)  # type: ignore[union-attr]
            for j in range(len(profile.batch_sizes))
        ]
        cut_curves = tuple(zip(*per_size, strict=True))
    groups = tuple(dataclasses.replace(g, layers=tuple(sorted(position[u] for u in g.layers))) for g in profile.shared_params)
    return dataclasses.replace(
        profile, layers=layers, cut_bytes=cut_bytes, cut_curves=cut_curves, layer_inputs=inputs, shared_params=groups
    )


def _placed(layer: LayerProfile, after_its_predecessor: bool) -> LayerProfile:
    """The layer as placed in an order: its shared bytes dropped unless the layer before it is its predecessor."""
    shares = bool(layer.shared_bytes) or (layer.curve is not None and layer.curve.shared_bytes is not None)
    if after_its_predecessor or not shares:
        return layer
    curve: LayerCurve | None = layer.curve
    if curve is not None:
        curve = dataclasses.replace(curve, shared_bytes=None)
    return dataclasses.replace(layer, shared_bytes=0.0, curve=curve)


def order_from_stages(profile: ModelProfile, stage_sets: Sequence[Iterable[int]]) -> tuple[int, ...]:
    """The layer order of stages given as sets of layer indices: stage by stage, inside a stage by layer index.

    Raises:
        PlanError: a stage is empty, names an unknown layer, two stages hold one layer, a layer is in no stage, or a
            stage holds a layer whose input is in a later stage (the stages are not closed under the cut); the message
            names the stage and the layer.
    """
    n = profile.num_layers
    owner = [-1] * n
    stages: list[list[int]] = []
    for s, members in enumerate(stage_sets):
        layers = sorted(members)
        if not layers:
            raise PlanError(f"stage {s} holds no layer")
        for v in layers:
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < n:
                raise PlanError(f"stage {s} names layer {v!r}, but profile {profile.name!r} has layers 0..{n - 1}")
            if owner[v] >= 0:
                raise PlanError(f"stages {owner[v]} and {s} both hold {layer_label(profile, v)} (stages must not overlap)")
            owner[v] = s
        stages.append(layers)
    missing = [v for v in range(n) if owner[v] < 0]
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise PlanError(f"no stage holds {layer_label(profile, missing[0])}{more} (every layer must be in a stage)")
    for v, sources in enumerate(inputs_of(profile)):
        for u in sources:
            if owner[u] > owner[v]:
                raise PlanError(
                    f"stage {owner[v]} holds {layer_label(profile, v)} but its input {layer_label(profile, u)} is in the "
                    f"later stage {owner[u]} (the stages are not closed under the cut: every input must be in the same "
                    "or an earlier stage)"
                )
    return tuple(v for layers in stages for v in layers)


def stage_layers(plan: Plan) -> tuple[tuple[int, ...], ...]:
    """Per stage of `plan`, the indices of its layers in the order the stage runs them (positions mapped through the
    plan's layer order)."""
    order = plan.layer_order
    return tuple(
        tuple(range(s.first_layer, s.last_layer + 1))
        if order is None
        else tuple(order[p] for p in range(s.first_layer, s.last_layer + 1))
        for s in plan.stages
    )
