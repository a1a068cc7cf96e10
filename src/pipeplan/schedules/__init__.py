"""Static schedule generators, registered by name, and a plan's schedule."""

from pipeplan.schedules.gpipe import gpipe
from pipeplan.schedules.interleaved import interleaved_one_f_one_b
from pipeplan.schedules.kfkb import kfkb
from pipeplan.schedules.one_f_one_b import one_f_one_b
from pipeplan.schedules.plan_schedule import plan_schedule
from pipeplan.schedules.registry import SCHEDULES, make_schedule
from pipeplan.schedules.zero_bubble import zero_bubble_h1

__all__ = [
    "SCHEDULES",
    "gpipe",
    "interleaved_one_f_one_b",
    "kfkb",
    "make_schedule",
    "one_f_one_b",
    "plan_schedule",
    "zero_bubble_h1",
]
