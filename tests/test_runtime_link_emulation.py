"""Link emulation: arrivals on an emulated wire (rate x trace factor, one queue per ordered link), and on real processes."""

from __future__ import annotations

import itertools
import json
import math
import re
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeplan.core.hardware.bandwidth_trace import BandwidthTrace, TraceStep
from pipeplan.core.hardware.cluster import Cluster, Device
from pipeplan.runtime.rank_errors import TrainConfigError
from pipeplan.runtime.transport.link_emulation import (
    EmulatedLinks,
    LinkRate,
    Wire,
    check_emulated_rate,
    check_emulation_time,
    check_trace_links,
    ring_links,
    slowest_link,
)

MB = 1_000_000


def test_one_transfer_takes_its_bytes_over_the_rate() -> None:
    """1 MB at 0.1 GB/s issued at 5 ms starts at once and arrives 10 ms later."""
    links = EmulatedLinks.uniform([0, 1], 0.1)
    assert links.transfer((0, 1), MB, 5.0) == (5.0, 15.0)
    assert links.free_ms((0, 1)) == 15.0


def test_transfers_on_one_link_queue_behind_each_other() -> None:
    """Three messages issued together arrive one transfer apart; a later one on the idle link starts when issued."""
    links = EmulatedLinks.uniform([0, 1], 0.1)
    arrivals = [links.transfer((0, 1), MB, 0.0)[1] for _ in range(3)]
    assert arrivals == [10.0, 20.0, 30.0]
    assert links.transfer((0, 1), MB, 12.0) == (30.0, 40.0)  # still busy at 12 ms: waits for the third
    assert links.transfer((0, 1), MB, 55.0) == (55.0, 65.0)  # idle by then


def test_each_ordered_link_has_its_own_queue() -> None:
    """A gradient 1->0 does not wait for an activation 0->1 (links are full-duplex), nor does 0->2."""
    links = EmulatedLinks.uniform([0, 1, 2], 0.1)
    links.transfer((0, 1), 5 * MB, 0.0)
    assert links.transfer((1, 0), MB, 1.0) == (1.0, 11.0)
    assert links.transfer((0, 2), MB, 1.0) == (1.0, 11.0)


def test_the_factor_at_the_start_sets_the_rate_and_a_step_in_flight_retimes_the_rest() -> None:
    """At factor 0.25 from 20 ms a message sent at 30 ms takes 4x; one sent at 15 ms moves half its bytes at each rate."""
    trace = BandwidthTrace((TraceStep(20.0, (0, 1), 0.25), TraceStep(100.0, None, 1.0)))
    links = EmulatedLinks.uniform([0, 1], 0.1, trace)
    assert links.transfer((0, 1), MB, 30.0) == (30.0, 70.0)
    assert links.transfer((1, 0), MB, 30.0) == (30.0, 40.0)  # the trace names 0->1 only
    assert links.transfer((0, 1), MB, 95.0) == (95.0, 108.75)  # 5 ms at 0.25 do 1.25 ms of work, 8.75 ms remain
    fresh = EmulatedLinks.uniform([0, 1], 0.1, trace)
    assert fresh.transfer((0, 1), MB, 15.0) == (15.0, 40.0)  # 5 ms at full rate, 5 ms of work at 0.25 = 20 ms
    assert fresh.factor_at((0, 1), 50.0) == 0.25 and fresh.factor_at((0, 1), 100.0) == 1.0


def test_the_trace_clock_runs_across_iterations_with_the_queue() -> None:
    """A transfer issued while the link still carries the last iteration's waits for it, under the factor of its start."""
    trace = BandwidthTrace((TraceStep(10.0, None, 0.5),))
    links = EmulatedLinks.uniform([0, 1], 0.1, trace)
    links.transfer((0, 1), MB, 0.0)  # arrives at 10 ms, exactly when the factor drops
    assert links.transfer((0, 1), MB, 8.0) == (10.0, 30.0)


