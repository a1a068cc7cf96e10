"""Tests of benchmarks/published_memory.py: its rows' published figures, pipeplan's closed forms they meet, and the
rows it cannot express skipped with a reason."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest

PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "published_memory.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("published_memory", PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["published_memory"] = module
    spec.loader.exec_module(module)
    return module


bench = load()


def test_zero_figure_1_is_met_to_its_rounding_and_zero_3_is_skipped() -> None:
    """120 / 31.4 / 16.6 GB for 7.5B parameters on 64 copies: (2 + 2 + 12) 7.5, 4 x 7.5 + 12 x 7.5 / 64 and
    2 x 7.5 + 14 x 7.5 / 64 GB, which pipeplan's cost model gives exactly; ZeRO-3's row has no prediction."""
    rows = {row["name"]: row for row in bench.state_rows() if row["source"] == bench.ZERO_PAPER}
    closed = {"baseline": 16 * 7.5, "(ZeRO-1)": 4 * 7.5 + 12 * 7.5 / 64, "(ZeRO-2)": 2 * 7.5 + 14 * 7.5 / 64}
    for key, value in closed.items():
        (row,) = [row for name, row in rows.items() if key in name]
        assert math.isclose(row["predicted"], value, rel_tol=1e-12)
        assert round(value, 1) == row["published"]
    (three,) = [row for name, row in rows.items() if "ZeRO-3" in name]
    assert three["predicted"] is None and "never the weights" in three["skipped"]


def test_megatron_layouts_are_met_exactly() -> None:
    """Megatron-LM's three layouts without and with its distributed optimizer at d 8 and 64 are pipeplan's: fp32
    16 / 8 + 8/d (weights are the master), bf16 18 / 6 + 12/d (main_grads fp32), fp16 20 / 4 + 16/d (fp32_copy),
    each by its closed form."""
    rows = [row for row in bench.state_rows() if row["source"] == bench.MEGATRON_DOC]
    assert len(rows) == 9
    forms = {"fp32": (16, 8, 8), "bf16": (18, 6, 12), "fp16": (20, 4, 16)}
    for row in rows:
        plain, kept, sharded = forms[row["name"][:4]]
        d = int(row["name"].rsplit(" ", 1)[1]) if ", d " in row["name"] else None
        closed = plain if d is None else kept + sharded / d
        assert math.isclose(row["predicted"], closed, rel_tol=1e-12)
        assert math.isclose(row["published"], closed, rel_tol=1e-12)


def test_korthikanti_rows_are_the_same_formula_to_1e_12() -> None:
    """Every expressible Table 2 row at every Table 3 shape equals pipeplan's saved bytes of one block; the selective
    recomputation rows are skipped with the reason."""
    rows = bench.activation_rows()
    compared = [row for row in rows if not row["skipped"]]
    assert len(compared) == 16
    for row in compared:
        assert math.isclose(row["predicted"], row["published"], rel_tol=1e-12)
    skipped = [row for row in rows if row["skipped"]]
    assert len(skipped) == 8 and all("fully or not at all" in row["skipped"] for row in skipped)


def test_a_korthikanti_row_would_fail_if_a_share_were_off() -> None:
    """The harness compares what the cost model holds: at t = 8 without sequence parallelism it is not the sequence
    parallel formula (10 + 24/t differs from 34/t), so a lost whole share would show."""
    h, a, s, t = 6144, 64, 2048, 8
    held = bench._block_saved(h, a, s, t, False, False)
    assert held == pytest.approx(s * h * (10 + 24 / t + 5 * a * s / (h * t)), rel=1e-12)
    assert held != pytest.approx(s * h * (34 + 5 * a * s / h) / t, rel=1e-3)


def test_torchtitan_rows_name_their_source_and_only_the_70b_row_is_priced() -> None:
    rows = bench.titan_rows()
    assert all(row["source"] == bench.TORCHTITAN for row in rows)
    priced = [row for row in rows if row["predicted"] is not None]
    assert [row["published"] for row in priced] == [71.9, 67.6]
    assert all(row["error"] is None and row["how"].startswith("nearest") for row in priced)
    assert all(row["skipped"] for row in rows if row["predicted"] is None)
