"""A script that joins the group through pipeplan and ends without `destroy_process_group` has the group destroyed
at interpreter exit, before the C++ static destructors that otherwise met gloo's live threads (a SIGABRT in about
one 2-rank run in twenty)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from pipeplan.runtime.training.launch import launch_local

pytestmark = [pytest.mark.torch, pytest.mark.slow]

# The first atexit handler registered runs last: it records whether the group was still up when exit got to it.
SCRIPT = """
import atexit, json, os, sys
import torch
import torch.distributed as dist
from pipeplan.runtime.transport.process_group import init_distributed

def record():
    with open(os.path.join(sys.argv[1], "rank-" + os.environ["RANK"] + ".json"), "w") as out:
        json.dump({"initialized_at_exit": dist.is_initialized()}, out)

atexit.register(record)
rank, world, _ = init_distributed("gloo", 60.0)
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
assert total.item() == world * (world + 1) / 2
"""


def test_a_script_that_ends_without_destroying_the_group_has_it_destroyed_at_exit(tmp_path: Path) -> None:
    assert launch_local(2, SCRIPT, [str(tmp_path)], timeout_s=120) == 0
    for rank in range(2):
        assert json.loads((tmp_path / f"rank-{rank}.json").read_text()) == {"initialized_at_exit": False}
