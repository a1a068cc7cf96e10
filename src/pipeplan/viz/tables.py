"""Human-readable tables (rich) of simulation results: one result, or several side by side."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich import box
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:  # annotations only: `import pipeplan.cli` stays free of the simulator
    from pipeplan.sim.result import SimResult

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def format_bytes(n: float) -> str:
    """Binary-prefixed size: 0 B, 512 B, 64.0 MiB, 1.50 GiB."""
    value = float(n)
    unit = 0
    while abs(value) >= 1024 and unit < len(_UNITS) - 1:
        value /= 1024
        unit += 1
    if unit == 0:
        return f"{value:.0f} B"
    return f"{value:.3g} {_UNITS[unit]}" if value < 100 else f"{value:.0f} {_UNITS[unit]}"


def id_runs(ids: Sequence[int]) -> str:
    """Ids as runs in their order: (0, 1, 2, 3, 8) -> '0-3,8' (sorted ids give every run of consecutive ids once)."""
    parts: list[str] = []
    start = prev = None
    for d in ids:
        if start is not None and prev is not None and d == prev + 1:
            prev = d
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = d
    if start is not None:
        parts.append(str(start) if start == prev else f"{start}-{prev}")
    return ",".join(parts)


def format_ms(ms: float) -> str:
    """A time in ms with 4 significant digits."""
    return f"{ms:.4g}"


METRICS_NOTE = (
    "efficiency: lower bound / iteration time; bubble fraction: idle share of all ranks' time (uneven stages add to it)"
)
"""How the two summary figures differ, printed under a summary table (docs/architecture.md defines both)."""


def summary_table(result: SimResult, title: str = "") -> Table:
    """Iteration time, lower bound, efficiency and bubble of one result; `title` defaults to the schedule name."""
    table = Table(title=title or result.schedule_name or None, show_header=False, title_justify="left")
    table.add_column("quantity")
    table.add_column("value", justify="right")
    table.add_row("iteration time (ms)", format_ms(result.iteration_time))
    table.add_row("lower bound (ms)", format_ms(result.lower_bound))
    table.add_row("efficiency", f"{result.efficiency:.1%}")
    table.add_row("bubble fraction", f"{result.bubble_fraction:.1%}")
    return table


def rank_table(result: SimResult) -> Table:
    """One row per rank: busy and idle time, busy share, peak in-flight microbatches, peak memory."""
    table = Table(title="per rank", title_justify="left")
    for header in ("rank", "busy (ms)", "idle (ms)", "busy %", "peak in-flight", "peak memory"):
        table.add_column(header, justify="right")
    for rank, stats in enumerate(result.per_rank):
        share = stats.busy / result.iteration_time if result.iteration_time > 0 else 0.0
        table.add_row(
            str(rank),
            format_ms(stats.busy),
            format_ms(stats.idle),
            f"{share:.1%}",
            str(stats.peak_inflight),
            format_bytes(stats.peak_memory_bytes),
        )
    return table


def common_unit(sizes: Sequence[float]) -> tuple[str, float]:
    """The binary unit (name, bytes) that prints the largest of sizes with at most four digits."""
    largest = max((abs(x) for x in sizes), default=0.0)
    unit = 0
    while largest >= 10_000 and unit < len(_UNITS) - 1:
        largest /= 1024
        unit += 1
    return _UNITS[unit], float(1024**unit)


def _in_unit(x: float) -> str:
    """A size already divided by its table unit: 4 significant digits, tiny values as <0.01."""
    return "<0.01" if 0 < x < 0.01 else f"{x:.4g}"


def comparison_table(results: Sequence[tuple[str, SimResult]], title: str = "schedules compared") -> Table:
    """One row per (label, result): iteration time, bubble, efficiency, peak in-flight and memory per rank.

    Memory per rank is in one unit for the whole table, rank 0 first, separated
    by slashes; past 8 ranks only the largest and smallest are shown.
    """
    unit_name, unit = common_unit([r.peak_memory_bytes for _, result in results for r in result.per_rank])
    caption = (
        "iter: iteration time; eff: lower bound / iteration time; in-flight: most microbatches a rank holds; "
        "peak memory of rank 0/1/..."
    )
    table = Table(
        title=title, title_justify="left", caption=caption, caption_justify="left", box=box.SIMPLE_HEAD, show_edge=False
    )
    rows = []
    for label, result in results:
        peaks = [r.peak_memory_bytes / unit for r in result.per_rank]
        if len(peaks) <= 8:
            memory = "/".join(_in_unit(x) for x in peaks)
        else:
            memory = f"{_in_unit(max(peaks))} max, {_in_unit(min(peaks))} min"
        rows.append(
            (
                label,
                format_ms(result.iteration_time),
                f"{result.bubble_fraction:.1%}",
                f"{result.efficiency:.1%}",
                str(max((r.peak_inflight for r in result.per_rank), default=0)),
                memory,
            )
        )
    table.add_column("schedule", no_wrap=True)
    for header in ("iter ms", "bubble", "eff", "in-flight"):
        table.add_column(header, justify="right", no_wrap=True)
    table.add_column(f"peak {unit_name}/rank", no_wrap=True)
    for row in rows:
        table.add_row(*row)
    return table


def wide_console(min_width: int = 120) -> Console:
    """A stdout console at least `min_width` columns wide, so a table piped to a file or a pager (where rich would
    assume 80 columns) is not wrapped; a wider terminal keeps its own width."""
    return Console(width=max(Console().width, min_width))


def print_tables(*tables: Table, console: Console | None = None) -> None:
    """Print tables one after another on stdout (or `console`), at least 120 columns wide."""
    out = console or wide_console()
    for table in tables:
        out.print(table)