def test_a_cluster_gives_each_pair_its_rate_and_latency_which_hold_the_link() -> None:
    """From a cluster file: 2 GB/s and 50 us between nodes, so 1 MB takes 0.55 ms and the next one queues behind it."""
    devices = tuple(Device(i, "cpu", 8 * 2**30, 1.0, node=i) for i in range(2))
    cluster = Cluster("two", devices, ((0.0, 2e9), (2e9, 0.0)), ((0.0, 0.05), (0.05, 0.0)))
    links = EmulatedLinks.from_cluster(cluster, [0, 1])
    rate = links.rates[(0, 1)]
    assert rate.bytes_per_s == 2e9 and rate.latency_ms == pytest.approx(0.05)
    start, end = links.transfer((0, 1), MB, 0.0)
    assert (start, end) == (0.0, pytest.approx(0.55))
    assert links.transfer((0, 1), MB, 0.0)[0] == pytest.approx(0.55)


def test_a_pair_outside_the_emulated_devices_is_refused() -> None:
    """A transfer between devices the emulation does not know names the pair."""
    with pytest.raises(TrainConfigError, match=r"no emulated link \[0, 5\]"):
        EmulatedLinks.uniform([0, 1], 1.0).transfer((0, 5), 10, 0.0)


@pytest.mark.parametrize("rate", [0.0, -1.0, float("nan"), float("inf")])
def test_an_unusable_emulated_rate_names_the_flag(rate: float) -> None:
    """--emulate-gb-per-s must be finite and above 0."""
    with pytest.raises(TrainConfigError, match="--emulate-gb-per-s must be a finite number of GB/s > 0"):
        check_emulated_rate(rate)


def test_a_trace_naming_a_device_outside_the_job_names_step_link_and_devices() -> None:
    """A trace step on link [1, 3] for a job on devices 0 and 1 is refused, naming the step and the job's devices."""
    trace = BandwidthTrace((TraceStep(0.0, None, 0.5), TraceStep(5.0, (1, 3), 0.5)))
    check_trace_links(BandwidthTrace((TraceStep(0.0, (1, 0), 0.5),)), [0, 1])
    with pytest.raises(TrainConfigError, match=r"step 1: link \[1, 3\] names device 3.*devices: \[0, 1\]"):
        check_trace_links(trace, [0, 1])


def test_the_wire_stamps_with_the_run_clock_and_holds_a_message_until_its_arrival() -> None:
    """Processes map to their devices, the clock starts at the origin, and delivery sleeps exactly the time left."""
    now = [100.0]
    slept: list[float] = []
    wire = Wire(EmulatedLinks.uniform([4, 7], 0.1), (4, 7), origin_s=99.0, clock=lambda: now[0], sleep=slept.append)
    assert wire.send(0, 1, MB) == (1000.0, 1010.0)  # process 0 -> 1 is device 4 -> 7, 1 s after the origin
    assert wire.links.free_ms((4, 7)) == 1010.0
    wire.deliver(1010.0)
    assert slept == [pytest.approx(0.010)]
    wire.deliver(999.0)  # already past: no sleep
    assert len(slept) == 1


# ---- a ring all-reduce on the emulated links ----------------------------------------------------------------------


def test_a_ring_all_reduce_at_a_uniform_rate_takes_the_closed_form() -> None:
    """6 MB over 3 devices at 0.1 GB/s: 2(n-1)/n x 6 MB / 1e8 B/s = 80 ms, from whenever it starts; 1 device: 0."""
    links = EmulatedLinks.uniform([0, 1, 2], 0.1)
    assert links.ring_parts((0, 1, 2), 6 * MB) == (pytest.approx(80.0, rel=1e-12), 0.0)
    assert links.ring_end((2, 0, 1), 6 * MB, 12.5) == pytest.approx(92.5, rel=1e-12)
    assert links.ring_end((1,), 6 * MB, 12.5) == 12.5
    assert ring_links((0, 1, 2)) == ((0, 1), (1, 2), (2, 0)) and ring_links((3, 5)) == ((3, 5), (5, 3))


