"""Links: an ordered device pair (`Link`), and link matrices: a value (bytes/s or seconds) for every ordered device
pair, held dense or by structure.

A cluster of n devices has n x n bandwidths and latencies. Measured and small
clusters hold them as one array (`DenseLinks`); a described cluster of
identical nodes holds two values and its exceptions (`NodeLinks`: one value
inside a node, one between nodes, a sorted list of overridden pairs), so that
16,384 devices cost kilobytes, not gigabytes. Both answer numpy-style
indexing (`m[a, b]`, `m[rows, cols]` with broadcasting integer arrays, a row
`m[a]`, rows `m[ids]`, slices), which is how the planners read them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any

import numpy as np

Link = tuple[int, int]
"""An ordered device pair (src, dst), as bandwidth traces and the controller's observations name it."""


def is_link(value: object) -> bool:
    """True for a tuple of two different device ids (ints >= 0, not bools): a valid Link."""
    return (
        isinstance(value, tuple)
        and len(value) == 2
        and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in value)
        and value[0] != value[1]
    )


DENSE_UP_TO = 1024
"""A NodeLinks of at most this many devices also keeps its dense array once read (8 MB at 1024): numpy-speed
look-ups where memory does not matter; above it every look-up is computed from the structure."""


class LinkMatrix(ABC):
    """An n x n matrix of non-negative link values; read-only."""

    n: int

    @abstractmethod
    def values(self, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """Entries at broadcast integer arrays rows, cols (float array of their broadcast shape)."""

    @abstractmethod
    def at(self, a: int, b: int) -> float:
        """One entry as a Python float (the fast path for single pairs)."""

    @abstractmethod
    def transformed(
        self, nodes: np.ndarray, cap_between: float | None, add_off_diagonal: float, diagonal: float | None
    ) -> LinkMatrix:
        """A new matrix: entries between different `nodes` capped at cap_between (None: no cap), add_off_diagonal
        added to every entry off the diagonal, then the diagonal set to `diagonal` (None: kept)."""

    @abstractmethod
    def extremes(self, nodes: np.ndarray) -> tuple[float, float]:
        """(smallest entry between two devices of one node, smallest between different nodes); inf when none."""

    def twins(self, a: int, b: int) -> bool:
        """Whether a and b have the same entries to and from every other device, and a->b equals b->a."""
        others = np.ones(self.n, dtype=bool)
        others[[a, b]] = False
        return bool(
            np.array_equal(self[a][others], self[b][others])
            and np.array_equal(self[:, a][others], self[:, b][others])
            and self.at(a, b) == self.at(b, a)
        )

    @property
    def shape(self) -> tuple[int, int]:
        """(n, n)."""
        return self.n, self.n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, key: Any) -> Any:
        rows, cols = _indices(self.n, key)
        out = self.values(rows, cols)
        return float(out) if out.ndim == 0 else out

    def __iter__(self) -> Iterator[np.ndarray]:
        for a in range(self.n):
            yield self[a]

    def dense(self) -> np.ndarray:
        """The whole n x n matrix as a new float array (n^2 floats: for small clusters and file output)."""
        index = np.arange(self.n)
        return self.values(index[:, None], index[None, :])

    def off_diagonal_min(self) -> float:
        """Smallest entry between two different devices (inf for one device)."""
        return min(self.extremes(np.zeros(self.n, dtype=np.int64)))

    def off_diagonal_max(self) -> float:
        """Largest entry between two different devices (0 for one device)."""
        if self.n < 2:
            return 0.0
        matrix = self.dense()
        np.fill_diagonal(matrix, -np.inf)
        return float(matrix.max())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LinkMatrix):
            return NotImplemented
        return self.n == other.n and bool(np.array_equal(self.dense(), other.dense()))

    def __hash__(self) -> int:
        return hash(("LinkMatrix", self.n))


