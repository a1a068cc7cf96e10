"""Adaptive k in the runtime: what each process measures and shares, and training whose k changes under a trace."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("torch")

from pipeplan.core.hardware.bandwidth_trace import BandwidthTrace, TraceStep
from pipeplan.core.plan import Plan
from pipeplan.runtime.execution.executor import ActionSpan, StepRecord
from pipeplan.runtime.measurement.observations import observation, pack, slot_size, transfers, unpack
from pipeplan.runtime.placement import Message
from pipeplan.runtime.transport.comm import TransferRecord

pytestmark = pytest.mark.torch  # every test here needs torch (make test-fast leaves them out)

ORIGIN_S = 100.0


def message(kind: str, mb: int) -> Message:
    """Microbatch `mb`'s activation (process 0 -> 1) or gradient (1 -> 0) across boundary 0."""
    src, dst = (0, 1) if kind == "act" else (1, 0)
    return Message(kind, 0, mb, src, dst, 0, 4, 0)


def stage_record(stage: int, received: list[TransferRecord], sent: list[TransferRecord]) -> StepRecord:
    """Two forwards of 2 ms and two backwards of 4 ms on `stage`, with the given messages (times from ORIGIN_S)."""
    spans = [ActionSpan(stage, stage, op, mb, ORIGIN_S + 0.010 * i, ORIGIN_S + 0.010 * i + (0.002 if op == "F" else 0.004))
             for i, (op, mb) in enumerate([("F", 0), ("F", 1), ("B", 0), ("B", 1)])]  # fmt: skip
    return StepRecord(0.5, tuple(spans), tuple(received + sent), 2, ((stage, 2),))


def test_a_slot_carries_a_process_s_measurements_through_the_all_reduce_unchanged() -> None:
    """pack then unpack gives back k, stage, mean compute, times on the run's clock, memory and every message."""
    sent = [TransferRecord(message("act", 0), ORIGIN_S + 0.002, True, 4096)]
    got = [TransferRecord(message("grad", 0), ORIGIN_S + 0.030, False, 4096, 0.005, (25.0, 29.5), ORIGIN_S + 0.020)]
    values = pack(stage_record(0, got, sent), ORIGIN_S, 2, 0, (ORIGIN_S, ORIGIN_S + 0.05), 1.5, 1e6, 2e5, 8e9)
    assert len(values) <= slot_size(2)
    part = unpack(values + [0.0] * (slot_size(2) - len(values)))  # the rest of the slot stays zero
    assert (part["k"], part["stage"], part["fwd_ms"], part["bwd_ms"]) == (2, 0, pytest.approx(2.0), pytest.approx(4.0))
    assert (part["start_ms"], part["end_ms"], part["optimizer_ms"]) == (0.0, pytest.approx(50.0), 1.5)
    assert (part["static_bytes"], part["activation_bytes"], part["memory_limit_bytes"]) == (1e6, 2e5, 8e9)
    assert part["sent"] == {("act", 0, 0, 0, 1): pytest.approx(2.0)}
    ((key, nbytes, at_ms, wait_ms, wire, posted),) = part["received"]
    assert (key, nbytes, wait_ms, wire) == (("grad", 0, 0, 1, 0), 4096, pytest.approx(5.0), (25.0, 29.5))
    assert (at_ms, posted) == (pytest.approx(30.0), pytest.approx(20.0))


def test_a_stage_s_compute_is_what_its_actions_cost_the_process_when_the_executor_measured_it() -> None:
    """With busy times (compute plus the action's own message handling) the means come from them, not the spans."""
    spans = stage_record(1, [], []).compute
    record = StepRecord(0.5, spans, (), 2, ((1, 2),), busy_s=(0.003, 0.003, 0.005, 0.007))
    part = unpack(pack(record, ORIGIN_S, 1, 1, (ORIGIN_S, ORIGIN_S + 0.05), 0.0, 0, 0, 1))
    assert (part["fwd_ms"], part["bwd_ms"]) == (pytest.approx(3.0), pytest.approx(6.0))


