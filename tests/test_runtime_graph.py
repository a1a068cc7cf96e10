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
    from pipeplan.models.zoo.datasets import batch_indices
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


def test_predict_re_profiles_a_captured_model_whose_layers_form_a_chain(tmp_path: Path) -> None:
    """A stock model captured by torch.export is a graph whose layers may form a chain (GPT-2: wte, drop, h.0, h.1,
    ln_f, lm_head); its profile stores that as a chain, and `train --plan --predict` re-profiles its stages instead of
    refusing the run in its workers after the check before them let it through."""
    import os
    import subprocess
    import sys

    from hf_tiny import SOURCE

    (tmp_path / "user_mod.py").write_text(SOURCE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}

    def cli(args: list[str]) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-c", "from pipeplan.cli import main; main()", *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)

    profiled = cli(["profile", "user_mod:build", "-b", "4", "--batch-sizes", "2,4", "-o", "profile.json", "--runs", "1",
                    "--warmup", "0", "-q"])  # fmt: skip
    assert profiled.returncode == 0, profiled.stderr
    layers = [row["name"] for row in json.loads((tmp_path / "profile.json").read_text())["layers"]]
    assert layers == ["transformer.wte", "transformer.drop", "transformer.h.0", "transformer.h.1", "transformer.ln_f",
                      "lm_head"]  # fmt: skip
    plan = {"format": "pipeplan.plan/1", "profile": "profile.json", "cluster": "cluster.json", "schedule": "1f1b",
            "pipeline_replicas": 1, "microbatches": 2, "microbatch_size": 4, "k": 1, "chunks": 1, "order": None,
            "stages": [{"devices": [0], "first_layer": 0, "last_layer": 2},
                       {"devices": [1], "first_layer": 3, "last_layer": 5}]}  # fmt: skip
    cluster = {"format": "pipeplan.cluster/1", "name": "two-cpus", "devices": [{"kind": "cpu", "memory_gb": 4}] * 2,
               "bandwidth_gb_per_s": [[0, 1], [1, 0]], "latency_us": [[0, 10], [10, 0]]}  # fmt: skip
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    (tmp_path / "cluster.json").write_text(json.dumps(cluster))
    trained = cli(["train", "--plan", "plan.json", "--module", "user_mod:build", "--local", "2", "--steps", "3",
                   "--predict", "--json", "-q"])  # fmt: skip
    assert trained.returncode == 0, trained.stderr
    out = json.loads(trained.stdout)
    assert out["predicted_ms"] > 0 and out["measured_ms"] > 0 and out["predicted_step_ms"] > 0
