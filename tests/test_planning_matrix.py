"""Tests of benchmarks/planning_matrix.py: its parsing of plan --json, its targets, its comparison, and the
per-process CPU and memory it measures (against a child that spends known amounts)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "planning_matrix.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("planning_matrix", PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


matrix = load()


def row(wall: float, rss: int = 2**20, time: float | None = 1.0, **key: object) -> dict[str, object]:
    base = {"profile": "p", "cluster": "c", "batch": 256, "wall_s": wall, "cpu_s": wall, "peak_rss_bytes": rss}
    return {**base, "iteration_time": time, "error": None, **key}


def test_a_plan_and_a_refusal_are_parsed() -> None:
    obj = {
        "iteration_time": 12.5,
        "planning_seconds": 3.0,
        "planning": {"phases": [{"name": "simulation", "seconds": 2.0}, {"name": "refine", "seconds": 0.5}]},
    }
    parsed = matrix.parse_plan_output(json.dumps(obj), 0, "")
    digest = hashlib.sha256(b'{"iteration_time": 12.5}').hexdigest()  # the plan without its planning times
    assert parsed == {"iteration_time": 12.5, "plan_sha256": digest, "planning_seconds": 3.0,
                      "slowest_phase": ["simulation", 2.0], "stopped_early": False, "error": None}  # fmt: skip
    obj["planning"] |= {"time_budget_s": 50.0, "stopped_early": True}
    assert matrix.parse_plan_output(json.dumps(obj), 0, "")["stopped_early"] is True
    refused = matrix.parse_plan_output("", 2, "warning\nerror: PlanError: no plan fits\n")
    assert refused == {"iteration_time": None, "error": "error: PlanError: no plan fits"}


def test_the_targets_are_60_s_2_gib_and_a_5_s_median() -> None:
    assert matrix.check([row(60.0, 2 * 2**30), row(1.0), row(1.0)]) == []
    failures = matrix.check([row(60.5), row(1.0, 2 * 2**30 + 1), row(1.0)])
    assert len(failures) == 2 and "60.5 s > 60 s" in failures[0] and "GiB > 2 GiB" in failures[1]
    assert matrix.check([row(5.5), row(5.5), row(1.0)]) == ["median 5.50 s > 5 s"]


def test_compare_lists_the_instances_whose_time_changed_with_both_times() -> None:
    base = [row(1.0, time=10.0), row(1.0, time=10.0, profile="q"), row(1.0, time=10.0, profile="r")]
    now = [row(1.0, time=10.0), row(1.0, time=9.0, profile="q"), row(1.0, time=None, profile="r")]
    changed = matrix.compare(now, base)
    assert changed == [
        "q on c at batch 256: 10.0 ms -> 9.0 ms (faster)",
        "r on c at batch 256: 10.0 ms -> None ms (SLOWER OR LOST)",
    ]


def test_compare_lists_another_plan_of_the_same_time_where_both_rows_have_digests() -> None:
    base = [row(1.0, plan_sha256="a"), row(1.0, profile="q", plan_sha256="a"), row(1.0, profile="r")]
    now = [row(1.0, plan_sha256="a"), row(1.0, profile="q", plan_sha256="b"), row(1.0, profile="r", plan_sha256="b")]
    assert matrix.compare(now, base) == ["q on c at batch 256: 1.0 ms, another plan of the same time"]


def test_the_plan_command_passes_a_time_budget_only_when_given() -> None:
    assert "--time-budget" not in matrix.plan_command("p", "c", 256)
    assert matrix.plan_command("p", "c", 256, "none")[-2:] == ["--time-budget", "none"]


@pytest.mark.slow
def test_an_instance_is_measured_as_its_own_process() -> None:
    # a child that holds 300 MiB and spends 0.3 s of CPU, then prints a plan's JSON
    child = (
        "import json, time\n"
        "block = bytearray(300 * 2**20)\n"
        "end = time.process_time() + 0.3\n"
        "while time.process_time() < end: pass\n"
        "print(json.dumps({'iteration_time': 7.0, 'planning_seconds': 0.3}))\n"
    )
    measured = matrix.run_instance("p", "c", 256, 60.0, [sys.executable, "-c", child])
    assert measured["iteration_time"] == 7.0 and measured["error"] is None
    assert measured["peak_rss_bytes"] >= 300 * 2**20
    assert measured["cpu_s"] >= 0.3
    assert measured["wall_s"] >= 0.3


@pytest.mark.slow
def test_an_instance_past_its_timeout_is_killed_and_fails_the_check() -> None:
    measured = matrix.run_instance("p", "c", 256, 0.5, [sys.executable, "-c", "import time; time.sleep(30)"])
    assert measured["error"] == "killed after 0.5 s" and measured["iteration_time"] is None
    assert any("p on c at batch 256" in f for f in matrix.check([measured]))


def test_the_sources_are_byte_compiled_before_the_first_instance(tmp_path: Path) -> None:
    """compile_sources writes each module's bytecode where an import looks for it (importlib.util.cache_from_source),
    so the instances' processes load bytecode even where PYTHONDONTWRITEBYTECODE is set."""
    module = tmp_path / "pkg" / "mod.py"
    module.parent.mkdir()
    module.write_text("VALUE = 1\n")
    cached = Path(importlib.util.cache_from_source(str(module)))
    assert not cached.exists()
    matrix.compile_sources(tmp_path)
    assert cached.is_file() and cached.stat().st_size > 0


def test_the_median_instance_is_given_in_units_of_the_host_reference() -> None:
    rows = [row(2.0), row(4.0), row(9.0)]  # cpu_s = wall_s: medians 4.0 s
    reference = [{"after_instances": n, "wall_s": 1.0, "cpu_s": cpu} for n, cpu in ((0, 0.5), (3, 2.0), (3, 0.8))]
    assert matrix.reference_line(rows, reference) == (
        "host reference: median 0.800 CPU s over 3 runs (0.500-2.000); median instance 5.00 references of CPU, 5.00 of wall"
    )


@pytest.mark.slow
def test_the_host_reference_runs_as_its_own_process() -> None:
    measured = matrix.time_reference(7)
    assert measured["after_instances"] == 7 and measured["cpu_s"] > 0.0 and measured["wall_s"] > 0.0