def parts_of_two_stages(wait_ms: float, posted_ms: float = 1.0) -> list[dict[str, object]]:
    """Process 0 (device 4) sends act 0 at 2 ms; process 1 (device 7), its receive posted at `posted_ms`, got it at
    9 ms after waiting `wait_ms`."""
    sent = [TransferRecord(message("act", 0), ORIGIN_S + 0.002, True, 4096)]
    got = [TransferRecord(message("act", 0), ORIGIN_S + 0.009, False, 4096, wait_ms / 1000, (3.0, 8.5),
                          ORIGIN_S + posted_ms / 1000)]  # fmt: skip
    first = pack(stage_record(0, [], sent), ORIGIN_S, 1, 0, (ORIGIN_S, ORIGIN_S + 0.040), 1.0, 0, 0, 1)
    second = pack(stage_record(1, got, []), ORIGIN_S, 1, 1, (ORIGIN_S + 0.001, ORIGIN_S + 0.045), 1.0, 0, 0, 1)
    return [unpack(first), unpack(second)]


def test_an_emulated_transfer_is_timed_by_its_stamps_on_its_device_link() -> None:
    """On an emulated network the wire start and arrival stamped by the sender are the transfer's times."""
    (only,) = transfers(parts_of_two_stages(wait_ms=0.0), (4, 7), emulated=True)
    assert (only.link, only.nbytes, only.start_ms, only.end_ms) == ((4, 7), 4096, 3.0, 8.5)


def test_on_the_real_network_only_a_message_waited_for_has_a_known_arrival() -> None:
    """A waited-for message ran from its send (2 ms), or its receive's posting when later (5 ms), to the end of the
    wait (9 ms); one found arrived is left out."""
    (waited,) = transfers(parts_of_two_stages(wait_ms=3.0), (4, 7), emulated=False)
    assert (waited.link, waited.start_ms, waited.end_ms) == ((4, 7), pytest.approx(2.0), pytest.approx(9.0))
    (late,) = transfers(parts_of_two_stages(wait_ms=3.0, posted_ms=5.0), (4, 7), emulated=False)
    assert late.start_ms == pytest.approx(5.0)
    assert transfers(parts_of_two_stages(wait_ms=0.01), (4, 7), emulated=False) == ()


def test_an_iteration_runs_from_stage_0_s_start_to_the_last_optimizer_step_with_compute_in_stage_order() -> None:
    """The observation's iteration is 45 ms (0 to process 1's end), with each stage's mean forward and backward."""
    seen = observation(3, 1, list(reversed(parts_of_two_stages(wait_ms=3.0))), (4, 7), emulated=True)
    assert (seen.index, seen.k, seen.start_ms, seen.iteration_ms) == (3, 1, 0.0, pytest.approx(45.0))
    assert seen.stage_fwd_ms == pytest.approx((2.0, 2.0)) and seen.stage_bwd_ms == pytest.approx((4.0, 4.0))


def test_a_replicated_stage_is_observed_at_its_slowest_replica_from_stage_0_s_earliest_start() -> None:
    """Stage 0 on two processes (forwards of 2 and 3 ms, starts at 1 and 0 ms), stage 1 on one: stage 0 is observed
    at 3 ms forward and 6 ms backward, and the iteration from 0 ms to the last end, 45 ms."""

    def part(stage: int, fwd: float, start_ms: float, end_ms: float) -> dict[str, object]:
        return {"k": 1, "stage": stage, "fwd_ms": fwd, "bwd_ms": 2 * fwd, "start_ms": start_ms, "end_ms": end_ms,
                "sent": {}, "received": []}  # fmt: skip

    parts = [part(1, 4.0, 0.5, 45.0), part(0, 2.0, 1.0, 40.0), part(0, 3.0, 0.0, 41.0)]
    seen = observation(2, 1, parts, (0, 1, 2), emulated=True)
    assert seen.stage_fwd_ms == (3.0, 4.0) and seen.stage_bwd_ms == (6.0, 8.0)
    assert (seen.start_ms, seen.iteration_ms) == (0.0, 45.0)


# ---- no look-ahead: the runtime's decisions read only what has happened -----------------------------------------

