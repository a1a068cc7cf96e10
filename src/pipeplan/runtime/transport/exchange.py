"""The one way processes exchange values: JSON bytes in two tensor all_gathers (their lengths, then the bytes).

torch.distributed's `*_object` collectives pickle what they send and unpickle what a peer sent, so one peer could run
code in every other process. Here a peer's value is data, never code: JSON (NaN and infinities as Python's `json`
writes them, so a timing may be `inf`), at most `limit_bytes` a process. Every process sees every length before any
bytes move, so an oversized payload stops all of them alike, naming the process that sent it; bytes that do not read
as JSON are refused naming their sender, never passed to pickle. JSON keeps numbers, strings, None, lists and
str-keyed dicts: a tuple arrives as a list and an int key as a str, so each caller converts its value explicitly.
"""

from __future__ import annotations

import json
from typing import Any

import torch
import torch.distributed as dist

from pipeplan.runtime.rank_errors import RuntimeFault

LIMIT_BYTES = 16 << 20
"""The most bytes of one process's value (the largest exchanged, a step's measured timeline, is ~100 KB)."""


def encode(value: Any) -> bytes:
    """`value` as compact JSON bytes; a value JSON cannot hold (a tuple key, an object) raises TypeError here."""
    return json.dumps(value, separators=(",", ":")).encode()


def decode(data: bytes, rank: int) -> Any:
    """Process `rank`'s value from its bytes.

    Raises:
        RuntimeFault: the bytes are not JSON (named by the sending process).
    """
    try:
        return json.loads(data.decode())
    except (UnicodeDecodeError, ValueError) as exc:
        raise RuntimeFault(
            f"process {rank} sent {len(data):,} bytes that are not JSON ({exc}); every process must run the same pipeplan"
        ) from None


def check_sizes(sizes: list[int], limit_bytes: int) -> None:
    """Refuse, on every process alike, when one process's payload is over `limit_bytes` (or a length is negative)."""
    for rank, size in enumerate(sizes):
        if not 0 <= size <= limit_bytes:
            raise RuntimeFault(
                f"process {rank} sent a {size:,}-byte value, over the {limit_bytes:,}-byte limit of an exchange between "
                "processes; every process must run the same pipeplan"
            )


def all_gather_json(value: Any, limit_bytes: int = LIMIT_BYTES) -> list[Any]:
    """Every process's `value` on every process, process 0 first (a collective call).

    Raises:
        RuntimeFault: a process's value is over `limit_bytes` or does not read as JSON (named by its rank).
    """
    payload = encode(value)
    world = dist.get_world_size()
    on = _device()
    lengths = [torch.zeros(1, dtype=torch.int64, device=on) for _ in range(world)]
    dist.all_gather(lengths, torch.tensor([len(payload)], dtype=torch.int64, device=on))
    sizes = [int(length) for length in lengths]
    check_sizes(sizes, limit_bytes)
    longest = max(sizes)
    ours = torch.zeros(longest, dtype=torch.uint8)
    if payload:
        ours[: len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    gathered = [torch.zeros(longest, dtype=torch.uint8, device=on) for _ in range(world)]
    dist.all_gather(gathered, ours.to(on))
    return [decode(bytes(g[:size].cpu().numpy()), rank) for rank, (g, size) in enumerate(zip(gathered, sizes, strict=True))]


def _device() -> torch.device:
    """Where the group's collectives take their tensors: the process's GPU under NCCL (which moves no CPU tensor)."""
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def gather_json(value: Any, dst: int = 0, limit_bytes: int = LIMIT_BYTES) -> list[Any] | None:
    """Every process's `value` on process `dst` (None elsewhere); a collective call, as `all_gather_json` (the values
    are small, and every process then refuses an oversized one alike)."""
    values = all_gather_json(value, limit_bytes)
    return values if dist.get_rank() == dst else None


__all__ = ["LIMIT_BYTES", "all_gather_json", "check_sizes", "decode", "encode", "gather_json"]