def _indices(n: int, key: Any) -> tuple[np.ndarray, np.ndarray]:
    """Row and column index arrays (they broadcast together) for numpy-style `key` (ints, integer arrays, slices)."""
    if not isinstance(key, tuple):
        key = (key, slice(None))
    if len(key) != 2:
        raise IndexError(f"a link matrix takes two indices, got {len(key)}")
    rows, cols = _axis(n, key[0]), _axis(n, key[1])
    if isinstance(key[0], slice) or isinstance(key[1], slice):  # as numpy: a slice indexes orthogonally to the other
        rows = rows.reshape(rows.shape + (1,) * cols.ndim)
    return rows, cols


def _axis(n: int, index: Any) -> np.ndarray:
    """One index as a non-negative integer array; IndexError when out of range or not integer."""
    if isinstance(index, slice):
        return np.arange(n)[index]
    if isinstance(index, (int, np.integer)) and not isinstance(index, bool):
        if not -n <= index < n:
            raise IndexError(f"link matrix index {index} out of range 0..{n - 1}")
        return np.asarray(index % n)
    array = np.asarray(index)
    if array.dtype.kind not in "iu":
        raise IndexError(f"link matrix indices must be integers or slices, got {array.dtype}")
    if array.size:
        low = array.min()
        if low < -n or array.max() >= n:
            raise IndexError(f"link matrix index out of range 0..{n - 1}")
        if low < 0:
            array = array % n
    return array