REPLAY_PLAN = {"profile": "none.json", "cluster": "none.json", "pipeline_replicas": 1, "microbatches": 4,
               "microbatch_size": 8, "schedule": "kfkb", "k": 1, "chunks": 1, "order": None,
               "stages": [{"first_layer": 0, "last_layer": 1, "devices": [0, 1]},
                          {"first_layer": 2, "last_layer": 3, "devices": [2]}]}  # fmt: skip
"""A replicated stage 0 (2 processes) before stage 1 (1 process), starting at k = 1."""


def step_trace(factors: list[float], every_ms: float) -> BandwidthTrace:
    """Every link at factors[i] from i * every_ms on."""
    return BandwidthTrace(tuple(TraceStep(i * every_ms, None, f) for i, f in enumerate(factors)))


@settings(max_examples=12, deadline=None)
@given(
    shared=st.lists(st.sampled_from([1.0, 0.5, 0.1, 0.05]), min_size=1, max_size=8),
    after_a=st.lists(st.sampled_from([1.0, 0.3, 0.05]), min_size=1, max_size=6),
    after_b=st.lists(st.sampled_from([1.0, 0.3, 0.05]), min_size=1, max_size=6),
)
def test_the_runtime_s_decisions_before_t_never_depend_on_the_trace_after_t(
    shared: list[float], after_a: list[float], after_b: list[float]
) -> None:
    """Two traces equal up to t (the end of `shared`'s steps) and different after: the replayed job (its messages
    through the runtime's link emulation, every process's slot through AdaptiveK.after_step) runs the same k and
    makes the same decisions, to the last field, for every iteration that starts before t."""
    from adaptive_replay import replay
    from pipeplan.io.plan_json import plan_from_json

    every_ms = 15.0
    t_ms = len(shared) * every_ms
    plan, _ = plan_from_json({"format": "pipeplan.plan/1", **REPLAY_PLAN})
    compute = {"F": 1.0, "B": 2.0}
    runs = [replay(plan, step_trace(shared + after, every_ms), 0.004, 14, compute, 2048) for after in (after_a, after_b)]
    a, b = runs
    before = sum(1 for start in a.start_ms if start < t_ms)
    assert a.start_ms[:before] == b.start_ms[:before]
    assert a.k_used[:before] == b.k_used[:before]
    # decisions[j] chose iteration j + 1's k at the end of iteration j, before iteration j + 1 started
    made = max(0, before - 1)
    assert [d.to_json() for d in a.decisions[:made]] == [d.to_json() for d in b.decisions[:made]]


def test_the_replayed_runtime_switches_k_when_the_trace_slows_every_link() -> None:
    """The replay the property runs is not idle: a link slowed to 0.05 from 30 ms on makes the controller leave k = 1."""
    from adaptive_replay import replay
    from pipeplan.io.plan_json import plan_from_json

    plan, _ = plan_from_json({"format": "pipeplan.plan/1", **REPLAY_PLAN})
    loop = replay(plan, step_trace([1.0, 1.0, 0.05], 15.0), 0.004, 14, {"F": 1.0, "B": 2.0}, 2048)
    assert loop.k_used[0] == 1 and max(loop.k_used) > 1, loop.k_used


# ---- two processes: k changes, the mathematics does not -----------------------------------------------------------

TINY = ["--local", "2", "--schedule", "kfkb", "-p", "2", "-m", "4", "--steps", "12", "--opt", "hidden=16", "--opt",
        "blocks=4", "--dataset", "sample", "--dtype", "float64", "--optimizer", "sgd", "--lr", "0.05",
        "--batch-size", "32", "--no-predict", "--json"]  # fmt: skip


PLAN_FREE = [a for i, a in enumerate(TINY[8:]) if "--batch-size" not in (a, TINY[8:][i - 1] if i else "")]
"""TINY's options a plan file does not fix (the plan holds stages, microbatches and their size)."""


