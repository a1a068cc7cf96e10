"""DAPPLE's candidate plans as the paper describes them (Fan et al., PPoPP 2021, §IV), ranked by its latency model.

Candidates:
- hybrid: for every p = 1..N GPUs per pipeline replica, rp = floor(N / p)
  replicas (GPUs left over stay idle); the partition-and-placement DP
  (dapple.dp) gives the plan, and the same DP with one GPU per stage the
  straight plan (p <= states). p = 1 is data parallelism.
- two stages over all N GPUs: every cut, first-stage size and placement pair.
Each is ranked by the paper's pivot latency (dapple.pivot) with
M = gbs / (rp · microbatch size) microbatches; transfers between stages are
stages of their own.

Caps (above FAITHFUL_GPUS GPUs, where the enumeration does not finish: p up
to N is N DPs over up to N GPUs each, 3^rp placement sequences per stage):
p runs over 1..MAX_PIPELINE_GPUS only, and only where rp exceeds the largest
machine's GPU count, so that every placement of a stage costs the same
(dapple.dp's exact reduction; the paper's search over the others is dropped);
straight pipelines likewise; a two-stage split's first stage takes 2^i or
N - 2^i GPUs, Fresh First.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeplan.planner.baselines.dapple.comm_times import LinkRates, allreduce_s, spread_allreduce_s, transfer_s
from pipeplan.planner.baselines.dapple.dp import DappleStage, Levels, dp_counts, dp_sets, move_rate, placement_free
from pipeplan.planner.baselines.dapple.gpus import Machines, placements
from pipeplan.planner.baselines.dapple.pivot import latency
from pipeplan.planner.baselines.dapple.planning_model import DappleModel

FAITHFUL_GPUS = 64
"""Up to this many GPUs the search is the paper's in full; above it, the caps of the module docstring."""
MAX_PIPELINE_GPUS = 64
"""Above FAITHFUL_GPUS, the most GPUs per pipeline replica tried."""


@dataclass(frozen=True, slots=True)
class Candidate:
    """A plan before the microbatch size is fixed: its label, replicas rp and stages."""

    label: str
    replicas: int
    stages: tuple[DappleStage, ...]


@dataclass(frozen=True, slots=True)
class Links:
    """The cluster as DAPPLE sees it: machines and link rates."""

    machines: Machines
    rates: LinkRates


def candidates(model: DappleModel, links: Links, widths: str = "any") -> list[Candidate]:
    """Every candidate of the module docstring; `widths` "one" keeps one GPU per stage and replica only."""
    n = links.machines.gpus
    out: list[Candidate] = []
    capped = n > FAITHFUL_GPUS
    reuse: dict[tuple[int, bool], Levels] = {}  # dp_sets' levels, shared by the p of one rp
    for p in range(1, (min(n, MAX_PIPELINE_GPUS) if capped else n) + 1):
        rp = n // p
        if any(key[0] != rp for key in reuse):  # p walks up, rp = n // p down: an earlier rp's levels are done with
            reuse.clear()
        free = placement_free(links.machines, rp)
        if capped and not free:
            continue
        for straight in (False, True):
            if (straight and (p == 1 or p > model.count)) or (widths == "one" and not straight and p > 1):
                continue
            if free:
                found = dp_counts(model, move_rate(links.machines, links.rates), n, p, rp, straight)
            else:
                found = dp_sets(model, links.machines, links.rates, p, rp, straight, reuse=reuse)
            if found is not None:
                out.append(Candidate(f"{'straight ' if straight else ''}p={p} rp={rp}", rp, tuple(found[1])))
    if widths == "any" or n == 2:
        out += two_stages(model, links.machines)
    return out


def two_stages(model: DappleModel, machines: Machines) -> list[Candidate]:
    """Two stages over all GPUs: every cut, first-stage GPU count and placement pair (capped above FAITHFUL_GPUS)."""
    n = machines.gpus
    if n < 2 or model.count < 2:
        return []
    if n > FAITHFUL_GPUS:
        powers = {1 << i for i in range(n.bit_length())}
        pairs = [((1 << g) - 1, g) for g in sorted((powers | {n - x for x in powers}) - {0, n})]
        pairs = [(g1, g) for g1, g in pairs if 0 < g < n]
    else:
        pairs = [(g1, g) for g in range(1, n) for g1 in placements(machines, 0, g)]
    every = (1 << n) - 1
    last = model.count - 1
    out = []
    for g1, g in pairs:
        for cut in range(last):
            stages = (DappleStage(-1, cut, g, (g1,)), DappleStage(cut, last, n - g, (every & ~g1,)))
            out.append(Candidate(f"two stages {g}+{n - g}", 1, stages))
    return out


def rank(model: DappleModel, links: Links, candidate: Candidate, microbatch_size: int) -> float | None:
    """The paper's latency (s) of a candidate at a microbatch size (None when a replica gets no microbatch)."""
    rp = candidate.replicas
    m = model.global_batch // (rp * microbatch_size)
    if m < 1:
        return None
    share = rp * m  # one microbatch is this share of the global batch
    fwd: list[float] = []
    bwd: list[float] = []
    ar: list[float] = []
    stages = candidate.stages
    for i, s in enumerate(stages):
        if i:
            x = stage_transfer_s(model, links, stages[i - 1], s, rp, float(model.cut_bytes[s.after]) / share)
            fwd.append(x)
            bwd.append(x)
            ar.append(0.0)
        fwd.append(model.between(model.fwd_s, s.after, s.end) / (share * s.units))
        bwd.append(model.between(model.bwd_s, s.after, s.end) / (share * s.units))
        ar.append(_allreduce(links, s, rp, model.between(model.param_bytes, s.after, s.end)))
    return latency(fwd, bwd, ar, m)[0]


def stage_transfer_s(model: DappleModel, links: Links, a: DappleStage, b: DappleStage, rp: int, num_bytes: float) -> float:
    """transfer_s between two stages; placement-free stages (no GPUs yet) at dapple.dp.move_rate."""
    if a.parts is None or b.parts is None:
        return num_bytes * move_rate(links.machines, links.rates)
    return transfer_s(links.machines, links.rates, a.gpus, b.gpus, num_bytes)


def _allreduce(links: Links, s: DappleStage, rp: int, param_bytes: float) -> float:
    """allreduce_s over a stage's GPUs; placement-free stages by their count."""
    if s.parts is not None:
        return allreduce_s(links.machines, links.rates, s.gpus, param_bytes)
    n = s.units * rp
    if len(links.machines.ends) == 1:
        return 0.0 if n == 1 else 2.0 * param_bytes * (n - 1) / n / links.rates.local / (n // 2)
    return spread_allreduce_s(links.rates, n, param_bytes)
