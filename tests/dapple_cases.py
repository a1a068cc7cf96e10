"""The original DAPPLE planner's (HPGO's) plans on the shared profiles (tests/data/dapple_original.json.gz), and the
port's run of HPGO's candidate set and ranking on the same inputs: what the dapple baseline is checked against."""

from __future__ import annotations

import functools
import gzip
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipedream_cases import graph
from pipeplan.planner.baselines.dapple.comm_times import HPGO_RATES, transfer_s
from pipeplan.planner.baselines.dapple.dp import DappleStage
from pipeplan.planner.baselines.dapple.gpus import Machines
from pipeplan.planner.baselines.dapple.hpgo import HpgoCandidate, hpgo_candidates, hpgo_speedup
from pipeplan.planner.baselines.dapple.planning_model import DappleModel, dapple_model

DATA = Path(__file__).resolve().parent / "data"
REL = 1e-9


@dataclass(frozen=True, slots=True)
class Case:
    """One run of the original (make_dapple_original.py says which)."""

    tag: str
    profile: str
    seps: tuple[int, ...]
    global_batch: int
    speedup: float
    stages: tuple[frozenset[str], ...]
    units: tuple[int, ...]
    gpus: tuple[tuple[int, ...], ...]
    order: tuple[int, ...]


@functools.cache
def cases() -> tuple[Case, ...]:
    """Every saved run, sorted by tag."""
    with gzip.open(DATA / "dapple_original.json.gz", "rt") as f:
        raw = json.load(f)
    return tuple(
        Case(
            c["tag"],
            c["profile"],
            tuple(c["seps"]),
            c["global_batch"],
            c["speedup"],
            tuple(frozenset(s) for s in c["stages"]),
            tuple(c["units"]),
            tuple(tuple(g) for g in c["gpus"]),
            tuple(c["order"]),
        )
        for c in raw
    )


def case(tag: str) -> Case:
    """The case named `tag`."""
    return next(c for c in cases() if c.tag == tag)


@functools.cache
def model(profile: str, global_batch: int) -> DappleModel:
    """DAPPLE's model of a profile at a global batch (cached)."""
    return dapple_model(graph(profile), global_batch)


@functools.cache
def ranked(tag: str) -> tuple[HpgoCandidate, ...]:
    """HPGO's candidates of a case, ranked by its speed-up, in the port (cached)."""
    c = case(tag)
    return tuple(hpgo_candidates(model(c.profile, c.global_batch), Machines(c.seps), HPGO_RATES, np.asarray(c.order)))


def best(tag: str) -> HpgoCandidate:
    """The port's pick: the highest speed-up (the first on ties)."""
    return max(ranked(tag), key=lambda x: x.speedup)


def stage_sets(c: Case, stages: tuple[DappleStage, ...]) -> tuple[frozenset[str], ...]:
    """A plan's stages as sets of planning node ids (Input sources left out, as in the original's stage lists)."""
    m = model(c.profile, c.global_batch)
    sets = m.stage_layers([s.end for s in stages])
    names = m.graph.full.names
    kept = {names[i] for i in m.graph.kept}
    return tuple(frozenset(names[i] for i in s) & kept for s in sets)


def original_sets(c: Case) -> tuple[frozenset[str], ...]:
    """The original's stages as planning node ids."""
    m = model(c.profile, c.global_batch)
    kept = {m.graph.full.names[i] for i in m.graph.kept}
    return tuple(s & kept for s in c.stages)


def original_stages(c: Case) -> tuple[DappleStage, ...]:
    """The original's stages in the port's terms: state ranges (by the stage node sets) and GPUs per replica."""
    m = model(c.profile, c.global_batch)
    local = {m.graph.graph.names[i]: i for i in range(m.graph.graph.num_nodes)}
    index = {mask: i for i, mask in enumerate(m.states.masks)}
    out, union, after = [], 0, -1
    for nodes, units, gpus in zip(original_sets(c), c.units, c.gpus, strict=True):
        union |= sum(1 << local[n] for n in nodes)
        end = index[union]
        rp = len(gpus) // units
        parts = tuple(sum(1 << g for g in gpus[t * units : (t + 1) * units]) for t in range(rp))
        out.append(DappleStage(after, end, units, parts))
        after = end
    return tuple(out)


def original_block(c: Case) -> float:
    """The DP's value of the original's plan: its slowest stage compute over m'·rp GPUs or transfer of 2x the cut."""
    m = model(c.profile, c.global_batch)
    machines = Machines(c.seps)
    stages = original_stages(c)
    rp = len(stages[0].parts or ())
    worst = 0.0
    for i, s in enumerate(stages):
        worst = max(worst, m.between(m.compute_s, s.after, s.end) / (s.units * rp))
        if i:
            move = transfer_s(machines, HPGO_RATES, stages[i - 1].gpus, s.gpus, 2.0 * float(m.cut_bytes[s.after]))
            worst = max(worst, move)
    return worst


def original_speedup(c: Case) -> float:
    """The original's plan priced by the port's terms and HPGO's ranking: as a DP plan, and for a two-stage plan of
    one pipeline also as a two-stage split (whose block moves the cut once); the better of the two."""
    m = model(c.profile, c.global_batch)
    machines = Machines(c.seps)
    stages = original_stages(c)
    rp = len(stages[0].parts or ())
    order = np.asarray(c.order)
    value = hpgo_speedup(m, machines, HPGO_RATES, rp, original_block(c), stages, order)
    if len(stages) == 2 and rp == 1:
        a, b = stages
        comp = max(m.between(m.compute_s, -1, a.end) / a.units, m.between(m.compute_s, a.end, b.end) / b.units)
        comm = transfer_s(machines, HPGO_RATES, a.gpus, b.gpus, float(m.cut_bytes[a.end]))
        value = max(value, hpgo_speedup(m, machines, HPGO_RATES, 1, max(comp, comm), stages, order))
    return value
