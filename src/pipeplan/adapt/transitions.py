"""The network's states at iteration boundaries and the empirical transitions between them (a Markov estimate)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from itertools import repeat
from operator import truediv

from pipeplan.adapt.observation import Link


class StateChain:
    """States of the network seen at iteration boundaries, and how often each followed each.

    A state is a set of link factors; an observation (the factors at one
    boundary) joins the nearest state whose first-seen factors lie within a
    factor `ratio` of it on every link (links absent: nominal), else starts a
    new one; a state is represented by the factors it was seen with last
    (where the controller predicted it last). Each observation after the first
    counts one transition from the state before it. At most `limit` states are
    kept: the one seen longest ago goes first, with its counts and the transitions into it.

    `next_weights(h)`: where the network is expected to be over the next h
    boundaries, the mean of the rows of P, P^2, ..., P^h from the current
    state, with P(s -> t) = (count(s, t) + prior [t = s]) / (count(s, .) + prior):
    the prior is a state's tendency to stay before its transitions are seen.
    Deterministic in its inputs.
    """

    def __init__(self, ratio: float, prior: float = 1.0, limit: int = 8) -> None:
        self._log_ratio = math.log(ratio)
        self._prior = prior
        self._limit = limit
        self._states: dict[int, dict[Link, float]] = {}  # id -> representative factors (first seen: what matches)
        self._latest: dict[int, dict[Link, float]] = {}  # id -> the factors it was seen with last
        self._counts: dict[int, dict[int, int]] = {}  # id -> {next id: count}
        self._seen: dict[int, int] = {}  # id -> the observation that last saw it
        self._next_id = 0
        self._observed = 0
        self.current: int | None = None

    def observe(self, factors: Mapping[Link, float]) -> int:
        """Place one boundary's factors in a state (a new one if none matches), count the transition into it."""
        state = self.find(factors)
        if state is None:
            state = self._next_id
            self._next_id += 1
            self._states[state] = dict(factors)
            self._counts[state] = {}
        self._latest[state] = dict(factors)
        if self.current is not None and self.current in self._counts:
            row = self._counts[self.current]
            row[state] = row.get(state, 0) + 1
        self._observed += 1
        self._seen[state] = self._observed
        self.current = state
        if len(self._states) > self._limit:
            self._drop(min(self._seen, key=lambda s: self._seen[s]))
        return state

    def representative(self, state: int) -> dict[Link, float]:
        """The factors `state` was last seen with (the prediction of it the controller may have memoized)."""
        return dict(self._latest[state])

    def departures(self, state: int) -> int:
        """Transitions counted out of `state` (to itself included)."""
        return sum(self._counts.get(state, {}).values())

    def next_weights(self, horizon: int = 1) -> dict[int, float]:
        """Each state's expected share of the next `horizon` boundaries from the current one (empty before any)."""
        if self.current is None:
            return {}
        row = {self.current: 1.0}
        total: dict[int, float] = {}
        for _ in range(horizon):
            stepped: dict[int, float] = {}
            for state, weight in row.items():
                for target, p in self._row(state).items():
                    stepped[target] = stepped.get(target, 0.0) + weight * p
            row = stepped
            for state, weight in row.items():
                total[state] = total.get(state, 0.0) + weight / horizon
        return total

    def _row(self, state: int) -> dict[int, float]:
        counts = self._counts.get(state, {})
        n = sum(counts.values()) + self._prior
        if n <= 0:
            return {state: 1.0}
        row = {target: c / n for target, c in counts.items()}
        row[state] = row.get(state, 0.0) + self._prior / n
        return row

    def find(self, factors: Mapping[Link, float]) -> int | None:
        """The state these factors belong to: the nearest (largest |log ratio| over links) within `ratio` on every
        link of a state's first-seen factors; None when none is."""
        limit = self._log_ratio + 1e-12
        nearest, distance = None, math.inf
        log = math.log
        for state, rep in self._states.items():
            links = rep.keys() | factors.keys()  # the largest term, whatever the order: the same float
            ratios = map(truediv, map(factors.get, links, repeat(1.0)), map(rep.get, links, repeat(1.0)))
            far = max(map(abs, map(log, ratios)), default=0.0)
            if far <= limit and far < distance:
                nearest, distance = state, far
        return nearest

    def _drop(self, state: int) -> None:
        del self._states[state], self._latest[state], self._counts[state], self._seen[state]
        for row in self._counts.values():
            row.pop(state, None)
