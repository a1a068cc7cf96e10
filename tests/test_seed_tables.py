"""Tests of benchmarks/seed_tables.py: its rows' setups, the 15-1 plan it builds, and its speed-up and implied rate."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

from pipeplan.presets.resolve import load_cluster, load_profile

PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "seed_tables.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("seed_tables", PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["seed_tables"] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


tables = load()


def test_rows_name_their_preset_sized_to_the_published_servers() -> None:
    """Each row's preset has the servers x GPUs of its Table 2 column, every row has a source, and the 15-1 rows split
    at their profile's first Linear layer (the artifact's stage 1 starts there: VGG-16's layer 34, AlexNet's 17)."""
    for row in tables.ROWS:
        servers, per = (int(x) for x in row.servers.split(" ")[0].split("x"))
        cluster = load_cluster(row.cluster)
        assert (cluster.num_nodes, cluster.num_devices) == (servers, servers * per)
        assert row.artifact and row.published > 1
        if row.first_classifier_layer is not None:
            names = [layer.name for layer in load_profile(row.profile).layers]
            linears = [i for i, name in enumerate(names) if "Linear(" in name]
            assert row.first_classifier_layer == linears[0] and row.config == "15-1"
    assert round(tables.ROWS[0].published, 1) == 5.3  # the abstract's "up to 5.3x"


def test_speed_up_is_dp_time_per_sample_over_the_pipelines_and_the_implied_rate_closes() -> None:
    """The quick row's speed-up is DP's ms per sample over 15-1's (each from its own simulation), and the implied DP bus
    bandwidth, put back in DP's all-reduce (time inversely proportional to the rate), gives the published speed-up."""
    row = tables.ROWS[0]
    out = tables.pipedream_row(row)
    profile, cluster = load_profile(row.profile), load_cluster(row.cluster)
    dp = tables.data_parallel(profile, cluster, row.minibatch)
    pipe = tables.fifteen_one(profile, cluster, row.minibatch, row.first_classifier_layer)
    assert out["status"] == "simulated" and out["plan"] == "15-1" and pipe["samples"] == 15 * 64
    assert math.isclose(out["simulated"], dp["ms_per_sample"] / pipe["ms_per_sample"], rel_tol=1e-12)
    assert math.isclose(out["error"], out["simulated"] / row.published - 1, rel_tol=1e-12)
    allreduce = dp["allreduce_ms"] * out["preset_busbw_gb_per_s"] / out["implied_dp_busbw_gb_per_s"]
    implied_speedup = (dp["rest_ms"] + allreduce) / dp["samples"] / pipe["ms_per_sample"]
    assert math.isclose(implied_speedup, row.published, rel_tol=1e-12)
    # Cluster-A's 10 Gb/s NIC at line rate: DP's all-reduce time scaled by preset / line rate, the rest held.
    assert out["line_rate_gb_per_s"] == 1.25
    at_line = (dp["rest_ms"] + dp["allreduce_ms"] * out["preset_busbw_gb_per_s"] / 1.25) / dp["samples"]
    assert math.isclose(out["line_rate_speedup"], at_line / pipe["ms_per_sample"], rel_tol=1e-12)
    assert out["closable_by_dp_rate"] == (out["implied_dp_busbw_gb_per_s"] <= 1.25)


def test_quick_mode_prints_both_tables(capsys: object) -> None:
    """--quick runs one PipeDream row and one DAPPLE pair, and prints the DAPPLE comparison against 3.23x."""
    assert tables.main(["--quick"]) == 0
    printed = capsys.readouterr().out  # type: ignore[attr-defined]
    assert "VGG-16" in printed and "dapple/vgg-19" in printed and "up to 3.23x" in printed