def test_a_step_trace_on_one_ring_link_stretches_the_rest_of_the_work_by_its_factor() -> None:
    """Ring 0->1->2->0, 80 ms of work from 20 ms; link 1->2 drops to 0.25 at 50 ms: 30 ms done at full rate, the other
    50 ms take 200 ms (ends at 250 ms). Link 0->2, off that ring, changes nothing, but it slows the ring 0->2->1->0
    100x; after the drop the work is all 4x, and half the bytes from 5 ms end before the drop."""
    trace = BandwidthTrace((TraceStep(0.0, (0, 2), 0.01), TraceStep(50.0, (1, 2), 0.25)))
    links = EmulatedLinks.uniform([0, 1, 2], 0.1, trace)
    t, f, start, work = 50.0, 0.25, 20.0, 80.0
    assert links.ring_end((0, 1, 2), 6 * MB, start) == pytest.approx(t + (work - (t - start)) / f, rel=1e-12)
    assert links.ring_end((0, 1, 2), 6 * MB, 60.0) == pytest.approx(60.0 + work / f, rel=1e-12)
    assert links.ring_end((0, 1, 2), 3 * MB, 5.0) == pytest.approx(5.0 + work / 2, rel=1e-12)  # over before the drop
    assert links.ring_end((0, 2, 1), 6 * MB, 100.0) == pytest.approx(100.0 + work / 0.01, rel=1e-12)  # the other way: 0->2


def test_the_ring_runs_at_its_slowest_link_at_every_moment_and_the_latency_comes_first() -> None:
    """Two ring links slowed at different times (0.5 on 0->1 from 10 ms, 0.25 on 1->0 from 30 to 60 ms), 1 ms latency
    each: the 2-device ring starts its 40 ms of work at 2 ms, at 1.0 until 10 (8 done), 0.5 until 30 (10 more), 0.25
    until 60 (7.5 more), then 0.5: the last 14.5 take 29 ms, so it ends at 89 ms."""
    rates = {(0, 1): LinkRate(1e8, 1.0), (1, 0): LinkRate(2e8, 0.5)}
    trace = BandwidthTrace((TraceStep(10.0, (0, 1), 0.5), TraceStep(30.0, (1, 0), 0.25), TraceStep(60.0, (1, 0), 1.0)))
    links = EmulatedLinks(rates, trace)
    assert links.ring_parts((0, 1), 4 * MB) == (pytest.approx(42.0, rel=1e-12), 2.0)  # 1/1 x 4 MB / 1e8 + 2 x 1 ms
    assert links.ring_end((0, 1), 4 * MB, 0.0) == pytest.approx(89.0, rel=1e-12)


def test_the_ring_time_without_a_trace_is_the_simulator_s() -> None:
    """From a cluster (rates 1-3 GB/s, latencies 10-40 us, a NIC cap): ring_parts equals link_model.ring_allreduce_ms
    in any ring order; with the cluster's measured all-reduce, that one's rate and latency."""
    from dataclasses import replace

    from pipeplan.sim.cost.link_model import ring_allreduce_ms

    devices = tuple(Device(i, "cpu", 8 * 2**30, 1.0, node=i) for i in range(4))
    rate = tuple(tuple(0.0 if a == b else (1 + (a + b) % 3) * 1e9 for b in range(4)) for a in range(4))
    latency = tuple(tuple(0.0 if a == b else (10 + 10 * ((a * b) % 4)) * 1e-3 for b in range(4)) for a in range(4))
    cluster = Cluster("four", devices, rate, latency, nic_bytes_per_s=2.5e9)
    measured = replace(cluster, allreduce_bytes_per_s=7e8, allreduce_latency_ms=3e-2)
    for c in (cluster, measured):
        links = EmulatedLinks.from_cluster(c, range(4))
        for ring in ((0, 1, 2, 3), (3, 1, 0, 2), (2, 3), (1, 0, 3)):
            expected = ring_allreduce_ms(c, ring, 5e6)
            assert links.ring_parts(ring, 5e6)[0] == pytest.approx(expected, rel=1e-12)
            assert links.ring_end(ring, 5e6, 7.0) == pytest.approx(7.0 + expected, rel=1e-12)


def _reference_ring_end(trace: BandwidthTrace, ring: tuple[int, ...], start: float, latency: float, work: float) -> float:
    """Plain walk: at each breakpoint of any ring link the ring's factor is the least factor_at of its links."""
    links = ring_links(ring)
    cuts = sorted({s.t_ms for s in trace.steps if s.t_ms > start + latency} | {math.inf})
    t, left = start + latency, work
    for cut in cuts:
        factor = min(trace.factor_at(link, t) for link in links)
        if (cut - t) * factor >= left:
            return t + left / factor
        left -= (cut - t) * factor
        t = cut
    raise AssertionError("unreachable: the last segment is endless")


