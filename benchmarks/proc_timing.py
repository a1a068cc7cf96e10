"""Shared by the whole-process benchmarks (startup.py, scale.py): run a command, report wall seconds and peak memory.

Each run is a fresh process; `os.wait4` gives that process's own peak resident memory (ru_maxrss), so no tool
beyond Python is needed. Several commands are timed in turn (A B A B ...), so a drift of the machine's speed
spreads over all of them instead of landing on one.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

PIPEPLAN = [sys.executable, "-c", "from pipeplan.cli import main; main()"]


@dataclass
class Timing:
    """The runs of one command: wall seconds, CPU seconds (user + sys), peak resident MiB, exit codes."""

    label: str
    argv: list[str]
    wall_s: list[float] = field(default_factory=list)
    cpu_s: list[float] = field(default_factory=list)
    peak_mib: list[float] = field(default_factory=list)
    codes: list[int] = field(default_factory=list)
    timed_out: bool = False

    def median_wall(self) -> float:
        """Median wall seconds (inf when no run finished)."""
        return statistics.median(self.wall_s) if self.wall_s else float("inf")

    def median_cpu(self) -> float:
        """Median CPU seconds of the process, user + sys (inf when no run finished): on a shared machine the
        number that load does not stretch."""
        return statistics.median(self.cpu_s) if self.cpu_s else float("inf")

    def median_peak(self) -> float:
        """Median peak resident memory in MiB (inf when no run finished)."""
        return statistics.median(self.peak_mib) if self.peak_mib else float("inf")

    def meets(self, seconds: float | None = None, mib: float | None = None) -> bool:
        """Every run exited 0, and the medians are within the targets given."""
        return (
            set(self.codes) == {0}
            and (seconds is None or self.median_wall() <= seconds)
            and (mib is None or self.median_peak() <= mib)
        )

    def cells(self, digits: int) -> str:
        """The table cells `median | min | max | peak MiB` of the wall seconds and memory."""
        wall = f"{self.median_wall():.{digits}f} | {min(self.wall_s):.{digits}f} | {max(self.wall_s):.{digits}f}"
        return f"{wall} | {self.median_peak():.0f}"


def run_once(timing: Timing, timeout_s: float) -> None:
    """Run the command once (output thrown away); add its wall time, CPU time, peak memory and exit code to `timing`."""
    start = time.perf_counter()
    proc = subprocess.Popen(timing.argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = start + timeout_s
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.perf_counter() > deadline:
            proc.kill()
            os.wait4(proc.pid, 0)
            timing.timed_out = True
            return
        time.sleep(0.005)
    timing.wall_s.append(time.perf_counter() - start)
    timing.cpu_s.append(usage.ru_utime + usage.ru_stime)
    timing.peak_mib.append(usage.ru_maxrss / 1024.0)  # Linux reports KiB
    timing.codes.append(os.waitstatus_to_exitcode(status))
    proc.returncode = timing.codes[-1]


def run_in_turn(timings: list[Timing], runs: int, warmup: int, timeout_s: float) -> None:
    """`warmup` uncounted runs of each command, then `runs` counted rounds, one run of each command per round."""
    for timing in timings:
        for _ in range(warmup):
            scratch = Timing(timing.label, timing.argv)
            run_once(scratch, timeout_s)
    for _ in range(runs):
        for timing in timings:
            if not timing.timed_out:
                run_once(timing, timeout_s)


def time_cases(
    cases: list[tuple[Any, ...]], wanted: str | None, runs: int, timeout_s: float, refuse: Callable[[str], object], hint: str = ""
) -> tuple[list[tuple[Any, ...]], list[Timing]]:
    """The cases (name, label, argv, ...) that `wanted` (comma-separated names; None: all) keeps, timed in turn as
    whole processes between two load lines; `refuse(message)` is called for a name no case has (`hint` follows it)."""
    if wanted is not None:
        names = wanted.split(",")
        unknown = sorted(set(names) - {case[0] for case in cases})
        if unknown:
            refuse(f"--cases: no case {unknown[0]}{hint}")
        cases = [case for case in cases if case[0] in names]
    timings = [Timing(case[1], case[2]) for case in cases]
    print(f"before: {load_line()}")
    run_in_turn(timings, runs, warmup=0, timeout_s=timeout_s)
    print(f"after:  {load_line()}")
    return cases, timings


def load_line() -> str:
    """The machine's load averages, for the record."""
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f}, {os.cpu_count()} CPUs"