def kfkb_plan(path: Path, k: int) -> None:
    """A kfkb plan of the tiny model: layers 0-1 on device 0, 2-3 on device 1 (its profile and cluster are not files)."""
    path.write_text(json.dumps({
        "format": "pipeplan.plan/1", "profile": "none.json", "cluster": "none.json", "pipeline_replicas": 1,
        "microbatches": 4, "microbatch_size": 8, "schedule": "kfkb", "k": k, "chunks": 1, "order": None,
        "stages": [{"first_layer": 0, "last_layer": 1, "devices": [0]}, {"first_layer": 2, "last_layer": 3, "devices": [1]}],
    }))  # fmt: skip


@pytest.mark.slow
def test_adaptive_training_changes_k_under_a_trace_and_loses_exactly_what_fixed_k_loses(tmp_path: Path) -> None:
    """float64 SGD, 12 steps: fixed k=1, adaptive under a trace that slows the link (k goes down from 4), and adaptive
    from a plan on the real network give the same losses bit for bit, and the adaptive runs report k and decisions."""
    from runtime_cli import run_train

    trace = tmp_path / "slow.json"
    # transfers of 1 KB: 0.1 ms at the emulated 0.01 GB/s, then 2 ms from 40 ms on (3-6 iterations in), where
    # compute is a fraction of that
    trace.write_text(json.dumps([{"t_ms": 0, "link": "all", "factor": 1.0}, {"t_ms": 40, "link": "all", "factor": 0.05}]))
    plan = tmp_path / "plan.json"
    kfkb_plan(plan, 1)
    runs = {
        "fixed": run_train([*TINY, "--k", "1"]),
        "traced": run_train([*TINY, "--k", "4", "--adaptive", "--emulate-gb-per-s", "0.01", "--bandwidth-trace", str(trace)]),
        "real": run_train([*TINY[:2], *PLAN_FREE, "--plan", str(plan), "--adaptive"]),
    }
    out = {}
    for name, done in runs.items():
        assert done.returncode == 0, (name, done.stderr)
        out[name] = json.loads(done.stdout)
    assert out["traced"]["losses"] == out["fixed"]["losses"]
    assert out["real"]["losses"] == out["fixed"]["losses"]
    traced = out["traced"]["adaptive"]
    assert traced["k"][0] == 4 and min(traced["k"]) < 4, traced["k"]  # 4 groups wait on the slowed link longer
    switches = [d for d in traced["decisions"] if d["switched"]]
    assert switches and all(d["reason"].startswith("switch: k=") for d in switches)
    # the stamps time each transfer exactly, so the estimates lie between the trace's 1 and 0.05, and the view "now"
    # (the rate since the latest change point) reads the slowed link's 0.05 once the change is confirmed
    estimates = [d["factors"]["0->1"] for d in traced["decisions"] if "0->1" in d["factors"]]
    assert all(0.05 * (1 - 1e-9) < e < 1.0 + 1e-9 for e in estimates), estimates
    assert estimates[-1] == pytest.approx(0.05), estimates
    real = out["real"]["adaptive"]
    assert len(real["k"]) == 12 and len(real["decisions"]) == 12  # built after the warm-up, then one per iteration
    assert all(p > 0 for p in real["predicted_ms"][1:])


# ---- every plan adapts: a replicated stage, two pipeline copies ---------------------------------------------------


def stage_plan(path: Path, devices: list[list[int]], copies: int, microbatch_size: int, profile: str, cluster: str) -> None:
    """A kfkb plan (k = 4) of the tiny model, layers 0-1 and 2-3, on the given devices per stage."""
    path.write_text(json.dumps({
        "format": "pipeplan.plan/1", "profile": profile, "cluster": cluster, "pipeline_replicas": copies,
        "microbatches": 4, "microbatch_size": microbatch_size, "schedule": "kfkb", "k": 4, "chunks": 1, "order": None,
        "stages": [{"first_layer": 0, "last_layer": 1, "devices": devices[0]},
                   {"first_layer": 2, "last_layer": 3, "devices": devices[1]}],
    }))  # fmt: skip


