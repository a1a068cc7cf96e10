"""The original PipeDream planner's plans on the shared profiles (tests/data/pipedream_original.json.gz), their
inputs, and the DP's value of a given plan: what the pipedream baseline is checked against."""

from __future__ import annotations

import functools
import gzip
import json
import math
from dataclasses import dataclass
from pathlib import Path

from pipeplan.io.graph_txt import parse_graph
from pipeplan.planner.baselines.downset_tables import DownsetStates
from pipeplan.planner.baselines.pipedream_graph import PipeDreamGraph, graph_of_model_graph
from pipeplan.planner.baselines.pipedream_planner import PipeDreamOptions, PipeDreamPlan, plan_graph, planning_states
from pipeplan.presets.profiles import builtin_profile_text

DATA = Path(__file__).resolve().parent / "data"
REL = 1e-9


@dataclass(frozen=True, slots=True)
class Case:
    """One run of the original: its tag, input, flags and result (make_pipedream_original.py says which)."""

    tag: str
    profile: str
    options: PipeDreamOptions
    predicted_ms: float
    stages: tuple[frozenset[str], ...]
    replicas: tuple[tuple[int, ...], ...]
    groups: tuple[int, ...]
    seed_stable: bool | None


@functools.cache
def cases() -> tuple[Case, ...]:
    """Every saved run, sorted by tag."""
    with gzip.open(DATA / "pipedream_original.json.gz", "rt") as f:
        raw = json.load(f)
    out = []
    for c in raw:
        options = PipeDreamOptions(
            units=tuple(c["units"]),
            bandwidths_bytes_per_s=tuple(float(b) for b in c["bandwidths"]),
            memory_bytes=float(c["memory"]),
            memory_constraint=c["memory_constraint"],
            straight=c["straight"],
            compression=c["compression"],
        )
        stages = tuple(frozenset(s) for s in c["stages"])
        replicas = tuple(tuple(r) for r in c["replicas"])
        out.append(
            Case(
                c["tag"], c["profile"], options, c["predicted_s"] * 1000.0, stages, replicas, tuple(c["groups"]), c["seed_stable"]
            )
        )
    return tuple(out)


def case(tag: str) -> Case:
    """The case named `tag`."""
    return next(c for c in cases() if c.tag == tag)


@functools.cache
def graph(profile: str) -> PipeDreamGraph:
    """The input the original read: a built-in profile (nodes named by id), or the compressed inception."""
    if profile == "inception_v3_compressed":
        with gzip.open(DATA / "inception_v3_compressed-pbs-128.txt.gz", "rt") as f:
            text, source = f.read(), "inception_v3_compressed-pbs-128.txt"
    else:
        source, text = builtin_profile_text(profile)
    return graph_of_model_graph(parse_graph(text, source))


@functools.cache
def planned(tag: str) -> PipeDreamPlan:
    """The baseline's plan of a case (cached)."""
    c = case(tag)
    return plan_graph(graph(c.profile), c.options)


def planning_sets(c: Case, plan: PipeDreamPlan) -> tuple[tuple[frozenset[str], ...], tuple[frozenset[str], ...]]:
    """The baseline's and the original's stages as sets of planning nodes (Input sources and sinks left out)."""
    g = graph(c.profile)
    planning, _ = planning_states(g)
    kept = {g.names[i] for i in planning.kept}
    mine = tuple(frozenset(g.names[i] for i in s.layers) & kept for s in plan.stages)
    return mine, tuple(s & kept for s in c.stages)


def original_value_ms(c: Case) -> float:
    """The original's plan (its stage sets, replicas per level, level-2 stages) priced by the baseline's DP terms."""
    g = graph(c.profile)
    planning, states = planning_states(g)
    local = {g.names[k]: i for i, k in enumerate(planning.kept)}
    index = {mask: i for i, mask in enumerate(states.masks)}
    ends, union = [], 0
    for stage in c.stages:
        union |= sum(1 << local[n] for n in stage if n in local)
        ends.append(index[union])
    blocks: list[tuple[int, int, list[tuple[int, int]]]] = []
    for s, group in enumerate(c.groups):
        if not blocks or blocks[-1][0] != group:
            blocks.append((group, c.replicas[s][-1], []))
        blocks[-1][2].append((ends[s], c.replicas[s][0]))
    if len(c.options.units) == 1:
        return _level_value(states, c.options, 0, [(e, u, []) for e, u in blocks[0][2]], -1)
    top = [(inner[-1][0], units, [(e, u, []) for e, u in inner]) for _, units, inner in blocks]
    return _level_value(states, c.options, 1, top, -1)


def _level_value(states: DownsetStates, o: PipeDreamOptions, level: int, blocks: list, start: int) -> float:
    """The DP value of `blocks` [(end state, units, inner blocks)] at `level`, starting after state `start`."""
    n, b = o.units[level], o.bandwidths_bytes_per_s[level]
    within = 1 if level == 0 else o.units[level - 1]
    worst, used, prev = 0.0, 0, start
    for i, (end, u, inner) in enumerate(blocks):
        used += u
        compute = _between(states.work_ms, prev, end) if level == 0 else _level_value(states, o, level - 1, inner, prev)
        par = _between(states.param_bytes, prev, end)
        act = _between(states.activation_bytes, prev, end)
        term = (compute + 4.0 * (u - 1) * par * 1000.0 / (b * u) / (within if i == 0 else 1)) / u
        if o.memory_constraint and math.ceil((n - used) / u) * (act + par) > o.memory_bytes:
            return math.inf
        if i and o.compression is not None:
            term = max(term, 2.0 * float(states.cut_bytes[prev]) * 1000.0 / (b * u * o.compression))
            if end < states.count - 1:
                term = max(term, 2.0 * float(states.cut_bytes[end]) * 1000.0 / (b * u * o.compression))
        worst = max(worst, term)
        prev = end
    return worst


def _between(values: object, after: int, end: int) -> float:
    """A per-state cumulative value over the states after `after` (-1: from nothing) up to `end`."""
    return float(values[end]) - (0.0 if after < 0 else float(values[after]))  # type: ignore[index]
