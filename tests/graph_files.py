"""Shared by the graph.txt tests: node lines in the file's own format, written to a file."""

from __future__ import annotations

from pathlib import Path


def node(node_id: str, desc: str, fwd: float = 1.0, bwd: float = 2.0, act: str = "10", params: float = 0.0) -> str:
    """One node line in the file's own format."""
    return (
        f"{node_id} -- {desc} -- forward_compute_time={fwd}, backward_compute_time={bwd}, "
        f"activation_size={act}, parameter_size={params}"
    )


def write(tmp_path: Path, name: str, lines: list[str]) -> Path:
    """Write lines to tmp_path/name and return the path."""
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path
