"""PipeDream's hierarchical planner (Narayanan et al., SOSP 2019) over down-set states, with all of its options.

What msr-fiddle/pipedream's `optimizer/optimizer_graph_hierarchical.py`
computes: any number of levels listed bottom-up (units and bandwidth per
level, `-n`/`-b`), any replica count, activation transfers only with
`--activation_compression_ratio`, its weight-stashing memory rule only with
`--use_memory_constraint`, `--straight_pipeline`, `--use_fewer_machines`.
Input sources are taken out before planning and go back into stage 0;
`__getitem__` sinks are taken out (pipedream_graph). Stages are sets of
nodes: differences of nested down-sets, not ranges of one layer order. Level
l's compute table is level l-1's best time of each range on all its units; a
stage of level l on r units runs level l-1's split of its range on each of
them, so a level-1 stage's replicas are the product of its counts per level.

Times are ms (the original's seconds times 1000); the predicted value is the
steady-state time per profile minibatch of the asynchronous pipeline.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pipeplan.core.errors import PlanError
from pipeplan.planner.baselines.downset_tables import (
    DownsetStates,
    StateLimitError,
    downset_states,
    enumerate_downsets,
    range_table,
    range_tables,
)
from pipeplan.planner.baselines.pipedream_dp import LevelInputs, LevelOptions, level_dp, unwind
from pipeplan.planner.baselines.pipedream_graph import PipeDreamGraph, PlanningGraph, planning_graph

STATE_LIMIT = 8_000
"""Reachable down-sets beyond which planning is refused before any table is built: the DP is quadratic (cubic below
the top level) in them, and its tables take about 40 bytes per pair of states (1 GB at 5,000 states, 2.5 GB at the
limit; 20,000 would need 16 GB)."""
WORK_LIMIT = 3e9
"""Candidate evaluations beyond which planning is refused (about a minute of numpy): the original takes hours there."""


@dataclass(frozen=True, slots=True)
class PipeDreamOptions:
    """The original's flags: `units` (-n, bottom-up), `bandwidths_bytes_per_s` (-b), `memory_bytes` (-s, used only
    with `memory_constraint`), `straight`, `fewer` (--use_fewer_machines), `compression` (None: activations not
    modelled); `allowed` (not the original's: pipeplan's fallback) limits a stage's unit count at every level."""

    units: tuple[int, ...]
    bandwidths_bytes_per_s: tuple[float, ...]
    memory_bytes: float = 16e9
    memory_constraint: bool = False
    straight: bool = False
    fewer: bool = False
    compression: float | None = None
    allowed: frozenset[int] | None = None

    def __post_init__(self) -> None:
        if not self.units or any(isinstance(u, bool) or not isinstance(u, int) or u < 1 for u in self.units):
            raise PlanError(f"pipedream units per level must be integers >= 1, got {list(self.units)}")
        if len(self.bandwidths_bytes_per_s) != len(self.units):
            raise PlanError(
                f"pipedream needs one bandwidth per level: {len(self.units)} levels {list(self.units)}, "
                f"{len(self.bandwidths_bytes_per_s)} bandwidths {list(self.bandwidths_bytes_per_s)}"
            )
        if not all(math.isfinite(b) and b > 0 for b in self.bandwidths_bytes_per_s):
            raise PlanError(f"pipedream bandwidths must be numbers > 0 (bytes/s), got {list(self.bandwidths_bytes_per_s)}")
        if self.compression is not None and not (math.isfinite(self.compression) and self.compression > 0):
            raise PlanError(f"pipedream activation compression ratio must be a number > 0, got {self.compression!r}")
        if not (math.isfinite(self.memory_bytes) and self.memory_bytes > 0):
            raise PlanError(f"pipedream memory_bytes must be a number > 0, got {self.memory_bytes!r}")


@dataclass(frozen=True, slots=True)
class PipeDreamStage:
    """One stage: layer indices of the full graph, replicas per level (bottom-up), and `path`: the index of the
    stage holding it at each level above, top first (path[0] = 0, the whole model)."""

    layers: tuple[int, ...]
    replicas_per_level: tuple[int, ...]
    path: tuple[int, ...] = ()

    @property
    def replicas(self) -> int:
        """Total replicas: the product over levels."""
        return math.prod(self.replicas_per_level)


