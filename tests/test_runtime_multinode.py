"""Two torchrun agents on this machine as two nodes: a plan whose stages span both trains as on one node; probe sees two nodes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("sklearn")

from pipeplan.core.plan import Plan, Stage
from pipeplan.io.plan_json import write_plan
from runtime_cli import run_train

pytestmark = [pytest.mark.torch, pytest.mark.slow]

TRAIN = ["--opt", "hidden=8", "--opt", "blocks=3", "--dtype", "float64", "--steps", "3", "--lr", "0.05",
         "--optimizer", "sgd", "--seed", "4", "--json", "--no-predict"]  # fmt: skip


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def two_nodes(args: list[str], cwd: Path, timeout: float = 300) -> list[subprocess.CompletedProcess[str]]:
    """Run `pipeplan ARGS` under two torchrun agents (--nnodes 2, node ranks 0 and 1, one process each) on 127.0.0.1."""
    port = free_port()
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                "--master-addr", "127.0.0.1", "--master-port", str(port)]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1")
    agents = [
        subprocess.Popen(
            [*torchrun, "--node-rank", str(rank), "-m", "pipeplan", *args],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    done = []
    for agent in agents:
        try:
            out, err = agent.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for a in agents:
                a.kill()
            raise
        done.append(subprocess.CompletedProcess(agent.args, agent.returncode, out, err))
    return done


def test_a_plan_spanning_two_torchrun_nodes_trains_with_the_losses_of_one_process(tmp_path: Path) -> None:
    """Stage 0 on node 0 and stage 1 on node 1 (float64, SGD, 3 steps) give one process's losses to 1e-12."""
    write_plan(Plan((Stage(0, 1, (0,)), Stage(2, 3, (1,))), 1, 4, 3, "1f1b"), tmp_path / "plan.json", "mlp", "local")
    write_plan(Plan((Stage(0, 3, (0,)),), 1, 4, 3, "1f1b"), tmp_path / "one.json", "mlp", "local")

    node0, node1 = two_nodes(["train", "--plan", "plan.json", *TRAIN], tmp_path)
    assert node0.returncode == 0, node0.stderr
    assert node1.returncode == 0, node1.stderr
    spanning = json.loads(node0.stdout)
    assert len(spanning["measured_memory_bytes"]) == 2  # one entry per process

    single = run_train(["--local", "1", "--plan", str(tmp_path / "one.json"), *TRAIN])
    assert single.returncode == 0, single.stderr

    assert spanning["losses"] == pytest.approx(json.loads(single.stdout)["losses"], rel=1e-12)
    assert len(spanning["losses"]) == 3


def test_probe_under_two_torchrun_nodes_writes_one_node_per_agent(tmp_path: Path) -> None:
    """`probe` launched as two nodes on one host writes a cluster whose two devices sit on nodes 0 and 1."""
    node0, node1 = two_nodes(["probe", "--out", "cluster.json", "--rounds", "2"], tmp_path)
    assert node0.returncode == 0, node0.stderr
    assert node1.returncode == 0, node1.stderr
    cluster = json.loads((tmp_path / "cluster.json").read_text())
    assert [d["node"] for d in cluster["devices"]] == [0, 1]


def test_node_key_is_the_host_and_the_launcher_agent() -> None:
    """Processes of one torchrun agent share a node; two agents on one host are two nodes; no agent reads as node 0."""
    from pipeplan.runtime.measurement.probe import node_key

    assert node_key("h", {"GROUP_RANK": "1"}) == node_key("h", {"GROUP_RANK": "1"})
    assert node_key("h", {"GROUP_RANK": "0"}) != node_key("h", {"GROUP_RANK": "1"})
    assert node_key("h", {}) == node_key("h", {"GROUP_RANK": "0"})
    assert node_key("a", {"GROUP_RANK": "0"}) != node_key("b", {"GROUP_RANK": "0"})
