"""Connected components of an undirected graph given as edge arrays, in numpy (no scipy on the planning path).

sim.cost.flow_sets groups a plan's flows by the resources they share; importing scipy.sparse.csgraph for that
cost a `plan` process about a quarter of a second of CPU, more than the grouping of every plan it prices.
"""

from __future__ import annotations

import numpy as np


def component_labels(count: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per node 0..count-1 the smallest node of its connected component, the edges being (a[i], b[i]).

    Min-label hooking with pointer jumping: every round hooks the larger of the two roots of each edge whose ends
    disagree under the smaller, then points every node at its root; a round that hooks nothing ends the loop. A
    root only ever points at a smaller node of its own component, so the labels stay in their component, and they
    stop only when every edge's ends share a root, which is then the component's smallest node.
    """
    label = np.arange(count, dtype=np.int64)
    a = np.asarray(a, dtype=np.int64)
    b = np.asarray(b, dtype=np.int64)
    while True:
        la, lb = label[a], label[b]
        differ = la != lb
        if not differ.any():
            return label
        la, lb = la[differ], lb[differ]
        np.minimum.at(label, np.maximum(la, lb), np.minimum(la, lb))
        while True:  # pointer jumping: every node to its root
            root = label[label]
            if np.array_equal(root, label):
                break
            label = root