@dataclass(frozen=True, slots=True)
class PipeDreamPlan:
    """The planner's result: stages, predicted ms per minibatch, whether the optimum was tie-free, the states."""

    stages: tuple[PipeDreamStage, ...]
    predicted_ms: float
    unique: bool
    num_states: int


def planning_states(full: PipeDreamGraph) -> tuple[PlanningGraph, DownsetStates]:
    """The planning graph and its states.

    Raises:
        PlanError: more than STATE_LIMIT states (counted before any per-state table is built).
    """
    graph = planning_graph(full)
    try:
        states = downset_states(graph.graph, graph.first, STATE_LIMIT)
    except StateLimitError as error:
        raise PlanError(
            f"planner 'pipedream': {error}; its DP is quadratic in them (tables of about 40 bytes per pair of states) "
            "and does not finish (the original's neither); use --planner pipeplan, which plans blocks of layers"
        ) from None
    return graph, states


def within_states(full: PipeDreamGraph, limit: int) -> bool:
    """Whether `full` has at most `limit` planning states (the enumeration only: no tables, no sums)."""
    graph = planning_graph(full)
    try:
        enumerate_downsets(graph.graph, graph.first, limit)
    except StateLimitError:
        return False
    return True


def plan_graph(
    full: PipeDreamGraph, options: PipeDreamOptions, planned: tuple[PlanningGraph, DownsetStates] | None = None
) -> PipeDreamPlan:
    """PipeDream's plan of `full` (module docstring); `planned` is planning_states(full) when the caller has it.

    Raises:
        PlanError: too many states or too much work, or no plan (naming the constraint and by how much).
    """
    graph, states = planned or planning_states(full)
    inputs = _level_inputs(graph, states)
    _check_work(full.name, states, inputs, options)
    tables = []
    compute = inputs.compute_ms
    for level, opt in enumerate(_level_options(options)):
        table = level_dp(LevelInputs(compute, inputs.activation_bytes, inputs.param_bytes, inputs.cut_bytes, inputs.preds), opt)
        tables.append(
            (table, LevelInputs(compute, inputs.activation_bytes, inputs.param_bytes, inputs.cut_bytes, inputs.preds), opt)
        )
        compute = np.where(np.isfinite(inputs.compute_ms), table[:, :, -1], np.inf) if level + 1 < len(options.units) else compute
    last = states.count - 1
    value = float(tables[-1][0][0, last, -1])
    if not math.isfinite(value):
        raise PlanError(explain_no_plan(graph, states, options))
    stages, unique = _unwind_all(tables, last)
    return PipeDreamPlan(_layer_stages(graph, states, stages), value, unique, states.count)


def _level_inputs(graph: PlanningGraph, states: DownsetStates) -> LevelInputs:
    """Level-1 tables (pipedream_dp.LevelInputs)."""
    valid, preds = range_tables(states, graph.graph.num_nodes)
    return LevelInputs(
        range_table(states.work_ms, valid, np.inf),
        range_table(states.activation_bytes, valid, 0.0),
        range_table(states.param_bytes, valid, 0.0),
        states.cut_bytes,
        preds,
    )


def _level_options(options: PipeDreamOptions) -> list[LevelOptions]:
    """Each level's options, bottom-up; a level divides its first stage's all-reduce by the level below's units
    only (the original's rule, also with three levels or more)."""
    out = []
    for level, (n, b) in enumerate(zip(options.units, options.bandwidths_bytes_per_s, strict=True)):
        out.append(
            LevelOptions(
                units=n,
                bandwidth_bytes_per_s=float(b),
                within=1 if level == 0 else options.units[level - 1],
                final=level == len(options.units) - 1,
                straight=options.straight,
                fewer=options.fewer,
                compression=options.compression,
                memory_bytes=options.memory_bytes if options.memory_constraint else None,
                allowed=options.allowed,
            )
        )
    return out


def _check_work(name: str, states: DownsetStates, inputs: LevelInputs, options: PipeDreamOptions) -> None:
    """Refuse a DP over WORK_LIMIT candidate evaluations, naming the states and the levels."""
    pairs = sum(len(p) for p in inputs.preds)
    rows = sum(len(p) * (len(p) + 1) for p in inputs.preds)
    work = 0.0
    for level, n in enumerate(options.units):
        scan = n * n if n <= 16 or options.memory_constraint else n * 4 * math.log2(n)
        work += (pairs if level == len(options.units) - 1 else rows) * scan
    if work > WORK_LIMIT:
        raise PlanError(
            f"planner 'pipedream': {name} has {states.count:,} planning states and the DP over levels "
            f"{list(options.units)} would evaluate {work:.1e} candidates (limit {WORK_LIMIT:.0e}): the levels below "
            "the top are cubic in the states, as in the original, which takes hours there"
        )


