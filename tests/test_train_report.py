"""viz.train_report: what train prints at the end, here the emulated all-reduces beside the step's times."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from pipeplan.runtime.training.train_config import TrainReport
from pipeplan.schedules import make_schedule
from pipeplan.viz.train_report import print_results

pytestmark = pytest.mark.torch

STAGE = {"stage": 0, "devices": [0, 1], "bytes": 4736, "mean_ms": 42.5, "nominal_ms": 4.736, "spans_ms": [[1.0, 43.5]]}


def report(allreduce: list[dict[str, object]] | None) -> TrainReport:
    done = TrainReport(start_step=0, schedule=make_schedule("1f1b", 2, 4), allreduce=allreduce)
    done.losses, done.pipeline_ms, done.step_ms, done.optimizer_ms = [2.3], [50.0], [52.0], [1.0]
    return done


def test_the_json_carries_each_stage_s_all_reduce_only_when_emulated(capsys: pytest.CaptureFixture[str]) -> None:
    """--json: `allreduce` holds the stages' summaries as measured; a run on the real network has no such key."""
    print_results(report([STAGE]), as_json=True)
    assert json.loads(capsys.readouterr().out)["allreduce"] == [STAGE]
    print_results(report(None), as_json=True)
    assert "allreduce" not in json.loads(capsys.readouterr().out)


def test_the_summary_names_the_stage_its_bytes_devices_and_both_times(capsys: pytest.CaptureFixture[str]) -> None:
    """One line per stage: its bucket, ring devices, mean emulated ms over the steps and its nominal ms."""
    print_results(report([STAGE]), as_json=False)
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("all-reduce:"))
    assert line == ("all-reduce: stage 0's 4.62 KiB over devices [0, 1]: 42.50 ms per step on the emulated network (mean "
                    "of 1 step), 4.74 ms at its nominal rates")  # fmt: skip
