"""The planning model DAPPLE builds from a graph: down-set states with compute, cut and weight bytes, scaled.

DAPPLE's planner (HPGO) runs PipeDream's pre-processing (pipedream_graph:
Input sources and `__getitem__` sinks out; downsets: the reachable down-sets
as states, PipeDream's cut bytes) and scales every time and activation from
the profile batch to the global batch (`normalize`); weights are not scaled.
So a state's time is the whole global batch's on one GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeplan.core.units import ms_to_s
from pipeplan.planner.baselines.downset_tables import DownsetStates, downset_states, mask_matrix, range_table, range_tables
from pipeplan.planner.baselines.pipedream_graph import PipeDreamGraph, PlanningGraph, planning_graph


@dataclass(frozen=True, slots=True)
class DappleModel:
    """States of a graph at the global batch: cumulative compute, forward and backward (s), cut and weight bytes,
    each state's proper-subset states, and `table_s[r, j]`, the compute of the states after r-1 up to j (row 0:
    from the start; inf where that is no node set)."""

    graph: PlanningGraph
    states: DownsetStates
    compute_s: np.ndarray
    fwd_s: np.ndarray
    bwd_s: np.ndarray
    cut_bytes: np.ndarray
    param_bytes: np.ndarray
    preds: list[np.ndarray]
    table_s: np.ndarray
    global_batch: int

    @property
    def count(self) -> int:
        """Number of states."""
        return self.states.count

    @property
    def total_s(self) -> float:
        """The whole model's compute for the global batch on one GPU."""
        return float(self.compute_s[-1])

    def between(self, values: np.ndarray, after: int, end: int) -> float:
        """A per-state cumulative value over the states after `after` (-1: from the start) up to `end`."""
        return float(values[end]) - (float(values[after]) if after >= 0 else 0.0)

    def stage_layers(self, ends: list[int]) -> list[list[int]]:
        """Per stage (given by its last state), its layers in the full graph: D_end minus the previous D_end, Input
        sources in stage 0, each `__getitem__` sink in the stage of its producer."""
        g = self.graph
        where: dict[int, int] = {}
        out: list[list[int]] = []
        before = 0
        for index, end in enumerate(ends):
            mask = self.states.masks[end] & ~before
            before = self.states.masks[end]
            layers = [g.kept[i] for i in range(g.graph.num_nodes) if mask >> i & 1]
            where.update(dict.fromkeys(layers, index))
            out.append(layers)
        out[0].extend(g.inputs)
        for sink in g.sinks:
            out[max((where.get(p, 0) for p in g.full.producers[sink]), default=len(out) - 1)].append(sink)
        return [sorted(layers) for layers in out]


def dapple_model(full: PipeDreamGraph, global_batch: int, limit: int | None = None) -> DappleModel:
    """DAPPLE's model of `full` at `global_batch` (the profile batch is the graph's).

    Raises:
        StateLimitError: more than `limit` states.
    """
    graph = planning_graph(full)
    states = downset_states(graph.graph, graph.first, limit)
    scale = global_batch / full.batch_size
    member = mask_matrix(states.masks, graph.graph.num_nodes)
    valid, preds = range_tables(states, graph.graph.num_nodes)
    compute = ms_to_s(states.work_ms) * scale
    return DappleModel(
        graph=graph,
        states=states,
        compute_s=compute,
        fwd_s=ms_to_s(member @ graph.graph.fwd_ms) * scale,
        bwd_s=ms_to_s(member @ graph.graph.bwd_ms) * scale,
        cut_bytes=states.cut_bytes * scale,
        param_bytes=states.param_bytes,
        preds=preds,
        table_s=range_table(compute, valid, np.inf),
        global_batch=global_batch,
    )