Block = tuple[int, int, tuple[int, ...], tuple[int, ...]]
"""(first row, last state, replicas per level bottom-up, path of the stages holding it, top first)."""


def _unwind_all(tables: list[tuple[np.ndarray, LevelInputs, LevelOptions]], last: int) -> tuple[list[Block], bool]:
    """Level-1 stages (Block), in pipeline order, and whether no cell on the way had a tie."""
    blocks: list[Block] = [(0, last, (), ())]
    unique = True
    for level in range(len(tables) - 1, -1, -1):
        time, inputs, opt = tables[level]
        refined: list[Block] = []
        for index, (row, end, above, path) in enumerate(blocks):
            parts, tie_free = unwind(time, inputs, opt, row, end)
            unique &= tie_free
            refined.extend((r, e, (u, *above), (*path, index)) for r, e, u in parts)
        blocks = refined
    return blocks, unique


def _layer_stages(graph: PlanningGraph, states: DownsetStates, stages: list[Block]) -> tuple[PipeDreamStage, ...]:
    """Each stage's layers (full-graph indices): D_end minus the previous D_end; Input sources in stage 0, each
    `__getitem__` sink in the stage of its producer."""
    where: dict[int, int] = {}
    out: list[list[int]] = []
    before = 0
    for index, (_, end, _, _) in enumerate(stages):
        mask = states.masks[end] & ~before
        before = states.masks[end]
        layers = [graph.kept[i] for i in range(graph.graph.num_nodes) if mask >> i & 1]
        where.update(dict.fromkeys(layers, index))
        out.append(layers)
    out[0].extend(graph.inputs)
    for sink in graph.sinks:
        producers = graph.full.producers[sink]
        out[max((where.get(p, 0) for p in producers), default=len(out) - 1)].append(sink)
    return tuple(PipeDreamStage(tuple(sorted(layers)), s[2], s[3]) for layers, s in zip(out, stages, strict=True))


def explain_no_plan(graph: PlanningGraph, states: DownsetStates, options: PipeDreamOptions) -> str:
    """One line saying why no plan exists, naming the constraint and by how much.

    Without the memory rule only the unit counts can rule plans out: every unit of every level is used (no
    --use_fewer_machines), so a straight pipeline needs one stage per GPU, and a limited set of counts may not add
    up. The memory rule holds a stage's activations and weights ceil((N - used) / r) times; the stage that ends
    the model uses every unit (factor 0), so no plan means some stage before it cannot hold its share.
    """
    dag = graph.graph
    where = f"planner 'pipedream' found no plan of {graph.full.name} over levels {list(options.units)}"
    total = math.prod(options.units)
    if options.straight and not options.fewer and total > dag.num_nodes:
        return (
            f"{where}: a straight pipeline over {total} units needs {total} stages (one unit each, every unit used), "
            f"the graph has {dag.num_nodes} planning nodes, {total - dag.num_nodes} too few; leave units idle "
            "(--use_fewer_machines) or use fewer devices"
        )
    if not options.memory_constraint:
        allowed = sorted(options.allowed) if options.allowed is not None else "any"
        return (
            f"{where}: no split of every level's units into stages of {allowed} units each over "
            f"{dag.num_nodes} planning nodes (straight: {options.straight})"
        )
    memory = options.memory_bytes
    held = dag.activation_bytes + dag.param_bytes
    heaviest = int(np.argmax(held))
    whole = float(states.activation_bytes[-1] + states.param_bytes[-1])
    gib = 2.0**30
    return (
        f"{where} under its memory rule (--use_memory_constraint) with {memory / gib:.2f} GiB per unit: every split "
        f"leaves a stage before the last holding its activations and weights once per unit still to come, beyond "
        f"{memory / gib:.2f} GiB (the whole model holds {whole / gib:.2f} GiB; heaviest node {dag.names[heaviest]} "
        f"{held[heaviest] / gib:.2f} GiB, {held[heaviest] / memory:.2f}x the memory); drop the rule or give more memory"
    )
