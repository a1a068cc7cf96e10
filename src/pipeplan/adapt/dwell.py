"""How long the network's current state is expected to last, from the durations of the states seen so far."""

from __future__ import annotations

from collections.abc import Sequence


def expected_dwell_ms(durations_ms: Sequence[float], age_ms: float, prior_ms: float, prior_weight: float = 1.0) -> float:
    """The expected remaining time of a state that has lasted age_ms (ms): its mean residual life.

    Model: states last independent, identically distributed times, whose
    distribution is the finished states' durations (`durations_ms`) plus a
    prior state of prior_ms weighing `prior_weight` of them. The expected
    remaining time given the age is the mean of (L - age) over the durations L
    longer than the age:

        R(age) = (w [P > age] (P - age) + sum over L_i > age of (L_i - age)) / (w [P > age] + #{L_i > age})

    So a network whose states last 1-2 iterations gives a state detected
    after an iteration about half an iteration more, while one with long
    phases gives a long one. A state older than every duration seen (and the
    prior) is expected to last as long again as it has (R = age): nothing seen
    says when it ends. Deterministic in its inputs.
    """
    weight = prior_weight if prior_ms > age_ms else 0.0
    total = weight * (prior_ms - age_ms)
    count = weight
    for length in durations_ms:
        if length > age_ms:
            total += length - age_ms
            count += 1
    return total / count if count > 0 else age_ms
