"""Interchange: a schedule exported by `pipeplan schedule --format csv` runs on torch.distributed.pipelining's own runtime.

The module is also the worker script: `python tests/test_runtime_torch_csv.py OUT_DIR CSV...` loads each
CSV into torch's `_PipelineScheduleRuntime` (one PipelineStage per rank) and saves the gradients.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch") if __name__ != "__main__" else __import__("torch")

pytestmark = pytest.mark.torch  # every test here needs torch (make test-fast leaves them out)

MODULE_OPTIONS = {"blocks": 4, "hidden": 6}
MICROBATCHES = 4
GLOBAL_BATCH = 8
SEED = 11


def _model() -> object:
    from pipeplan.models.build import build_model

    return build_model("mlp", dict(MODULE_OPTIONS), "sample", "float64", seed=SEED)


def _batch(model: object) -> tuple[torch.Tensor, torch.Tensor]:
    from pipeplan.models.zoo.datasets import batch_indices

    idx = batch_indices(len(model.dataset), GLOBAL_BATCH, 0, SEED)
    return model.dataset.inputs[idx], model.dataset.targets[idx]


def worker(out_dir: str, csv_paths: list[str]) -> None:
    """Run one iteration of each CSV schedule with torch's runtime; save this rank's gradients per CSV."""
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

    from pipeplan.core.partition import split_evenly

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    for path in csv_paths:
        model = _model()
        lo, hi = split_evenly(len(model.layers), world)[rank]
        module = torch.nn.Sequential(*model.layers[lo:hi])
        stage = PipelineStage(module, stage_index=rank, num_stages=world, device=torch.device("cpu"))
        schedule = _PipelineScheduleRuntime([stage], n_microbatches=MICROBATCHES, loss_fn=model.loss_fn)
        schedule._load_csv(path)
        x, y = _batch(model)
        if rank == 0:
            schedule.step(x)
        else:
            schedule.step(target=y, losses=[])
        grads = {f"{lo + int(n.partition('.')[0])}.{n.partition('.')[2]}": p.grad for n, p in module.named_parameters()}
        torch.save(grads, Path(out_dir) / f"{Path(path).stem}-rank-{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.slow
def test_exported_gpipe_and_1f1b_csv_run_on_torch_pipelining(tmp_path: Path) -> None:
    """`pipeplan schedule NAME -p 2 -m 4 --format csv` loads into torch's runtime, whose gradients match unpipelined training."""
    from pipeplan.runtime.training.launch import launch_local, run_file

    paths = []
    for name in ("gpipe", "1f1b"):
        boot = "from pipeplan.cli import main; main()"
        argv = [sys.executable, "-c", boot, "schedule", name, "-p", "2", "-m", str(MICROBATCHES), "--format", "csv"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True)
        path = tmp_path / f"{name}.csv"
        path.write_text(done.stdout)
        paths.append(str(path))
    code = launch_local(2, run_file(__file__), [str(tmp_path), *paths], timeout_s=240)
    assert code == 0
    model = _model()
    x, y = _batch(model)
    model.loss_fn(torch.nn.Sequential(*model.layers)(x), y).backward()
    expected = {f"{i}.{n}": p.grad for i, layer in enumerate(model.layers) for n, p in layer.named_parameters()}
    for name in ("gpipe", "1f1b"):
        got = {}
        for rank in range(2):
            got.update(torch.load(tmp_path / f"{name}-rank-{rank}.pt"))
        assert sorted(got) == sorted(expected)
        for key, grad in got.items():
            torch.testing.assert_close(grad, expected[key], rtol=1e-5, atol=1e-6)


if __name__ == "__main__":
    worker(sys.argv[1], sys.argv[2:])
