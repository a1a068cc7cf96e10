"""Runtime numerics: after one iteration, every process's gradients equal single-process training on the same global batch.

The module is also the worker script: `python tests/test_runtime_grads.py CASES_JSON OUT_DIR` runs
every case in one process group (started by the runtime's own --local launcher), so each world size
costs one launch.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch") if __name__ != "__main__" else __import__("torch")

from pipeplan.core.schedule import Schedule  # noqa: E402

pytestmark = pytest.mark.torch  # every test here needs torch (make test-fast leaves them out)

MODULE_OPTIONS = (("blocks", 8), ("hidden", 6))
GLOBAL_BATCH_PER_MB = 3  # microbatch size 3: two replicas split it 2 + 1, exercising the split/concat


def hand_made_order(ranks: int, microbatches: int) -> Schedule:
    """A `list` schedule no generator makes: one extra warm-up forward on even ranks, split I/W on odd ranks."""
    from pipeplan.core.schedule import Action
    from pipeplan.core.validate import validate

    out = []
    for r in range(ranks):
        warm = min(microbatches, ranks - r + (1 if r % 2 == 0 else 0))
        order = [Action(r, "F", m) for m in range(warm)]
        for m in range(microbatches):
            if r % 2:
                order += [Action(r, "I", m), Action(r, "W", m)]
            else:
                order.append(Action(r, "B", m))
            if m + warm < microbatches:
                order.append(Action(r, "F", m + warm))
        out.append(tuple(order))
    return validate(Schedule(tuple(out), tuple(range(ranks)), "list"))


def cases_for(world: int) -> list[dict[str, object]]:
    """Every schedule on `world` processes; 3 processes means stage 0 on 2 replicas and stage 1 on 1."""
    if world == 3:
        base = [{"stages": 2, "microbatches": 4, "replicas": [2, 1]}]
    elif world == 4:
        base = [{"stages": 4, "microbatches": 4, "replicas": None}, {"stages": 2, "microbatches": 4, "replicas": None}]
    else:
        base = [{"stages": 2, "microbatches": 4, "replicas": None}]
    out = []
    for b in base:
        for name, extra in (("gpipe", {}), ("1f1b", {}), ("kfkb", {"k": 2}), ("interleaved-1f1b", {"chunks": 2}),
                            ("zb-h1", {}), ("list", {})):  # fmt: skip
            out.append({"name": name, **b, **extra})
    return out


def _config(case: dict[str, object], save_dir: str) -> object:
    from pipeplan.runtime.execution.job import ScheduleLayout
    from pipeplan.runtime.training.train_config import TrainConfig

    stages, m = int(case["stages"]), int(case["microbatches"])
    replicas = tuple(case["replicas"]) if case["replicas"] else None
    common = {"module_options": MODULE_OPTIONS, "dataset": "sample", "dtype": "float64", "steps": 1, "lr": 0.0,
              "optimizer": "sgd", "seed": 3, "timeout_s": 60.0, "save_grads": save_dir}  # fmt: skip
    name = str(case["name"])
    if name == "list":
        import tempfile

        from pipeplan.io.schedule_io import write_schedule_json

        path = Path(tempfile.mkdtemp()) / "hand.json"
        write_schedule_json(hand_made_order(stages, m), path)
        name = str(path)
    layout = ScheduleLayout(name, stages, m, m * GLOBAL_BATCH_PER_MB * _copies(case), int(case.get("k", 1)),
                            int(case.get("chunks", 1)), replicas)  # fmt: skip
    return TrainConfig(layout=layout, **common)


def _copies(case: dict[str, object]) -> int:
    import os

    world = int(os.environ.get("WORLD_SIZE", "1"))
    per_pipeline = sum(case["replicas"]) if case["replicas"] else int(case["stages"])
    return world // per_pipeline


def worker(cases_json: str, out_dir: str) -> None:
    """Run every case once (one iteration each) and save each process's gradients under out_dir/<case index>."""
    import torch.distributed as dist

    from pipeplan.runtime.training.worker import train

    torch.set_num_threads(1)
    for i, case in enumerate(json.loads(cases_json)):
        train(_config(case, str(Path(out_dir) / str(i))))
    dist.barrier()
    dist.destroy_process_group()


def reference_grads(case: dict[str, object], world: int) -> dict[str, torch.Tensor]:
    """Gradients of the unpipelined model on the same global batch (mean loss), keyed like the runtime saves them."""
    from pipeplan.models.build import build_model
    from pipeplan.models.zoo.datasets import batch_indices

    model = build_model("mlp", dict(MODULE_OPTIONS), "sample", "float64", seed=3)
    per_pipeline = sum(case["replicas"]) if case["replicas"] else int(case["stages"])
    global_batch = int(case["microbatches"]) * GLOBAL_BATCH_PER_MB * (world // per_pipeline)
    idx = batch_indices(len(model.dataset), global_batch, 0, 3)
    net = torch.nn.Sequential(*model.layers)
    model.loss_fn(net(model.dataset.inputs[idx]), model.dataset.targets[idx]).backward()
    return {f"{i}.{name}": p.grad for i, layer in enumerate(model.layers) for name, p in layer.named_parameters()}


def run_world(world: int, tmp_path: Path) -> list[dict[str, object]]:
    from pipeplan.runtime.training.launch import launch_local, run_file

    cases = cases_for(world)
    code = launch_local(world, run_file(__file__), [json.dumps(cases), str(tmp_path)], timeout_s=240)
    assert code == 0, f"workers failed with exit code {code}"
    return cases


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4, 3])
def test_gradients_equal_single_process_training_for_every_schedule(world: int, tmp_path: Path) -> None:
    """Each process's gradients after one iteration match the unpipelined model's (rtol 1e-5, atol 1e-6), every schedule."""
    cases = run_world(world, tmp_path)
    for i, case in enumerate(cases):
        expected = reference_grads(case, world)
        covered: set[str] = set()
        for rank in range(world):
            grads = torch.load(tmp_path / str(i) / f"grads-rank-{rank}.pt")
            assert grads, f"case {case}: rank {rank} saved no gradients"
            for key, grad in grads.items():
                where = f"case {case}, rank {rank}, {key}"
                torch.testing.assert_close(grad, expected[key], rtol=1e-5, atol=1e-6, msg=lambda m, w=where: f"{w}: {m}")
                covered.add(key)
        assert covered == set(expected), f"case {case}: parameters without a gradient: {sorted(set(expected) - covered)}"


if __name__ == "__main__":
    worker(sys.argv[1], sys.argv[2])
