"""Limits: each size is accepted at its limit and refused one past it at its root, and every reader of a magnitude
accepts exactly the finite values within bounds, naming the field when it refuses."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeplan.api.scheduling import parse_numbers
from pipeplan.core.errors import ClusterError, CostError, PlanError, ProfileError, ScheduleError, ScheduleTooLargeError
from pipeplan.core.hardware.cluster import Cluster, Device
from pipeplan.core.hardware.links import NodeLinks
from pipeplan.core.limits import (
    DEVICES,
    LAYERS,
    MAX_BYTES,
    MAX_MS,
    MAX_SPEED,
    MIN_BYTES_PER_S,
    MIN_FACTOR,
    MIN_SPEED,
    RANKS,
    Limit,
    show,
)
from pipeplan.core.plan import Plan, Stage
from pipeplan.core.profile import LayerProfile, ModelProfile
from pipeplan.core.schedule import Action, Schedule
from pipeplan.io.bandwidth_trace_json import bandwidth_trace_from_json
from pipeplan.io.cluster_json import cluster_from_json
from pipeplan.io.graph_txt import parse_graph_txt
from pipeplan.io.profile_json import profile_from_json
from pipeplan.schedules import make_schedule
from pipeplan.schedules.pipemare import pipemare

LAYER = {"name": "l", "fwd_ms": 1.0, "bwd_ms": 2.0, "activation_bytes": 1e6, "param_bytes": 1e6}
CLUSTER = {
    "format": "pipeplan.cluster/1", "name": "c", "nodes": 2, "gpus_per_node": 2, "device": {"kind": "V100"},
    "intra_node_gb_per_s": 100, "inter_node_gb_per_s": 10, "latency_us": 5,
}  # fmt: skip


def test_a_limit_says_the_value_the_limit_and_why() -> None:
    """The message reads `what too large: N unit, the limit is M unit, because ...`, too small for a lower bound."""
    most = Limit(10, "ranks", "of a reason")
    assert most.allows(10) and not most.allows(11) and not most.allows(math.nan)
    assert most.message("--stages", 12_000) == "--stages too large: 12,000 ranks, the limit is 10 ranks, because of a reason"
    least = Limit(1e-6, "", "it would overflow", least=True)
    assert least.message("speed", 1e-308) == "speed too small: 1e-308, the limit is 1e-06, because it would overflow"
    assert Limit(1e9, "bytes/s", "r").scaled(1e9, "GB/s").value == 1.0
    assert show(10**5000) == "about 10^5000" and show(2.5) == "2.5" and show(3.0) == "3"


def test_schedules_accept_the_rank_limit_and_refuse_one_more() -> None:
    """4,096 ranks build; 4,097 (a generator's stages, or a Schedule value) are refused before any action is made."""
    ranks = int(RANKS.value)
    assert make_schedule("gpipe", ranks, 1).num_ranks == ranks
    with pytest.raises(ScheduleTooLargeError, match="gpipe with stages=4097, microbatches=1 too large: 4,097 ranks"):
        make_schedule("gpipe", ranks + 1, 1)
    rows = tuple((Action(r, "F", 0), Action(r, "B", 0)) for r in range(ranks + 1))
    with pytest.raises(ScheduleTooLargeError, match="schedule too large: 4,097 ranks, the limit is 4,096 ranks"):
        Schedule(rows, tuple(range(ranks + 1)))


def test_pipemare_counts_its_actions_before_making_them() -> None:
    """pipemare() (which simulate --minibatches calls directly) refuses more than 4,000,000 actions at once."""
    assert len(pipemare(4, 4, 1000).ranks[0]) == 9 * 1000
    with pytest.raises(ScheduleTooLargeError, match=r"minibatches=100000000 too large: 3,600,000,000 actions"):
        pipemare(4, 4, 100_000_000)


@pytest.mark.parametrize("text", ["4000000F0", "0F4000000", "1" + "0" * 30 + "F0", "0B" + "9" * 5000])
def test_an_action_number_is_below_the_action_limit(text: str) -> None:
    """A stage or microbatch number of 4,000,000 or more (a schedule cannot reach it) is refused, however long."""
    assert Action.parse("3999999F3999999").stage == 3_999_999
    with pytest.raises(ScheduleTooLargeError, match="too large"):
        Action.parse(text)


def test_profiles_accept_the_layer_limit_and_refuse_one_more() -> None:
    """20,000 layers build; 20,001 are refused by the profile and, before any layer is built, by the JSON reader."""
    count = int(LAYERS.value)
    layers = tuple(LayerProfile(f"l{i}", 1.0, 1.0, 1.0, 1.0) for i in range(count + 1))
    assert ModelProfile("p", 1, layers[:count]).num_layers == count
    with pytest.raises(ProfileError, match="profile 'p' too large: 20,001 layers, the limit is 20,000 layers"):
        ModelProfile("p", 1, layers)
    obj = {"name": "p", "batch_size": 1, "layers": [LAYER] * (count + 1)}
    with pytest.raises(ProfileError, match=r"f\.json: field 'layers' too large: 20,001 layers"):
        profile_from_json(obj, "f.json")


def test_clusters_accept_the_device_limit_and_refuse_one_more() -> None:
    """131,072 devices build (in kilobytes of links); the description reader refuses 131,073 before building any."""
    n = int(DEVICES.value)
    nodes = np.arange(n + 1) // 8
    devices = tuple(Device(i, "V100", 2**34, 1.0, int(nodes[i])) for i in range(n + 1))
    assert Cluster("c", devices[:n], NodeLinks(nodes[:n], 1e11, 1e10), NodeLinks(nodes[:n], 1e-3, 1e-2)).num_devices == n
    with pytest.raises(ClusterError, match="cluster 'c' too large: 131,073 devices, the limit is 131,072 devices"):
        Cluster("c", devices, NodeLinks(nodes, 1e11, 1e10), NodeLinks(nodes, 1e-3, 1e-2))
    with pytest.raises(ClusterError, match=r"nodes x gpus_per_node \(131,073 x 1\) too large: 131,073 devices"):
        cluster_from_json(CLUSTER | {"nodes": n + 1, "gpus_per_node": 1}, "c.json")


def test_plans_hold_indices_within_the_limits() -> None:
    """A plan's last layer, device ids, replicas and batch are bounded (a plan file of huge numbers is refused)."""
    with pytest.raises(PlanError, match="stage last_layer too large: 20,000, the limit is 19,999"):
        Stage(0, 20_000, (0,))
    with pytest.raises(PlanError, match="device too large: 131,072, the limit is 131,071"):
        Stage(0, 1, (131_072,))
    with pytest.raises(PlanError, match=r"plan global batch \(pipeline_replicas x microbatches x microbatch_size\) too large"):
        Plan((Stage(0, 1, (0,)),), 1, 2**20, 2**11, "1f1b")


def test_trace_steps_are_counted_before_they_are_built(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bandwidth trace longer than TRACE_STEPS is refused on its list's length (here with a limit of 3)."""
    import pipeplan.core.hardware.bandwidth_trace as value
    import pipeplan.io.bandwidth_trace_json as reader

    for module in (value, reader):
        monkeypatch.setattr(module, "TRACE_STEPS", Limit(3, "steps", "a test"))
    steps = [{"t_ms": i, "link": "all", "factor": 1.0} for i in range(4)]
    assert len(bandwidth_trace_from_json(steps[:3]).steps) == 3
    with pytest.raises(CostError, match="bandwidth trace too large: 4 steps, the limit is 3 steps"):
        bandwidth_trace_from_json(steps)


NUMBERS = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from(
    [0.0, 1e-300, 1e-6, 9.99e-7, 1e9, 1.0000001e9, 1e18, 1.01e18, 1e6, 1.01e6, 1e308, -1.0]
)


def _expect(value: float, limits: tuple[Limit, ...], zero: bool = True) -> bool:
    """Whether a reader must accept value: finite, >= 0 (> 0 unless zero), within every limit (0 spared a lower one)."""
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
        return False
    return all(limit.allows(value) or (value == 0 and limit.least) for limit in limits)


def _reads(read: object, value: float, error: type[Exception], field: str) -> bool:
    """Whether the reader accepts value; a refusal must name the field."""
    try:
        read(value)  # type: ignore[operator]
    except error as exc:
        assert field in str(exc), str(exc)
        return False
    return True


@settings(max_examples=150, deadline=None)
@given(NUMBERS)
def test_every_reader_of_a_magnitude_accepts_exactly_the_finite_values_within_bounds(value: float) -> None:
    """Profile times and bytes (JSON and graph.txt), cluster speeds, rates and latencies, trace factors and the
    simulate flags: accepted iff finite and within limits; a refusal names the field (never inf, never a traceback)."""
    json_safe = math.isfinite(value)
    cases = [
        (lambda v: parse_numbers("--fwd", repr(v)), CostError, "--fwd", (MAX_MS,), True),
        (lambda v: parse_numbers("--act-bytes", repr(v), sizes=True), CostError, "--act-bytes", (MAX_BYTES,), True),
        (
            lambda v: parse_graph_txt(
                f"node1 -- L -- forward_compute_time={v!r}, backward_compute_time=1, activation_size=1, parameter_size=1\n",
                "g-pbs-1.txt",
            ),
            ProfileError,
            "forward_compute_time",
            (MAX_MS,),
            True,
        ),
    ]
    if json_safe:
        cases += [
            (lambda v: profile_from_json({"name": "p", "batch_size": 1, "layers": [LAYER | {"fwd_ms": v}]}, "p.json"),
             ProfileError, "fwd_ms", (MAX_MS,), True),
            (lambda v: profile_from_json({"name": "p", "batch_size": 1, "layers": [LAYER | {"param_bytes": v}]}, "p.json"),
             ProfileError, "param_bytes", (MAX_BYTES,), True),
            (lambda v: cluster_from_json(CLUSTER | {"device": {"kind": "V100", "speed": v}}, "c.json"),
             ClusterError, "speed", (MIN_SPEED, MAX_SPEED), False),
            (lambda v: cluster_from_json(CLUSTER | {"inter_node_gb_per_s": v}, "c.json"),
             ClusterError, "inter_node_gb_per_s", (MIN_BYTES_PER_S.scaled(1e9, "GB/s"),), True),
            (lambda v: bandwidth_trace_from_json([{"t_ms": 0, "link": "all", "factor": v}]),
             CostError, "factor", (MIN_FACTOR,), False),
        ]  # fmt: skip
    for read, error, field, limits, zero in cases:
        if field == "inter_node_gb_per_s" and value > 1e9:
            limits = (*limits, Limit(1e9, "", ""))
        if field == "factor" and value > 1e6:
            limits = (*limits, Limit(1e6, "", ""))
        assert _reads(read, value, error, field) == _expect(value, limits, zero), (field, value)


def test_a_schedule_file_of_more_than_the_limits_is_refused_while_it_is_read(tmp_path: Path) -> None:
    """The CSV reader counts rows and cells as it goes (a 100,000-row table stops at row 4,097, nothing simulated)."""
    from pipeplan.io.schedule_io import read_schedule_csv, read_schedule_json

    path = tmp_path / "t.csv"
    path.write_text("\n".join(f"{r}F0,{r}B0" for r in range(100_000)))
    with pytest.raises(ScheduleTooLargeError, match=r"t\.csv: schedule too large: 4,097 ranks"):
        read_schedule_csv(path)
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"format": "pipeplan.schedule/1", "ranks": [["0F0"]] * 5000}))
    with pytest.raises(ScheduleError, match=r"t\.json: 'ranks' too large: 5,000 ranks"):
        read_schedule_json(path)


def test_the_limits_on_many_iterations_are_documented_with_their_values() -> None:
    """docs/troubleshooting.md's section on many iterations quotes each new limit's value."""
    from pipeplan.core.limits import EMULATED_BYTES_PER_S, RUN_BYTES, SIMULATED_EVENTS

    text = (Path(__file__).parent.parent / "docs" / "troubleshooting.md").read_text()
    section = text[text.index("## Limits on many iterations") :]
    assert f"{int(SIMULATED_EVENTS.value):,} events" in section
    assert f"{int(RUN_BYTES.value):,} bytes" in section
    assert EMULATED_BYTES_PER_S.value == 1e4 and "| emulated link rate | 10 kB/s" in section
