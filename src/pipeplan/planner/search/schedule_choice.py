"""Schedule candidates for a partition: gpipe, 1f1b, kfkb (k), interleaved-1f1b (v chunks), zb-h1."""

from __future__ import annotations

import dataclasses
import functools

from pipeplan.core.partition import solve_scaled
from pipeplan.core.plan import Plan, Stage
from pipeplan.schedules.registry import GENERATED, INTERLEAVED, TAKES_K
from pipeplan.sim.cost.model import CostModel
from pipeplan.sim.cost.plan_costs import device_speeds

KFKB_EVERY_K = 32
"""kfkb is tried at every k up to this; above it at a ladder of k about KFKB_LADDER apart (kfkb_groups)."""
KFKB_LADDER = 1.25
INTERLEAVE_CHUNKS = (2, 3, 4)


def kfkb_groups(microbatches: int, ends: bool = False) -> list[int]:
    """The k a plan of m microbatches is tried with under kfkb: every k in 2..min(m - 1, KFKB_EVERY_K), then k about
    KFKB_LADDER x apart up to m - 1; with `ends` also k = 1 (1F1B's order) and k = m (GPipe's), which --schedule auto
    tries under their own names."""
    top = microbatches - 1
    ks = list(range(2, min(top, KFKB_EVERY_K) + 1))
    k = KFKB_EVERY_K
    while k < top:
        k = min(top, max(k + 1, round(k * KFKB_LADDER)))
        ks.append(k)
    if ends:
        ks = [1, *ks, microbatches] if microbatches > 1 else [1]
    return ks


def interleave(plan: Plan, model: CostModel, chunks: int) -> Plan | None:
    """`plan` re-cut into p*chunks chunk-stages, chunk c on rank c mod p, balanced per rank's replicas and speed.

    None when it cannot apply: one rank, m not a multiple of p, or too few layers.
    """
    p = plan.num_ranks
    if p < 2 or plan.chunks != 1 or plan.microbatches % p:
        return None
    factors = []
    for rank in range(p):
        speed = min(device_speeds(model.cluster, plan.stages[rank].devices))
        factors.append(plan.replicas_of(rank) * speed)
    work = tuple(model.layers.per_layer_ms(plan.microbatch_size).tolist())
    bounds = _balanced(work, tuple(factors[c % p] for c in range(p * chunks)))
    if bounds is None:
        return None
    stages = tuple(Stage(a, b, plan.stages[c % p].devices) for c, (a, b) in enumerate(bounds))
    return dataclasses.replace(plan, stages=stages, schedule="interleaved-1f1b", k=1, chunks=chunks, order=None)


@functools.lru_cache(maxsize=32)
def _balanced(work: tuple[float, ...], factors: tuple[float, ...]) -> tuple[tuple[int, int], ...] | None:
    """solve_scaled, remembered: the search asks for the same chunks of the same layers many times (45 calls, 6
    distinct, for a 5,000-layer chain, each a bisection of 60 greedy passes over every layer)."""
    bounds = solve_scaled(list(work), list(factors))
    return None if bounds is None else tuple(bounds)


def schedule_variants(plan: Plan, model: CostModel, only: str = "auto") -> list[Plan]:
    """The plan under every generated schedule that applies (or only `only`), 1f1b first.

    An interleaved plan (chunks > 1) is returned as it is: its chunk-stages do not map back to p stages.

    kfkb uses every k of kfkb_groups (Ada-Grouper's schedule: k = 2..m - 1 under auto, whose 1f1b and gpipe are
    k = 1 and m; 1..m when kfkb is asked for); a k whose warm-up does not fit memory is dropped by the caller's
    ranking (memory is a closed form there, so it costs no simulation); interleaved-1f1b uses v in
    INTERLEAVE_CHUNKS when m is a multiple of p.
    """
    if plan.chunks != 1:
        return [plan] if only in ("auto", plan.schedule) else []
    base = dataclasses.replace(plan, schedule="1f1b", k=1, chunks=1, order=None)
    variants: list[Plan] = []
    names = GENERATED if only == "auto" else (only,)
    for name in names:
        if name in TAKES_K:
            ks = kfkb_groups(plan.microbatches, ends=only in TAKES_K)
            variants += [dataclasses.replace(base, schedule=name, k=k) for k in ks]
        elif name in INTERLEAVED:
            for v in INTERLEAVE_CHUNKS:
                chunked = interleave(base, model, v)
                if chunked is not None:
                    variants.append(chunked)
        elif name in GENERATED:
            variants.append(dataclasses.replace(base, schedule=name))
    return variants
