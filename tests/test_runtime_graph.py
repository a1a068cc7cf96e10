"""`pipeplan train --plan` of a branching model whose stages are antichain cuts, on local processes (gloo)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("sklearn")

from runtime_cli import run_train

pytestmark = [pytest.mark.torch, pytest.mark.slow]

STAGE0 = ["x", "unflatten", "stem", "relu", "blocks_0_conv1", "relu_1", "blocks_0_conv2", "blocks_0_skip", "add", "relu_2",
          "blocks_1_skip"]  # fmt: skip
"""Stage 0 of the antichain plan: the second block's skip branch without its main branch (not a prefix of the
traced order, where blocks_1_conv1..conv2 come before blocks_1_skip)."""
STAGE1 = ["blocks_1_conv1", "relu_3", "blocks_1_conv2", "add_1", "relu_4", "mean", "head"]


def write_inputs(tmp_path: Path) -> None:
    """A one-round profile of rescnn (channels 4) on digits that records its model, and a two-CPU cluster."""
    from dataclasses import replace

    from pipeplan.core.profile import ProfileSource
    from pipeplan.io.profile_json import write_profile_json
    from pipeplan.models.build import build_model
    from pipeplan.profiler import measure_layers

    model = build_model("rescnn", {"channels": "4"}, "digits")
    profile = measure_layers(model.chain_spec(), None, 8, runs=1, warmup=0).to_profile("rescnn-2x4")
    profile = replace(profile, source=ProfileSource("rescnn", (("channels", "4"),), "digits", "float32"))
    write_profile_json(profile, tmp_path / "rescnn.json")
    cluster = {"format": "pipeplan.cluster/1", "name": "two-cpus", "devices": [{"kind": "cpu", "memory_gb": 4}] * 2,
               "bandwidth_gb_per_s": [[0, 1], [1, 0]], "latency_us": [[0, 10], [10, 0]]}  # fmt: skip
    (tmp_path / "cluster.json").write_text(json.dumps(cluster))


def write_plan(path: Path, stages: list[list[str]]) -> None:
    """A 1f1b plan of 4 microbatches of 8 over `stages` (layer names), stage s on device s."""
    first = 0
    entries = []
    for s, names in enumerate(stages):
        entries.append({"devices": [s], "first_layer": first, "last_layer": first + len(names) - 1, "layers": names})
        first += len(names)
    plan = {"format": "pipeplan.plan/1", "profile": "rescnn.json", "cluster": "cluster.json", "schedule": "1f1b",
            "pipeline_replicas": 1, "microbatches": 4, "microbatch_size": 8, "k": 1, "chunks": 1, "order": None,
            "stages": entries}  # fmt: skip
    path.write_text(json.dumps(plan))


def single_process_losses(steps: int, lr: float) -> list[float]:
    """The losses of the whole model on one process, trained as train does: the same rows, 4 microbatches of 8, Adam."""
    import torch

    from pipeplan.models.build import build_model
    from pipeplan.models.datasets import batch_indices
    from pipeplan.runtime.execution.optim import make_optimizer

    model = build_model("rescnn", {"channels": "4"}, "digits")
    net = model.reference()
    optimizer = make_optimizer("adam", net.parameters(), lr)
    losses = []
    for step in range(steps):
        idx = batch_indices(len(model.dataset), 32, step, 0)
        x, y = model.dataset.inputs[idx], model.dataset.targets[idx]
        optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), dtype=torch.float64)
        for lo in range(0, 32, 8):
            loss = model.loss_fn(net(x[lo : lo + 8]), y[lo : lo + 8]) * (8 / 32)
            loss.backward()
            total += loss.detach().double()
        optimizer.step()
        losses.append(float(total))
    return losses


def test_an_antichain_plan_on_two_processes_trains_as_one_process_does(tmp_path: Path) -> None:
    """Two processes cutting across a residual block give the losses of the whole model on one process, and the
    plan's prediction is printed beside the measured step."""
    write_inputs(tmp_path)
    write_plan(tmp_path / "dag.json", [STAGE0, STAGE1])
    from pipeplan.presets.resolve import load_plan

    plan, _ = load_plan(str(tmp_path / "dag.json"))
    assert plan.layer_order is not None and set(plan.layer_order[:11]) != set(range(11))  # not a prefix
    two = run_train(["--plan", str(tmp_path / "dag.json"), "--local", "2", "--steps", "4", "--lr", "0.01", "--json"])
    assert two.returncode == 0, two.stderr
    out = json.loads(two.stdout)
    assert out["losses"] == pytest.approx(single_process_losses(4, 0.01), rel=1e-6, abs=1e-7)
    assert out["predicted_step_ms"] > 0 and out["measured_step_ms"] > 0
