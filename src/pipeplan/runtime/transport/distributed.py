"""Joining the process group a launcher (torchrun or --local) set up."""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

from pipeplan.runtime.errors import TrainConfigError


def init_distributed(backend: str | None, timeout_s: float) -> tuple[int, int, torch.device]:
    """Join the process group torchrun (or --local) set up; return (rank, world size, device).

    Raises:
        TrainConfigError: not started by torchrun or --local.
    """
    if not dist.is_initialized():
        missing = [v for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if v not in os.environ]
        if missing:
            raise TrainConfigError(f"pipeplan train must run under torchrun or with --local N (missing {', '.join(missing)})")
        chosen = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        if chosen == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(chosen, timeout=timedelta(seconds=timeout_s))
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    return rank, world, device
