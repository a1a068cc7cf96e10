"""Training data: a dataset that a package ships (no downloads), and a seeded, resumable sample order."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from pipeplan.core.errors import TrainConfigError

DATASETS = ("digits", "pysource", "sample")
"""digits: scikit-learn's 8x8 handwritten digits (1797 samples, 10 classes; every fifth held out); pysource: the
next character of the Python standard library's sources (models.zoo.text; every tenth file held out); sample: the
MODULE_SPEC's own samples (no held-out split)."""


@dataclass(frozen=True)
class Dataset:
    """Training inputs and targets, row i one sample; `classes` is set for classification data; the held-out
    split (`test_inputs`, `test_targets`) is None for data without one."""

    name: str
    inputs: torch.Tensor
    targets: torch.Tensor
    classes: int | None = None
    test_inputs: torch.Tensor | None = None
    test_targets: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if len(self.inputs) != len(self.targets) or len(self.inputs) == 0:
            raise TrainConfigError(
                f"dataset {self.name!r} needs as many targets as inputs (>0), got {len(self.inputs)} and {len(self.targets)}"
            )

    def __len__(self) -> int:
        return len(self.inputs)

    @property
    def features(self) -> int:
        """Width of one input row."""
        return int(self.inputs.shape[1])


def digits() -> Dataset:
    """scikit-learn's digits: 64 pixel intensities scaled to [0, 1], labels 0..9.

    Raises:
        TrainConfigError: scikit-learn is not installed.
    """
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise TrainConfigError("--dataset digits needs scikit-learn: pip install scikit-learn") from None
    bunch = load_digits()
    cpu = torch.device("cpu")  # data, even when the model is built under `with torch.device("meta")` (projection)
    inputs = torch.as_tensor(bunch.data, dtype=torch.float32, device=cpu) / 16.0
    targets = torch.as_tensor(bunch.target, dtype=torch.int64, device=cpu)
    held = torch.arange(len(inputs), device=cpu) % 5 == 4  # every fifth sample: 359 held out, 1438 to train on
    return Dataset("digits", inputs[~held], targets[~held], 10, inputs[held], targets[held])


def pysource(seq_len: int) -> Dataset:
    """Next-character prediction on the Python standard library's sources, windows of `seq_len` (models.zoo.text)."""
    from pipeplan.models.zoo.text import VOCAB, python_corpus

    (inputs, targets), (test_inputs, test_targets) = python_corpus(seq_len)
    return Dataset("pysource", inputs, targets, VOCAB, test_inputs, test_targets)


def sample_dataset(
    sample_input: Callable[[int], torch.Tensor], sample_target: Callable[[int], torch.Tensor] | None, size: int
) -> Dataset:
    """`size` samples made by a MODULE_SPEC's own sample functions (deterministic).

    Raises:
        TrainConfigError: the spec defines no targets.
    """
    if sample_target is None:
        raise TrainConfigError("--dataset sample needs a MODULE_SPEC with sample targets and a loss; use --dataset digits")
    return Dataset("sample", sample_input(size), sample_target(size))


def eval_without_split(name: str) -> str:
    """The refusal of --eval for data `name` that holds nothing out (said by the launcher, and by a rank)."""
    return (
        f"--eval needs data with a held-out split; {name} has none: use --dataset digits or pysource, or --data with "
        "--eval-fraction F, or a --data factory that returns (train, held_out)"
    )


def batch_indices(num_samples: int, global_batch: int, step: int, seed: int) -> torch.Tensor:
    """Row indices of iteration `step`: the stream of per-epoch seeded permutations, cut into global batches.

    The order depends only on (num_samples, global_batch, step, seed), so a
    resumed run reads exactly the samples an uninterrupted one would.
    """
    start = step * global_batch
    parts, need = [], global_batch
    while need:
        epoch, offset = divmod(start, num_samples)
        perm = torch.randperm(num_samples, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch))
        take = perm[offset : offset + need]
        parts.append(take)
        need -= len(take)
        start += len(take)
    return torch.cat(parts)
