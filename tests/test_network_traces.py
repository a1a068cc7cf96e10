"""api.network_traces: the links a text names, and each generator's trace written with how it was made."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pipeplan.api.network_traces import factor_range, markov_trace, periodic_trace, replay_trace, trace_links
from pipeplan.core.errors import CostError
from pipeplan.io.bandwidth_trace_json import read_bandwidth_trace


def test_a_links_text_names_ordered_pairs_once_in_the_order_given() -> None:
    """ "all" is None; a-b one direction, a=b both, repeats dropped, in the order written."""
    assert trace_links("all") is None
    assert trace_links("0-1, 2=3,1-0,0-1") == [(0, 1), (2, 3), (3, 2), (1, 0)]


def test_inter_node_names_every_pair_of_devices_on_different_nodes() -> None:
    """a100-8x2 (two nodes of 8): 2 x 8 x 8 = 128 ordered pairs, none inside a node."""
    pairs = trace_links("inter-node", "a100-8x2")
    assert pairs is not None and len(pairs) == 128
    assert all((a < 8) != (b < 8) for a, b in pairs)


@pytest.mark.parametrize(
    ("text", "cluster", "message"),
    [
        ("1-1", None, "two different device ids, got '1-1'"),
        ("0-x", None, "got '0-x'"),
        ("inter-node", None, "--links inter-node needs --cluster"),
        ("all", "a100-8x2", "--cluster applies only with --links inter-node"),
    ],
)
def test_a_bad_links_text_is_refused_by_name(text: str, cluster: str | None, message: str) -> None:
    """A part that is not a-b / a=b of two ids, inter-node without a cluster, or a cluster without inter-node."""
    with pytest.raises(CostError, match=message):
        trace_links(text, cluster)


def test_a_factor_range_is_two_numbers() -> None:
    """ "0.1,0.5" is (0.1, 0.5); one number is refused naming --factor-range."""
    assert factor_range("0.1,0.5") == (0.1, 0.5)
    with pytest.raises(CostError, match=re.escape("--factor-range must be two numbers LOW,HIGH, got '0.1'")):
        factor_range("0.1")


def test_each_generator_writes_the_trace_it_returns_and_how_it_was_made(tmp_path: Path) -> None:
    """The file read back is the returned trace; its generator records the kind and the arguments."""
    series = tmp_path / "s.csv"
    series.write_text("# measured somewhere\ntime_s,mbps\n0,100\n1,50\n")
    made = {
        "periodic": periodic_trace(100.0, 0.5, 0.25, 400.0, links="0=1", out=str(tmp_path / "periodic.json")),
        "markov": markov_trace(3, 50.0, 80.0, "0.1,0.5", 1000.0, out=str(tmp_path / "markov.json")),
        "replay": replay_trace(str(series), 100.0, time_scale=2.0, out=str(tmp_path / "replay.json")),
    }
    for kind, trace in made.items():
        path = tmp_path / f"{kind}.json"
        assert read_bandwidth_trace(path) == trace
        generator = json.loads(path.read_text())["generator"]
        assert generator["kind"] == kind
    assert [(s.t_ms, s.factor) for s in made["replay"].steps] == [(0.0, 1.0), (2000.0, 0.5)]
    assert json.loads((tmp_path / "periodic.json").read_text())["generator"]["links"] == "0=1"
    assert made["periodic"].links() == ((0, 1), (1, 0))


def test_without_out_nothing_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A trace asked for without `out` is only returned."""
    monkeypatch.chdir(tmp_path)
    trace = periodic_trace(100.0, 1.0, 0.5, 200.0)  # duty 1: slowed throughout, the repeated factor dropped
    assert [(s.t_ms, s.factor) for s in trace.steps] == [(0.0, 0.5), (200.0, 1.0)]
    assert list(tmp_path.iterdir()) == []
