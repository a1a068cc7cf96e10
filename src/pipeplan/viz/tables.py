"""Human-readable tables (rich) of simulation results: one result, or several side by side."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

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


def format_ms(ms: float) -> str:
    """A time in ms with 4 significant digits."""
    return f"{ms:.4g}"


def summary_table(result: SimResult) -> Table:
    """Iteration time, lower bound, efficiency and bubble of one result."""
    table = Table(title=f"simulate {result.schedule_name}".rstrip(), show_header=False, title_justify="left")
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


def comparison_table(results: Sequence[tuple[str, SimResult]], title: str = "schedules compared") -> Table:
    """One row per (label, result): iteration time, bubble, efficiency, peak in-flight and memory per rank.

    Memory per rank reads rank 0 first, separated by slashes.
    """
    table = Table(title=title, title_justify="left")
    table.add_column("schedule")
    for header in ("iteration (ms)", "bubble", "efficiency", "max in-flight"):
        table.add_column(header, justify="right")
    table.add_column("peak memory per rank (rank 0 / 1 / ...)")
    for label, result in results:
        table.add_row(
            label,
            format_ms(result.iteration_time),
            f"{result.bubble_fraction:.1%}",
            f"{result.efficiency:.1%}",
            str(max((r.peak_inflight for r in result.per_rank), default=0)),
            " / ".join(format_bytes(r.peak_memory_bytes) for r in result.per_rank),
        )
    return table


def print_tables(*tables: Table, console: Console | None = None) -> None:
    """Print tables one after another on stdout (or `console`)."""
    out = console or Console()
    for table in tables:
        out.print(table)