def local_cluster_file(path: Path, devices: int) -> None:
    """A cluster of `devices` CPU devices joined by 0.01 GB/s links (the emulated network's rates)."""
    from pipeplan.io.cluster_json import cluster_to_json
    from pipeplan.runtime.measurement.prediction import local_cluster

    data = cluster_to_json(local_cluster(devices, 1e-5, 1e7))
    for device in data["devices"]:
        device["kind"] = "cpu"
    path.write_text(json.dumps(data))


@pytest.mark.slow
def test_a_replicated_stage_and_two_pipeline_copies_adapt_under_a_trace_and_lose_what_fixed_k_loses(tmp_path: Path) -> None:
    """A plan with stage 0 on 2 processes and stage 1 on 1 (its profile and cluster known: the controller is built
    before the first step) and a plan of 2 pipeline copies (built from the warm-up) both change k under a trace that
    slows every link, report each k's measured peak memory, and give fixed k = 1's losses up to the order in which
    the data-parallel gradients are summed (float64)."""
    import subprocess
    import sys

    from runtime_cli import BOOT, run_train

    profile, cluster = tmp_path / "p.json", tmp_path / "c.json"
    made = subprocess.run([sys.executable, "-c", BOOT, "profile", "mlp", "--opt", "hidden=16", "--opt", "blocks=4",
                           "--dataset", "sample", "--dtype", "float64", "-b", "8", "-o", str(profile), "--runs", "2",
                           "--warmup", "1", "-q"], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert made.returncode == 0, made.stderr
    local_cluster_file(cluster, 3)
    trace = tmp_path / "slow.json"
    # a piece of 512 B (4 samples of 16 float64) takes 10 ms from 40 ms on: longer than any forward even under load
    trace.write_text(json.dumps([{"t_ms": 0, "link": "all", "factor": 1.0}, {"t_ms": 40, "link": "all", "factor": 0.005}]))
    replicated, copies = tmp_path / "replicated.json", tmp_path / "copies.json"
    stage_plan(replicated, [[0, 1], [2]], 1, 8, "p.json", "c.json")
    stage_plan(copies, [[0, 2], [1, 3]], 2, 4, "none.json", "none.json")
    traced = ["--adaptive", "--bandwidth-trace", str(trace)]
    runs = {
        "fixed": run_train([*TINY, "--k", "1"]),
        "replicated": run_train(["--local", "3", *PLAN_FREE, "--plan", str(replicated), *traced]),
        "copies": run_train(["--local", "4", *PLAN_FREE, "--plan", str(copies), *traced, "--emulate-gb-per-s", "0.01"]),
    }
    out = {}
    for name, done in runs.items():
        assert done.returncode == 0, (name, done.stderr)
        out[name] = json.loads(done.stdout)
    fixed = out["fixed"]["losses"]
    for name in ("replicated", "copies"):
        assert out[name]["losses"] == pytest.approx(fixed, rel=1e-12, abs=0), name
        adaptive = out[name]["adaptive"]
        assert adaptive["k"][0] == 4 and min(adaptive["k"]) < 4, (name, adaptive["k"])  # every link slowed: k comes down
        used = {str(k) for k in adaptive["k"]}
        assert set(adaptive["peak_memory_bytes_by_k"]) == used, name  # measured at every k used, none other
        assert adaptive["peak_memory_bytes"] == max(adaptive["peak_memory_bytes_by_k"].values())
        assert max(out[name]["measured_memory_bytes"]) == adaptive["peak_memory_bytes"]
    # built from the plan before the first step: a decision (and a prediction) for the warm-up too
    assert len(out["replicated"]["adaptive"]["decisions"]) == 13 and out["replicated"]["adaptive"]["predicted_ms"][0] > 0
    assert len(out["copies"]["adaptive"]["decisions"]) == 12 and out["copies"]["adaptive"]["predicted_ms"][0] is None


def test_the_warm_up_build_prices_a_replicated_stage_s_ring_and_sees_a_trace_slow_only_that_ring() -> None:
    """Stage 0 on devices 0 and 1 all-reduces 8,000 gradient bytes over links at 4 MB/s: the controller built from the
    warm-up holds the ring (0, 1) at 2(n-1)/n x 8,000 B / 4 MB/s = 2 ms; when the trace slows only the ring's links to
    0.1 (from 40 ms on; no transfer crosses them), its decisions read the ring at 0.1 of nominal, 0.0004 GB/s."""
    from adaptive_replay import replay
    from pipeplan.io.plan_json import plan_from_json

    plan, _ = plan_from_json({"format": "pipeplan.plan/1", **REPLAY_PLAN})
    trace = BandwidthTrace((TraceStep(40.0, (0, 1), 0.1), TraceStep(40.0, (1, 0), 0.1)))
    loop = replay(plan, trace, 0.004, 10, {"F": 1.0, "B": 2.0}, 2048, gradient_bytes=8000)
    assert loop.controller is not None
    ring = loop.controller.pipeline.costs.stages[0]
    assert (ring.allreduce_ring, ring.allreduce_ms, ring.allreduce_latency_ms) == ((0, 1), pytest.approx(2.0), 0.0)
    assert loop.controller.pipeline.allreduce_bytes == (8000.0, 0.0)
    assert loop.controller.pipeline.costs.stages[1].allreduce_ring == ()
    # decision j read iteration j - 1, which ran from start_ms[j - 1] to about start_ms[j]
    ended = loop.start_ms[1:]
    before = [d for d in loop.decisions[1:] if d.iteration < len(ended) + 1 and ended[d.iteration - 1] < 40.0]
    after = [d for d in loop.decisions[1:] if loop.start_ms[d.iteration - 1] >= 40.0]
    assert before and all(d.factors[(0, 1)] == pytest.approx(1.0) for d in before)
    ring_seen = [d.factors[(0, 1)] for d in after]  # the nominal samples weigh less each iteration: down towards 0.1
    assert len(after) >= 5 and ring_seen == sorted(ring_seen, reverse=True) and 0.1 <= ring_seen[-1] < 0.11
    last = after[-1]
    assert last.factors[(1, 0)] == pytest.approx(ring_seen[-1])
    assert last.bandwidth_gb_per_s[(0, 1)] == pytest.approx(0.004 * ring_seen[-1])
    assert last.factors[(0, 2)] == pytest.approx(1.0)  # the transfers' links are not slowed


def test_a_plan_s_k_choices_are_the_runtime_s_candidates_less_those_over_its_memory_limit() -> None:
    """Each process holds 1,000 static bytes and 100 per microbatch in flight (stage 0: 2 at k = 1, 4 from k = 2 on).
    With room for all, the plan's k_choices (1, 2, 4) are exactly the candidates (not 3) and every k run is one of
    them; at a 1,300-byte limit 2 and 4 are over: dropped (reported), k stays 1; a plan starting at the dropped k = 2
    runs it once (the warm-up) and moves to the one that fits."""
    from adaptive_replay import replay
    from pipeplan.core.plan import AdaptiveSetting
    from pipeplan.io.plan_json import plan_from_json

    plan, _ = plan_from_json({"format": "pipeplan.plan/1", **REPLAY_PLAN})
    plan = dataclasses.replace(plan, adaptive=AdaptiveSetting((1, 2, 4), 1e12))
    trace = step_trace([1.0, 1.0, 0.05], 15.0)

    def run(plan: Plan, limit: float) -> Any:
        return replay(plan, trace, 0.004, 10, {"F": 1.0, "B": 2.0}, 2048, activation_bytes=100.0, memory_limit_bytes=limit)

    roomy = run(plan, 1e12)
    assert roomy.controller.k_choices == (1, 2, 4) and roomy.k_dropped == ()
    assert set(roomy.k_used) <= {1, 2, 4} and max(roomy.k_used) > 1, roomy.k_used
    tight = run(plan, 1300.0)
    assert tight.controller.k_choices == (1,) and tight.k_dropped == (2, 4) and set(tight.k_used) == {1}
    assert tight.report()["k_dropped"] == [2, 4]
    moved = run(dataclasses.replace(plan, k=2), 1300.0)
    assert moved.k_used[0] == 2 and set(moved.k_used[1:]) == {1}
    unset = run(dataclasses.replace(plan, adaptive=None), 1300.0)
    assert unset.controller.k_choices == (1,) and unset.k_dropped == ()