@settings(max_examples=60, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.floats(0, 200),
            st.sampled_from([None, (0, 1), (1, 2), (2, 0), (0, 2), (2, 1)]),
            st.sampled_from([0.1, 0.5, 1.0, 2.0]),
        ),
        max_size=8,
    ),
    ring=st.sampled_from([(0, 1, 2), (2, 1, 0), (0, 2), (1, 2)]),
    start=st.floats(0, 150),
)
def test_the_ring_end_under_any_trace_is_the_plain_walk_over_its_slowest_link(
    steps: list[tuple[float, tuple[int, int] | None, float]], ring: tuple[int, ...], start: float
) -> None:
    """Any step trace, any ring: ring_end equals a plain walk whose factor is the least of the ring links' factors."""
    trace = BandwidthTrace(tuple(TraceStep(t, link, f) for t, link, f in sorted(steps, key=lambda s: s[0])))
    rates = {(a, b): LinkRate(1e8, 0.25) for a in range(3) for b in range(3) if a != b}
    links = EmulatedLinks(rates, trace)
    total, latency = links.ring_parts(ring, 3 * MB)
    expected = _reference_ring_end(trace, ring, start, latency, total - latency)
    assert links.ring_end(ring, 3 * MB, start) == pytest.approx(expected, rel=1e-9)


# ---- two processes: the real transport under emulation ---------------------------------------------------------

RATE_GB_PER_S = 0.05
FLOATS = 500_000  # 2 MB of float32: 40 ms at 0.05 GB/s


def _worker(out: str) -> None:
    """1F1B on 2 processes, 2 microbatches: process 0 sends both activations at once; process 1 times their arrival."""
    import time

    import torch
    import torch.distributed as dist

    from pipeplan.core.plan import Plan, Stage
    from pipeplan.core.schedule import Action
    from pipeplan.runtime.placement import Topology
    from pipeplan.runtime.transport.comm import Comm
    from pipeplan.schedules import make_schedule

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    topology = Topology(Plan((Stage(0, 0, (0,)), Stage(1, 1, (1,))), 1, 2, 1, "1f1b"), make_schedule("1f1b", 2, 2), 2)
    role = topology.roles[rank]
    actions = topology.schedule.ranks[role.sched_rank]
    origin = torch.tensor([time.perf_counter()], dtype=torch.float64)
    dist.broadcast(origin, 0)  # one host: perf_counter is one clock for both processes
    wire = Wire(EmulatedLinks.uniform([0, 1], RATE_GB_PER_S), (0, 1), float(origin))
    comm = Comm(topology, role, actions, torch.device("cpu"), 60.0, wire=wire)
    comm.begin_step(record=True)
    times: dict[str, float] = {}
    payload = torch.ones(1, FLOATS)
    for i, action in enumerate(actions):
        comm.prefetch(i)
        received = comm.receive(action)
        if rank == 1 and action.op == "F":
            times[f"act{action.microbatch}"] = wire.now_ms()
            assert received is not None and received.shape == (1, FLOATS)
        issued = wire.now_ms()
        comm.send(action, payload if action.op == "F" else torch.ones(1, 1))
        if rank == 0 and action.op == "F":
            times[f"send{action.microbatch}"] = wire.now_ms() - issued
        if rank == 0 and action == Action(0, "F", 0):
            times["issued0"] = issued
    comm.finish_step(None)
    times["emulated"] = [list(r.emulated) for r in comm.records if not r.sent]  # type: ignore[assignment]
    Path(out, f"rank{rank}.json").write_text(json.dumps(times))
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.torch
def test_two_processes_deliver_after_the_emulated_time_without_holding_the_sender(tmp_path: Path) -> None:
    """2 MB at 0.05 GB/s arrives 40 ms after it is sent, the next one 40 ms later, and neither send blocks its sender."""
    pytest.importorskip("torch")
    from pipeplan.runtime.training.launch import launch_local, run_file

    assert launch_local(2, run_file(__file__), [str(tmp_path)], timeout_s=120) == 0
    sender = json.loads((tmp_path / "rank0.json").read_text())
    receiver = json.loads((tmp_path / "rank1.json").read_text())
    transfer_ms = FLOATS * 4 / (RATE_GB_PER_S * 1e9) * 1000.0
    assert sender["send0"] < transfer_ms / 4 and sender["send1"] < transfer_ms / 4
    first = receiver["act0"] - sender["issued0"]
    second = receiver["act1"] - sender["issued0"]
    # never before the emulated arrival; after it by no more than a loaded machine's wake-up
    assert transfer_ms <= first < transfer_ms + 15.0, (first, transfer_ms)
    assert 2 * transfer_ms <= second < 2 * transfer_ms + 15.0, (second, transfer_ms)
    (start0, end0), (start1, end1) = receiver["emulated"][:2]
    assert end0 - start0 == pytest.approx(transfer_ms) and (start1, end1) == pytest.approx((end0, end0 + transfer_ms))


