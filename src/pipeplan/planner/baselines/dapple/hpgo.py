"""HPGO's candidate set and ranking: the authors' published DAPPLE planner code, kept to check the port against it.

Candidates (HPGO `orchestrate()`): for every p = 2..N GPUs per pipeline,
rp = floor(N / p) replicas, the DP's plan (a pipeline that leaves GPUs idle
only as one stage); straight pipelines (one GPU per stage) with p = 2 (N > 2,
even) and p = N; the best two-stage split of all N GPUs. Each is ranked by
HPGO's analytic speed-up (`sync_pipeline_speedup_analytical`):

    M = gbs / rp (one sample per microbatch), block = DP value / M
    length = block (M-1) + C_total / (rp M) + Σ_i transfer(stage i -> i+1, cut_i / (rp M)) + max(0, max_i AR_i - i block)
    speed-up = C_total / length

where AR_i all-reduces the weights of the states from stage i's start to the
next stage's start (one state past its end: HPGO's end index is exclusive
for every stage but the last), in HPGO's own state order (`order`, which
depends on the original's hash seed; identity by default).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from pipeplan.planner.baselines.dapple.comm_times import LinkRates, allreduce_s, transfer_s
from pipeplan.planner.baselines.dapple.dp import DappleStage, dp_counts, dp_sets, move_rate, placement_free
from pipeplan.planner.baselines.dapple.gpus import Machines, placements
from pipeplan.planner.baselines.dapple.planning_model import DappleModel


@dataclass(frozen=True, slots=True)
class HpgoCandidate:
    """A ranked plan: its label, replicas rp, stages (with GPUs), DP value (s) and HPGO's speed-up."""

    label: str
    replicas: int
    stages: tuple[DappleStage, ...]
    block_s: float
    speedup: float


def hpgo_speedup(model: DappleModel, machines: Machines, rates: LinkRates, replicas: int, block_s: float,
                 stages: tuple[DappleStage, ...], order: np.ndarray | None = None) -> float:  # fmt: skip
    """HPGO's analytic speed-up of a plan (module docstring); `order[i]` is state i's index in HPGO's order."""
    m = model.global_batch // replicas
    if m == 0:
        return 0.0
    total = model.total_s
    block = block_s / m
    length = block * (m - 1) + total / replicas / m
    for a, b in itertools.pairwise(stages):
        length += transfer_s(machines, rates, a.gpus, b.gpus, float(model.cut_bytes[b.after]) / replicas / m)
    delta = 0.0
    for i, stage in enumerate(stages):
        ar = allreduce_s(machines, rates, stage.gpus, hpgo_params(model, stages, i, order))
        delta = max(delta, ar - i * block)
    return total / (length + delta)


def hpgo_params(model: DappleModel, stages: tuple[DappleStage, ...], i: int, order: np.ndarray | None) -> float:
    """parameter_sizes[start][end] as HPGO reads it: P(end) - P(start - 1) by index in HPGO's state order."""
    last = model.count - 1
    rank = np.arange(model.count) if order is None else order
    by_rank = np.empty(model.count, dtype=np.int64)
    by_rank[rank] = np.arange(model.count)
    start = 0 if stages[i].after < 0 else int(rank[stages[i].after]) + 1
    end = last if i == len(stages) - 1 else int(rank[stages[i + 1].after]) + 1
    p = model.param_bytes
    return float(p[by_rank[end]]) - (0.0 if start == 0 else float(p[by_rank[start - 1]]))


def hpgo_candidates(model: DappleModel, machines: Machines, rates: LinkRates,
                    order: np.ndarray | None = None) -> list[HpgoCandidate]:  # fmt: skip
    """Every candidate HPGO ranks (module docstring), in its order."""
    n = machines.gpus
    out = []
    runs = [(p, False) for p in range(2, n + 1)] + [(p, True) for p in ((2, n) if n > 2 and n % 2 == 0 else (n,))]
    for p, straight in runs:
        rp = n // p
        if placement_free(machines, rp):
            found = dp_counts(model, move_rate(machines, rates), n, p, rp, straight, split=p * rp == n)
            if found is not None:
                found = (found[0], placed(machines, rp, found[1]))
        else:
            found = dp_sets(model, machines, rates, p, rp, straight, split_idle=False)
        if found is None:
            continue
        block, stages = found
        label = f"{'straight ' if straight else ''}p={p} rp={rp}"
        speed = hpgo_speedup(model, machines, rates, rp, block, tuple(stages), order)
        out.append(HpgoCandidate(label, rp, tuple(stages), block, speed))
    out.append(bipartition(model, machines, rates, order))
    return out


def placed(machines: Machines, rp: int, stages: list[DappleStage]) -> list[DappleStage]:
    """Stages of dp_counts given GPUs: each stage the next free GPU indices, replica after replica."""
    out, start = [], 0
    for s in stages:
        parts = tuple(((1 << s.units) - 1) << (start + t * s.units) for t in range(rp))
        out.append(DappleStage(s.after, s.end, s.units, parts))
        start += s.units * rp
    return out


def bipartition(model: DappleModel, machines: Machines, rates: LinkRates, order: np.ndarray | None) -> HpgoCandidate:
    """The best two-stage split of all GPUs by HPGO's speed-up (cut state, first-stage GPUs, both placements)."""
    n = machines.gpus
    total = model.total_s
    best: HpgoCandidate | None = None
    for cut in range(model.count - 1):
        for g in range(1, n):
            for g1 in placements(machines, 0, g):
                for g2 in placements(machines, g1, n - g):
                    comp = max(float(model.compute_s[cut]) / g, (total - float(model.compute_s[cut])) / (n - g))
                    comm = transfer_s(machines, rates, g1, g2, float(model.cut_bytes[cut]))
                    stages = (DappleStage(-1, cut, g, (g1,)), DappleStage(cut, model.count - 1, n - g, (g2,)))
                    block = max(comp, comm)
                    speed = hpgo_speedup(model, machines, rates, 1, block, stages, order)
                    if best is None or speed > best.speedup:
                        best = HpgoCandidate("two stages", 1, stages, block, speed)
    assert best is not None
    return best