class DenseLinks(LinkMatrix):
    """Every entry stored: an n x n float array (copied, read-only)."""

    def __init__(self, values: np.ndarray) -> None:
        array = np.array(values, dtype=float)
        if array.ndim != 2 or array.shape[0] != array.shape[1]:
            raise ValueError(f"a dense link matrix must be square, got shape {array.shape}")
        array.flags.writeable = False
        self.array = array
        self.n = array.shape[0]

    def values(self, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        return self.array[rows, cols]

    def at(self, a: int, b: int) -> float:
        return self.array.item(a, b)

    def dense(self) -> np.ndarray:
        return self.array.copy()

    def transformed(
        self, nodes: np.ndarray, cap_between: float | None, add_off_diagonal: float, diagonal: float | None
    ) -> LinkMatrix:
        out = self.array.copy()
        if cap_between is not None:
            between = nodes[:, None] != nodes[None, :]
            out[between] = np.minimum(out[between], cap_between)
        kept = out.diagonal().copy()
        if add_off_diagonal:
            out += add_off_diagonal
        np.fill_diagonal(out, kept if diagonal is None else diagonal)
        return DenseLinks(out)

    def extremes(self, nodes: np.ndarray) -> tuple[float, float]:
        same = nodes[:, None] == nodes[None, :]
        np.fill_diagonal(same, False)
        different = nodes[:, None] != nodes[None, :]
        within = float(self.array[same].min()) if same.any() else np.inf
        between = float(self.array[different].min()) if different.any() else np.inf
        return within, between


class NodeLinks(LinkMatrix):
    """Two-level structure: `intra` between two devices of one node, `inter` between nodes, `diagonal` on the
    diagonal, and explicit entries for some ordered pairs (`overrides`: {(a, b): value}, a != b)."""

    def __init__(
        self,
        nodes: np.ndarray,
        intra: float,
        inter: float,
        diagonal: float = 0.0,
        overrides: dict[tuple[int, int], float] | None = None,
    ) -> None:
        self.nodes = np.array(nodes, dtype=np.int64)
        self.nodes.flags.writeable = False
        self.n = len(self.nodes)
        self.intra, self.inter, self.diagonal = float(intra), float(inter), float(diagonal)
        pairs = sorted((overrides or {}).items())
        self.keys = np.array([a * self.n + b for (a, b), _ in pairs], dtype=np.int64)
        self.overrides = np.array([v for _, v in pairs], dtype=float)
        self._override_dict = {a * self.n + b: float(v) for (a, b), v in pairs}
        touched = {a for (a, _), _ in pairs} | {b for (_, b), _ in pairs}
        self._touched = frozenset(touched)
        self._dense: np.ndarray | None = None

    def values(self, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        if self.n <= DENSE_UP_TO:
            if self._dense is None:
                index = np.arange(self.n)
                self._dense = self._computed(index[:, None], index[None, :])
            return self._dense[rows, cols]
        return self._computed(rows, cols)

    def _computed(self, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        out = np.where(self.nodes[rows] == self.nodes[cols], self.intra, self.inter)  # broadcast shape
        out = np.where(rows == cols, self.diagonal, out)
        if len(self.keys):
            keys = rows.astype(np.int64) * self.n + cols
            position = np.minimum(np.searchsorted(self.keys, keys), len(self.keys) - 1)
            out = np.where(self.keys[position] == keys, self.overrides[position], out)
        return np.asarray(out, dtype=float)

    def at(self, a: int, b: int) -> float:
        if a == b:
            return self.diagonal
        value = self._override_dict.get(a * self.n + b)
        if value is not None:
            return value
        return self.intra if self.nodes[a] == self.nodes[b] else self.inter

    def _pairs(self) -> dict[tuple[int, int], float]:
        return {(int(k) // self.n, int(k) % self.n): float(v) for k, v in zip(self.keys, self.overrides, strict=True)}

    def transformed(
        self, nodes: np.ndarray, cap_between: float | None, add_off_diagonal: float, diagonal: float | None
    ) -> LinkMatrix:
        if not np.array_equal(nodes, self.nodes):
            return DenseLinks(self.dense()).transformed(nodes, cap_between, add_off_diagonal, diagonal)
        inter = self.inter if cap_between is None else min(self.inter, cap_between)
        pairs = {}
        for (a, b), value in self._pairs().items():
            if cap_between is not None and self.nodes[a] != self.nodes[b]:
                value = min(value, cap_between)
            pairs[(a, b)] = value + add_off_diagonal
        return NodeLinks(
            self.nodes,
            self.intra + add_off_diagonal,
            inter + add_off_diagonal,
            self.diagonal if diagonal is None else diagonal,
            pairs,
        )

    def _kinds(self) -> tuple[list[float], list[float]]:
        """The distinct values present within nodes and between nodes (structural ones only where some pair keeps them)."""
        counts = np.bincount(self.nodes)
        sizes = counts[counts > 0]
        within_pairs = int((sizes * (sizes - 1)).sum())
        between_pairs = self.n * (self.n - 1) - within_pairs
        pairs = self._pairs()
        over_within = [v for (a, b), v in pairs.items() if self.nodes[a] == self.nodes[b]]
        over_between = [v for (a, b), v in pairs.items() if self.nodes[a] != self.nodes[b]]
        within = [self.intra] if within_pairs > len(over_within) else []
        between = [self.inter] if between_pairs > len(over_between) else []
        return within + over_within, between + over_between

    def extremes(self, nodes: np.ndarray) -> tuple[float, float]:
        if not np.array_equal(nodes, self.nodes):
            return DenseLinks(self.dense()).extremes(nodes)
        within, between = self._kinds()
        return min(within, default=np.inf), min(between, default=np.inf)

    def off_diagonal_min(self) -> float:
        return min(self.extremes(self.nodes))

    def off_diagonal_max(self) -> float:
        within, between = self._kinds()
        return max(within + between, default=0.0)

    def twins(self, a: int, b: int) -> bool:
        if a not in self._touched and b not in self._touched and self.nodes[a] == self.nodes[b]:
            return True  # same node, no exceptions: the same value to and from everyone, intra both ways
        return super().twins(a, b)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, NodeLinks):
            return (
                np.array_equal(self.nodes, other.nodes)
                and (self.intra, self.inter, self.diagonal) == (other.intra, other.inter, other.diagonal)
                and np.array_equal(self.keys, other.keys)
                and np.array_equal(self.overrides, other.overrides)
            )
        return super().__eq__(other)

    def __hash__(self) -> int:
        return super().__hash__()