if __name__ == "__main__":
    _worker(sys.argv[1])


def test_the_slowest_link_is_the_lowest_nominal_rate_times_its_lowest_factor() -> None:
    """slowest_link: each link's nominal rate x the smallest factor the trace ever gives it (1 where none slows it)."""
    rates = {(0, 1): LinkRate(4e6), (1, 0): LinkRate(2e6), (1, 2): LinkRate(3e6)}
    trace = BandwidthTrace((TraceStep(5.0, (1, 2), 0.5), TraceStep(9.0, (1, 2), 2.0)))
    assert slowest_link(EmulatedLinks(rates, trace)) == ((1, 2), 1.5e6, 0.5)
    assert slowest_link(EmulatedLinks(rates)) == ((1, 0), 2e6, 1.0)


@pytest.mark.parametrize(
    ("gb_per_s", "factor", "refused"),
    [(1e-9, None, True), (1e-5, None, False), (0.99e-5, None, True), (1.0, 1e-6, True), (1.0, 1e-5, False), (1.0, 0.9e-5, True)],
)
def test_the_emulated_rate_has_a_floor_rate_and_factor_together(gb_per_s: float, factor: float | None, refused: bool) -> None:
    """--emulate-gb-per-s x the trace's lowest factor must reach 10 kB/s: just at it passes, just under is refused
    naming the link, the rate, the factor and the limit."""
    trace = BandwidthTrace((TraceStep(100.0, None, factor),)) if factor is not None else None
    links = EmulatedLinks.uniform([0, 1], gb_per_s, trace)
    if not refused:
        check_emulation_time(links, f"--emulate-gb-per-s {gb_per_s:g}", 300.0, None)
        return
    slowed = f" x factor {factor:g} of --bandwidth-trace" if factor is not None else ""
    named = re.escape(f"emulated link 0->1 (--emulate-gb-per-s {gb_per_s:g}{slowed}) too small: ")
    with pytest.raises(TrainConfigError, match=rf"^{named}.* the limit is 10,000 bytes/s"):
        check_emulation_time(links, f"--emulate-gb-per-s {gb_per_s:g}", 300.0, None)


def test_the_largest_message_must_cross_the_slowest_link_within_the_timeout() -> None:
    """A known message size: bytes / lowest rate against --timeout (10 MB at 2 MB/s is 5 s: --timeout 5 passes, 4.9 not)."""
    links = EmulatedLinks.uniform([0, 1], 4e-3, BandwidthTrace((TraceStep(0.0, (0, 1), 0.5),)))
    check_emulation_time(links, "--emulate-gb-per-s 0.004", 5.0, 10e6)
    with pytest.raises(TrainConfigError, match=r"largest message, 10,000,000 bytes, takes 5 s at 2,000,000 bytes/s, longer "
                       r"than --timeout 4.9 s"):  # fmt: skip
        check_emulation_time(links, "--emulate-gb-per-s 0.004", 4.9, 10e6)


