"""A file is recognised as a kind pipeplan writes only when pipeplan's own writer wrote it (or it is empty): each
writer's file is its kind and no other, and no other bytes are taken for one."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeplan.io.file_kinds import BANDWIDTH_TRACE, CLUSTER, GRADS_FILE, PERFETTO, PLAN, PNG, PROFILE, FileKind


def _writers() -> dict[FileKind, Callable[[Path], None]]:
    """Each file kind and pipeplan's writer of it."""
    from pipeplan.core.plan import Plan, Stage
    from pipeplan.io.atomic import write_text_atomic
    from pipeplan.io.bandwidth_trace_json import write_bandwidth_trace
    from pipeplan.io.cluster_json import cluster_to_json
    from pipeplan.io.plan_json import write_plan
    from pipeplan.io.profile_json import write_profile_json
    from pipeplan.presets.resolve import load_cluster, load_profile
    from pipeplan.schedules import make_schedule
    from pipeplan.sim import simulate
    from pipeplan.sim.cost.synthetic import rank_costs
    from pipeplan.sim.trace_gen import periodic_trace
    from pipeplan.viz.gantt import render_gantt
    from pipeplan.viz.perfetto import write_timeline

    schedule = make_schedule("1f1b", 2, 4)
    result = simulate(schedule, rank_costs(schedule, 1.0, 2.0, 0.5, 0.0), record=True)
    plan = Plan((Stage(0, 12, (0,)), Stage(13, 25, (1,))), 1, 4, 2, "1f1b")
    trace = periodic_trace(100.0, 0.5, 0.5, 1000.0, None, 0.0)
    cluster_text = json.dumps(cluster_to_json(load_cluster("v100-8x1")), indent=2, sort_keys=True)
    return {
        PLAN: lambda p: write_plan(plan, p, "dapple/vgg-19", "v100-8x1"),
        PROFILE: lambda p: write_profile_json(load_profile("dapple/vgg-19"), p),
        CLUSTER: lambda p: write_text_atomic(p, cluster_text),
        BANDWIDTH_TRACE: lambda p: write_bandwidth_trace(trace, p, {}),
        PERFETTO: lambda p: write_timeline(result, str(p)),
        PNG: lambda p: render_gantt(result, str(p)),
    }


KINDS = [PLAN, PROFILE, CLUSTER, BANDWIDTH_TRACE, PERFETTO, PNG]


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One file of each kind, written by pipeplan's writer of it."""
    folder = tmp_path_factory.mktemp("kinds")
    paths = {}
    for kind, write in _writers().items():
        path = folder / f"{kind.name.replace(' ', '-')}{kind.suffixes[0]}"
        write(path)
        paths[kind.name] = path
    return paths


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_each_writer_s_file_is_its_kind_and_no_other(kind: FileKind, written: dict[str, Path]) -> None:
    """The file pipeplan's writer of a kind wrote is recognised as that kind, and as none of the others."""
    for other in KINDS:
        assert other.holds(written[kind.name]) == (other is kind), (kind.name, other.name)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_an_empty_file_may_be_replaced(kind: FileKind, tmp_path: Path) -> None:
    """An empty file holds nothing to lose: every kind may replace it."""
    (tmp_path / "empty").write_bytes(b"")
    assert kind.holds(tmp_path / "empty")


FOREIGN = [
    b"import torch\n\ndef build():\n    return torch.nn.Linear(2, 2)\n",
    b"my notes\n",
    b'{"traceEvents": []}\n',
    b'{"name": "x", "layers": []}\n',
    b'["format", "pipeplan.plan/1"]\n',
    b"\x89PNX\r\n\x1a\n",
    b"time_s,value\n0,1\n",
]


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
@pytest.mark.parametrize("content", FOREIGN)
def test_a_file_of_another_kind_is_not_recognised(kind: FileKind, content: bytes, tmp_path: Path) -> None:
    """A model's source, notes, another tool's trace, a JSON without pipeplan's format, a near-PNG: none is any kind."""
    (tmp_path / "f").write_bytes(content)
    assert not kind.holds(tmp_path / "f")


@given(st.binary(min_size=1, max_size=512))
def test_no_bytes_without_the_kind_s_mark_are_recognised(content: bytes) -> None:
    """Any bytes that hold none of the marks (format key, PNG signature, Perfetto opening) are no kind at all."""
    import tempfile

    marks = (b"pipeplan.", b"\x89PNG", b"displayTimeUnit")
    if any(mark in content for mark in marks):
        return
    with tempfile.NamedTemporaryFile() as handle:
        handle.write(content)
        handle.flush()
        assert not any(kind.holds(handle.name) for kind in KINDS)


@given(st.sampled_from(KINDS), st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=200))
def test_a_json_object_is_its_kind_exactly_when_its_format_says_so(kind: FileKind, noise: str) -> None:
    """A JSON object is recognised as a JSON kind exactly when it holds "format": "pipeplan.<kind>/N"."""
    import tempfile

    if kind.json_format is None:
        return
    for fmt, expected in ((f"{kind.json_format}3", True), ("pipeplan.other/1", False), (kind.json_format, False)):
        obj = {"a": noise, "format": fmt}
        with tempfile.NamedTemporaryFile("w") as handle:
            handle.write(json.dumps(obj, indent=2, sort_keys=True))
            handle.flush()
            assert kind.holds(handle.name) == expected, (fmt, noise)


@pytest.mark.torch
def test_a_gradients_file_is_what_torch_save_writes(tmp_path: Path) -> None:
    """train's grads-rank-N.pt (torch.save's zip) is a gradients file; the other kinds' files and notes are not."""
    torch = pytest.importorskip("torch")
    torch.save({"w": torch.zeros(2)}, tmp_path / "grads-rank-0.pt")
    assert GRADS_FILE.holds(tmp_path / "grads-rank-0.pt")
    (tmp_path / "mine.pt").write_bytes(b"my notes\n")
    assert not GRADS_FILE.holds(tmp_path / "mine.pt")
