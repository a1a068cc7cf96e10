"""runtime.measurement.observations: a process's emulated all-reduces through its slot, and once per stage in the
controller's observation."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from pipeplan.adapt import Collective
from pipeplan.runtime.execution.executor import ActionSpan, StepRecord
from pipeplan.runtime.execution.replicas import AllReduceSpan
from pipeplan.runtime.measurement.observations import observation, pack, slot_size, unpack

pytestmark = pytest.mark.torch

ORIGIN_S = 50.0


def record(process: int, stage: int, collectives: tuple[AllReduceSpan, ...]) -> StepRecord:
    """One forward and one backward of `stage` on `process`, and the given all-reduces."""
    spans = (ActionSpan(process, stage, "F", 0, ORIGIN_S, ORIGIN_S + 0.002),
             ActionSpan(process, stage, "B", 0, ORIGIN_S + 0.004, ORIGIN_S + 0.008))  # fmt: skip
    return StepRecord(0.5, spans, (), 1, ((stage, 1),), collectives=collectives)


def slot(process: int, stage: int, collectives: tuple[AllReduceSpan, ...]) -> list[float]:
    values = pack(record(process, stage, collectives), ORIGIN_S, 1, stage, (ORIGIN_S, ORIGIN_S + 0.1), 1.0, 0, 0, 1)
    size = slot_size(1)
    assert len(values) <= size
    return values + [0.0] * (size - len(values))


def test_a_slot_carries_its_all_reduce_spans_after_its_messages() -> None:
    """A process's emulated all-reduce comes back from its slot as a Collective with its exact times and its bucket's
    bytes; none without."""
    span = AllReduceSpan(0, 12.25, 59.625, 4736, 4.736)
    part = unpack(slot(0, 0, (span,)))
    assert (part["collectives"], part["allreduce_bytes"]) == ([Collective(0, 12.25, 59.625)], {0: 4736})
    assert unpack(slot(2, 1, ()))["collectives"] == []
    assert slot_size(4, stages=2) - slot_size(4) == 4  # each stage of a process adds room for one all-reduce


def test_the_observation_holds_each_stage_s_all_reduce_once_in_stage_order() -> None:
    """Stage 1 on processes 1 and 2 and stage 0 on process 0 (alone: no all-reduce), as every participant recorded
    them: one Collective per stage that ran one."""
    both = AllReduceSpan(1, 30.0, 70.0, 800, 8.0)
    parts = [unpack(slot(0, 0, ())), unpack(slot(1, 1, (both,))), unpack(slot(2, 1, (both,)))]
    seen = observation(3, 1, parts, (0, 1, 2), emulated=True)
    assert seen.collectives == (Collective(1, 30.0, 70.0),)