@pytest.mark.torch
def test_train_refuses_an_emulated_rate_below_the_floor_before_any_process_starts(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """train --local 2 --emulate-gb-per-s 1e-9: exit 2, one line naming the flag and rate; nothing is launched."""
    import pipeplan.runtime.training.launch as launch
    from cli_runner import run

    monkeypatch.setattr(launch, "launch_local", lambda *a, **k: pytest.fail("launched"))
    args = ["train", "--local", "2", "--schedule", "1f1b", "-p", "2", "-m", "4", "--emulate-gb-per-s", "1e-9", "--steps", "1"]
    code, out, err = run(monkeypatch, capsys, *args)
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: TrainConfigError: emulated link 0->1 (--emulate-gb-per-s 1e-09)")


# ---- train: a replicated stage's all-reduce under an emulated network and a trace --------------------------------

ALLREDUCE_GB_PER_S = 0.001  # 1e6 bytes/s: stage 0's 4,736-byte bucket takes 4.736 ms at the nominal rate
DROP_MS = 60.0  # link 1->0 drops from 0.2 to 0.1 here (0->1 stays at 0.2 throughout)


def _replicated_train(tmp_path: Path, *emulation: str) -> dict[str, object]:
    """`train --local 3 --plan` of the mlp with stage 0 (layers 0-1) on devices 0 and 1, stage 1 on device 2."""
    from pipeplan.core.plan import Plan, Stage
    from pipeplan.io.plan_json import write_plan
    from runtime_cli import run_train

    plan = tmp_path / "plan.json"
    write_plan(Plan((Stage(0, 1, (0, 1)), Stage(2, 3, (2,))), 1, 4, 3, "1f1b"), plan, "mlp", "local")
    args = ["--local", "3", "--plan", str(plan), "--opt", "hidden=8", "--opt", "blocks=3", "--dtype", "float64",
            "--steps", "4", "--seed", "4", "--no-predict", "--json", *emulation]  # fmt: skip
    done = run_train(args, timeout=600)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.slow
@pytest.mark.torch
def test_a_replicated_stage_s_all_reduce_takes_the_emulated_ring_time_under_the_trace(tmp_path: Path) -> None:
    """Stage 0's all-reduce over devices [0, 1] (a ring of links 0->1 and 1->0, which no pipeline message uses) at
    1e6 bytes/s, slowed to 0.2 and to 0.1 from 60 ms: every step's recorded span is the closed form of its start (its
    bytes / rate / the ring's slowest factor, piecewise across the drop), the report's mean is theirs, and the losses
    are the real network's to the bit (the emulation only delays)."""
    from pipeplan.models.build import build_model

    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps([{"t_ms": 0.0, "link": [0, 1], "factor": 0.2},
                                 {"t_ms": DROP_MS, "link": [1, 0], "factor": 0.1}]))  # fmt: skip
    real = _replicated_train(tmp_path)
    emulated = _replicated_train(tmp_path, "--emulate-gb-per-s", str(ALLREDUCE_GB_PER_S), "--bandwidth-trace", str(trace))
    assert emulated["losses"] == real["losses"] and len(real["losses"]) == 4
    assert "allreduce" not in real

    model = build_model("mlp", {"hidden": 8, "blocks": 3}, "digits", "float64", seed=4)
    nbytes = sum(p.numel() * p.element_size() for layer in model.layers[:2] for p in layer.parameters())
    assert nbytes == 4736
    work = nbytes / (ALLREDUCE_GB_PER_S * 1e9) * 1000.0  # 2(n-1)/n = 1 for two devices; no latency

    def closed_form(start: float) -> float:
        if start >= DROP_MS:
            return start + work / 0.1
        if start + work / 0.2 <= DROP_MS:
            return start + work / 0.2
        return DROP_MS + (work - (DROP_MS - start) * 0.2) / 0.1

    ((stage,),) = (emulated["allreduce"],)  # type: ignore[misc]
    assert (stage["stage"], stage["devices"], stage["bytes"]) == (0, [0, 1], nbytes)
    assert stage["nominal_ms"] == pytest.approx(work, rel=1e-9)
    spans = stage["spans_ms"]
    assert len(spans) == 4 and all(b[0] >= a[1] for a, b in itertools.pairwise(spans))
    for start, end in spans:
        assert end == pytest.approx(closed_form(start), rel=1e-9, abs=1e-9)
    assert stage["mean_ms"] == pytest.approx(sum(closed_form(s) - s for s, _ in spans) / 4, rel=1e-9)
    assert any(s >= DROP_MS for s, _ in spans)  # the later steps ran after the drop: 47.36 ms each
