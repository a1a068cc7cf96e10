"""Tests of benchmarks/plans_against_base.py: its verdicts, and one instance priced end to end with this tree as the
base (the same plan, so the same simulated time to the bit)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def load() -> ModuleType:
    sys.path.insert(0, str(BENCHMARKS))  # it imports planning_matrix beside it
    spec = importlib.util.spec_from_file_location("plans_against_base", BENCHMARKS / "plans_against_base.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


against = load()


def row(plan_ms: float | None, base_ms: float | None, status: str = "ok", profile: str = "p") -> dict[str, object]:
    r: dict[str, object] = {"profile": profile, "cluster": "c", "batch": 256, "plan_ms": plan_ms, "status": status}
    if base_ms is not None:
        r["base_ms"] = base_ms
    if status == "ok" and plan_ms is not None and base_ms is not None:
        r["ratio"] = plan_ms / base_ms
    return r


def test_a_slower_or_lost_plan_is_listed_with_both_times_and_an_unplanned_base_apart() -> None:
    rows = [
        row(10.0, 10.0, profile="same"),
        row(9.0, 10.0, profile="faster"),
        row(10.5, 10.0, profile="slower"),
        row(None, None, status="base past 200 s", profile="late"),
        row(None, 10.0, profile="lost"),
    ]
    slower, missing = against.verdicts(rows)
    assert slower == [
        "slower on c at batch 256: base's plan 10.0 ms, this tree's 10.5 ms",
        "lost on c at batch 256: base's plan 10.0 ms, this tree found no plan",
    ]
    assert missing == ["late on c at batch 256: base past 200 s"]


def test_an_instance_with_this_tree_as_its_base_prices_the_same_plan_to_the_bit() -> None:
    src = str(against.SRC)
    compared = against.compare_one((("dapple/bert-24", "v100-8x1", 256), src, src, 300.0, None))
    assert compared["status"] == "ok" and compared["ratio"] == 1.0
    assert compared["plan_ms"] == compared["base_ms"] > 0


def test_a_base_past_its_timeout_is_not_compared() -> None:
    src = str(against.SRC)
    compared = against.compare_one((("dapple/bert-24", "v100-8x1", 256), src, src, 0.01, 1.0))
    assert compared["status"] == "base past 0.01 s" and "ratio" not in compared
