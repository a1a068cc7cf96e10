"""Weight delays and versions of an asynchronous schedule, derived from its order (PipeMare's τ).

On a stage whose schedule holds optimizer steps (U), microbatch j's forward
runs on the weights after the U's that precede it in the stage's order, its
backward on the weights after those that precede the backward. The delay of
j is the difference: how many steps older the forward's weights are than the
backward's. A stage's τ is the largest delay of any of its microbatches (the
steady state; the pipeline's fill sees less). Synchronous schedules (one U
after every backward, or none) have τ = 0 everywhere.

A weight-stashing runtime (PipeDream) would keep one copy of the weights per
version still needed by an in-flight microbatch's backward: `stashed_versions`
counts them from the same order.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeplan.core.schedule import Schedule


@dataclass(frozen=True, slots=True)
class StageDelays:
    """Per stage (stage 0 first): the largest delay τ, the mean delay over its microbatches, and the most weight
    versions in use at once (what weight stashing would keep)."""

    delays: tuple[int, ...]
    mean_delays: tuple[float, ...]
    stashed_versions: tuple[int, ...]


def stage_delays(schedule: Schedule) -> StageDelays:
    """τ per stage of `schedule`, from the position of each stage's U actions among its F and B (module docstring).

    A split backward's delay is taken at its I (the input gradient, which needs the weights); the microbatch
    stops holding its forward's version at its W.
    """
    stages = schedule.num_stages
    delay = [0] * stages
    total = [0] * stages
    count = [0] * stages
    versions = [1] * stages
    release = "W" if schedule.split_backward else "B"
    for actions in schedule.ranks:
        steps: dict[int, int] = {}
        forward_version: dict[tuple[int, int], int] = {}
        live: dict[int, dict[int, int]] = {}  # stage -> weight version -> in-flight microbatches that used it
        for action in actions:
            s, op, mb = action.stage, action.op, action.microbatch
            done = steps.get(s, 0)
            held = live.setdefault(s, {})
            if op == "U":
                steps[s] = done = done + 1
            elif op == "F":
                forward_version[(s, mb)] = done
                held[done] = held.get(done, 0) + 1
            elif (s, mb) in forward_version:
                used = forward_version[(s, mb)]
                if op in "BI":
                    tau = done - used
                    delay[s] = max(delay[s], tau)
                    total[s] += tau
                    count[s] += 1
                if op == release:
                    del forward_version[(s, mb)]
                    held[used] -= 1
                    if not held[used]:
                        del held[used]
            versions[s] = max(versions[s], len(held) + (0 if done in held else 1))
    mean = tuple(total[s] / count[s] if count[s] else 0.0 for s in range(stages))
    return StageDelays(tuple(delay), mean, tuple(versions))
