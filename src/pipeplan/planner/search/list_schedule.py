"""The `list` schedule: memory-bounded list scheduling with critical-path priorities, recorded as a Schedule.

Each rank, whenever it is idle, starts the ready task with the longest
remaining path to the end of the iteration (ties: lowest microbatch), where
a forward may start only while the stage holds fewer in-flight microbatches
than its activation budget. Transfers are timed by the simulator's own
queue (sim.engine.transfers.TransferTable: flows first-come first-served on their resources). The order each rank
followed is the schedule; the simulator then times it like any other.

Note:
    A forward's remaining path (the rest of the forwards, every backward and
    the transfers between) is always longer than a backward's, so ranks run
    forwards eagerly while the budget allows and fall back to backwards: with
    budgets of p - s this is 1F1B that never idles while a forward could run;
    larger budgets hide slow transfers with extra in-flight microbatches.
"""

from __future__ import annotations

import dataclasses
from heapq import heappop, heappush

from pipeplan.core.errors import PlanError
from pipeplan.core.plan import Plan
from pipeplan.core.schedule import Action, Schedule
from pipeplan.core.validate import validate
from pipeplan.sim.cost.link_model import flows_time
from pipeplan.sim.cost.types import Costs
from pipeplan.sim.engine.transfers import TransferTable


def priorities(costs: Costs) -> tuple[list[float], list[float]]:
    """Remaining path to the end of the iteration: per stage, for its F and for its B (unloaded transfers)."""
    p = len(costs.stages)
    fwd_link = [flows_time(f) for f in costs.forward]
    bwd_link = [flows_time(f) for f in costs.backward]
    back = [0.0] * p  # B of s down to stage 0, with the gradient transfers
    for s in range(p):
        back[s] = costs.stages[s].bwd_ms + (back[s - 1] + bwd_link[s - 1] if s > 0 else 0.0)
    fwd_rest = [0.0] * p  # F of s to the last stage, with activation transfers
    for s in range(p - 1, -1, -1):
        fwd_rest[s] = costs.stages[s].fwd_ms + (fwd_rest[s + 1] + fwd_link[s] if s < p - 1 else 0.0)
    return [fwd_rest[s] + back[p - 1] for s in range(p)], back


def list_order(costs: Costs, microbatches: int, budgets: tuple[int, ...]) -> Schedule:
    """Run the list-scheduling policy (one stage per rank) and record each rank's order.

    Args:
        costs: per-stage costs and flows (from plan_costs).
        microbatches: m.
        budgets: per stage, the most microbatches in flight at once (>= 1).

    Raises:
        PlanError: a budget below 1 or the wrong number of budgets.
    """
    p = len(costs.stages)
    if len(budgets) != p or min(budgets) < 1:
        raise PlanError(f"list schedule needs one activation budget >= 1 per stage ({p}), got {budgets}")
    prio_f, prio_b = priorities(costs)
    links = TransferTable(tuple(range(p)), costs, None)  # the simulator's first-come first-served queue
    # ready[s][0]: forwards, ready[s][1]: backwards, each a heap of (-priority, microbatch, op)
    ready: list[tuple[list[tuple[float, int, str]], list[tuple[float, int, str]]]] = [([], []) for _ in range(p)]
    inflight = [0] * p
    idle = [True] * p
    order: list[list[Action]] = [[] for _ in range(p)]
    events: list[tuple[float, int, int, int, str, int]] = []  # (time, seq, kind 0=deliver 1=finish, stage, op, mb)
    seq = 0
    for mb in range(microbatches):
        heappush(ready[0][0], (-prio_f[0], mb, "F"))
    now = 0.0
    done = 0
    total = 2 * p * microbatches
    while done < total:
        # dispatch every idle rank at `now`, in rank order
        for s in range(p):
            if not idle[s]:
                continue
            task = _pick(ready[s], inflight[s] < budgets[s])
            if task is None:
                continue
            _, mb, op = task
            cost = costs.stages[s]
            duration = cost.fwd_ms if op == "F" else cost.bwd_ms
            if op == "F":
                inflight[s] += 1
            order[s].append(Action(s, op, mb))
            idle[s] = False
            heappush(events, (now + duration, seq, 1, s, op, mb))
            seq += 1
        if not events:
            last = [str(order[s][-1]) if order[s] else "-" for s in range(p)]
            raise PlanError(f"list schedule stuck at {now:.3f} ms with {total - done} tasks left (last per rank: {last})")
        now = events[0][0]
        while events and events[0][0] == now:
            _, _, kind, s, op, mb = heappop(events)
            if kind == 0:
                if op == "F":
                    heappush(ready[s][0], (-prio_f[s], mb, op))
                else:
                    heappush(ready[s][1], (-prio_b[s], mb, op))
                continue
            done += 1
            idle[s] = True
            if op == "F":
                if s < p - 1:
                    at = links.run(s, now)[1]
                    heappush(events, (at, seq, 0, s + 1, "F", mb))
                else:
                    heappush(events, (now, seq, 0, s, "B", mb))
            else:
                inflight[s] -= 1
                if s > 0:
                    at = links.run(links.gradient(s - 1), now)[1]
                    heappush(events, (at, seq, 0, s - 1, "B", mb))
            seq += 1
    return Schedule(tuple(tuple(r) for r in order), tuple(range(p)), "list")


def _pick(
    ready: tuple[list[tuple[float, int, str]], list[tuple[float, int, str]]], may_forward: bool
) -> tuple[float, int, str] | None:
    """Pop the best ready task (highest priority, then lowest microbatch); forwards only while the budget allows."""
    forwards, backwards = ready
    if may_forward and forwards and (not backwards or forwards[0] < backwards[0]):
        return heappop(forwards)
    if backwards:
        return heappop(backwards)
    return None


def memory_budgets(plan: Plan, costs: Costs, capacity: tuple[float, ...]) -> tuple[int, ...]:
    """Per stage, the most in-flight microbatches whose activations fit beside its static memory (capped at m).

    Raises:
        PlanError: a stage's weights alone, or one microbatch, do not fit.
    """
    budgets = []
    for s, cost in enumerate(costs.stages):
        room = capacity[s] - cost.static_bytes
        fit = plan.microbatches if cost.saved_bytes <= 0 else int(room // cost.saved_bytes)
        if fit < 1:
            raise PlanError(f"stage {s} has room for {fit} microbatches of activations, the list schedule needs 1")
        budgets.append(min(fit, plan.microbatches))
    return tuple(budgets)


def list_plan(plan: Plan, costs: Costs, budgets: tuple[int, ...]) -> Plan:
    """`plan` with schedule `list`: the recorded order under `costs` and the per-stage budgets (validated)."""
    if plan.chunks != 1:
        raise PlanError(f"the list schedule runs one stage per rank, got chunks={plan.chunks}")
    schedule = validate(list_order(costs, plan.microbatches, budgets))
    return dataclasses.replace(plan, schedule="list", k=1, chunks=1, order=schedule.ranks)
