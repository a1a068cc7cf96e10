"""Ada-Grouper: choose kFkB's k at every iteration boundary from what the iterations measured (pure, no torch).

The API (stable; the runtime and the simulator both drive it):

    from pipeplan.adapt import AdaptiveController, ControllerConfig, IterationObservation, Transfer

    # from a plan, priced by the simulator's cost model (what `pipeplan adapt` does) ...
    controller = AdaptiveController.from_plan(plan, cost_model, ControllerConfig())
    # ... or from numbers a runtime measures (one device per stage; lists per stage or per boundary)
    controller = AdaptiveController.from_measurements(
        fwd_ms=[...], bwd_ms=[...],                 # per stage: ms of one microbatch
        boundary_bytes=[...],                       # per boundary b (stage b -> b+1): bytes per microbatch
        boundary_links=[(0, 1), (1, 2), ...],       # per boundary: (device of stage b, device of stage b+1)
        bandwidth_gb_per_s=[...],                   # per boundary: nominal rate, each direction
        static_bytes=[...], activation_bytes=[...], # per stage: always held; held per in-flight microbatch
        memory_limit_bytes=[...],                   # per stage: the device's capacity
        microbatches=m,                             # optional: latency_ms, allreduce_ms, optimizer_ms
    )
    k = controller.k                                # the first iteration's k
    for i in range(iterations):
        ...run iteration i with kfkb(p, m, k), timing it...
        decision = controller.step(IterationObservation(
            index=i, k=k, iteration_ms=..., start_ms=...,        # start on the transfers' clock
            stage_fwd_ms=(...), stage_bwd_ms=(...),              # per stage, mean per microbatch (or empty)
            transfers=(Transfer(link=(src, dst), nbytes=..., start_ms=..., end_ms=...), ...),
        ))
        k = decision.k                              # decision.reason, decision.to_json() for the log

A gradient crosses a boundary on the reverse link (dst, src). Every decision
is kept in `controller.decisions`; the same observations give the same
decisions, so each rank may run its own controller. What a decision does
(ARCHITECTURE.md, "Adaptive k"): estimate each link's effective rate from
its transfers (since its latest change point, and over a long half-life), predict the next iteration's time T(k) for
every k that fits memory by simulating it (sim.engine, the planner's
simulator; memoized), and switch when the gain beats `gain_threshold` under
the short estimate without losing under the long one.

Modules: observation (Transfer, IterationObservation), pipeline
(PipelineModel: costs at nominal bandwidth, memory, bytes per link),
estimate (link rates, stage compute), predict (T(k) and memory by
simulation, the budgeted search), decision (ControllerConfig, Decision),
rate_timeline and replay (T(k) under the last iterations' measured rates
replayed, for a network that changes inside iterations), controller
(AdaptiveController); for the simulator's side: runs (fixed k,
the controller fed by simulated events, the oracle) and compare (every
policy side by side, `pipeplan adapt`).
"""

from pipeplan.adapt.controller import AdaptiveController
from pipeplan.adapt.decision import ControllerConfig, Decision
from pipeplan.adapt.observation import Collective, IterationObservation, Link, Transfer
from pipeplan.adapt.pipeline import PipelineModel

__all__ = [
    "AdaptiveController",
    "Collective",
    "ControllerConfig",
    "Decision",
    "IterationObservation",
    "Link",
    "PipelineModel",
    "Transfer",
]
