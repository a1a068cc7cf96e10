"""A planner's progress on the terminal: a rich spinner on stderr with the current phase."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def progress_display(enabled: bool) -> Iterator[Callable[[str, float], None] | None]:
    """A rich spinner on stderr showing the planner's current phase; yields the callback (None when disabled or when
    stderr is not a terminal)."""
    if not enabled:
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    if not console.is_terminal:
        yield None
        return
    with Progress(
        SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), console=console, transient=True
    ) as bar:
        task = bar.add_task("planning", total=1.0)

        def update(message: str, fraction: float) -> None:
            bar.update(task, description=message, completed=max(0.0, min(1.0, fraction)))

        yield update
