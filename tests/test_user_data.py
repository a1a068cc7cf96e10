"""models.user_data: a data factory's samples read into tensors (pairs, Hugging Face style dicts, a held-out pair or
fraction), a loss named by the user, and the one-batch check of both against the model."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import importable

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402
from torch.nn import functional  # noqa: E402

from pipeplan.core.errors import TrainConfigError  # noqa: E402
from pipeplan.models.build import build_model  # noqa: E402
from pipeplan.models.user_data import check_fit, input_name_of, load_data, load_loss  # noqa: E402

pytestmark = pytest.mark.torch

DATA = """
import torch
from torch.utils.data import Dataset

X = torch.arange(40.0).reshape(10, 4)
Y = torch.arange(10) % 3

class Rows(Dataset):
    def __len__(self):
        return 10
    def __getitem__(self, i):
        return X[i], int(Y[i])

def pairs():
    return [(X[i], int(Y[i])) for i in range(10)]

def torch_dataset():
    return Rows()

def split():
    rows = pairs()
    return rows[:7], rows[7:]

def hf():
    return [{"input_ids": X[i].long(), "labels": Y[i], "attention_mask": torch.ones(4)} for i in range(10)]

def hf_named():
    return [{"labels": Y[i], "pixel_values": X[i]} for i in range(10)]

def masked():
    return [{"input_ids": X[i].long(), "labels": Y[i], "attention_mask": torch.tensor([1, 1, 0, 0])} for i in range(10)]

def nothing():
    return None

def empty():
    return []

def ragged():
    return [(torch.zeros(i + 1), 0) for i in range(3)]

def triples():
    return [(X[0], 0, 1)]

def generator():
    return (p for p in pairs())

def broken():
    raise KeyError("no such file")

def drawn():
    return [(torch.randn(4), 0) for _ in range(3)]

def ce(out, target):
    return torch.nn.functional.cross_entropy(out, target)
"""


@pytest.fixture
def user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user module `udata` on the import path (its own folder, no bytecode written)."""
    return importable(tmp_path, monkeypatch, "udata", DATA)


def test_pairs_and_a_torch_dataset_stack_into_the_same_tensors(user: Path) -> None:
    """Sample i is row i: inputs stacked, int targets made tensors; a torch Dataset reads alike."""
    data = load_data("udata:pairs", None, 0)
    assert torch.equal(data.inputs, torch.arange(40.0).reshape(10, 4))
    assert torch.equal(data.targets, torch.arange(10) % 3) and data.test_inputs is None
    same = load_data("udata:torch_dataset", None, 0)
    assert torch.equal(same.inputs, data.inputs) and torch.equal(same.targets, data.targets)


def test_a_pair_of_datasets_is_train_and_held_out(user: Path) -> None:
    data = load_data("udata:split", None, 0)
    assert len(data) == 7 and data.test_inputs is not None and torch.equal(data.test_inputs[0], torch.arange(28.0, 32.0))


@pytest.mark.parametrize("fraction", [0.1, 0.3, 0.5])
def test_eval_fraction_holds_out_a_seeded_share_and_trains_on_the_rest(user: Path, fraction: float) -> None:
    """round(F n) held out, the rest trained on: together every sample once; the choice follows the seed only."""
    data = load_data("udata:pairs", None, 4, fraction)
    assert data.test_inputs is not None
    held = round(fraction * 10)
    assert (len(data.test_inputs), len(data)) == (held, 10 - held)
    rows = sorted([*data.inputs[:, 0].tolist(), *data.test_inputs[:, 0].tolist()])
    assert rows == [4.0 * i for i in range(10)]
    again = load_data("udata:pairs", None, 4, fraction)
    assert again.test_inputs is not None and torch.equal(again.test_inputs, data.test_inputs)


def test_hf_dicts_take_the_forwards_input_and_labels(user: Path) -> None:
    """The key named as the forward's first parameter is the input (else the first key but labels); an all-ones
    attention mask is what the model assumes without one."""
    data = load_data("udata:hf", "input_ids", 0)
    assert data.inputs.dtype == torch.int64 and torch.equal(data.targets, torch.arange(10) % 3)
    assert torch.equal(load_data("udata:hf_named", "input_ids", 0).inputs, torch.arange(40.0).reshape(10, 4))


def test_input_name_is_the_first_forward_parameter() -> None:
    class Embed(nn.Module):
        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
            return input_ids

    assert input_name_of([Embed()]) == "input_ids"
    assert input_name_of([nn.Linear(2, 2)]) == "input"


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        ("nothing", "--data udata:nothing returned nothing (None): return a map-style Dataset"),
        ("empty", "--data udata:empty holds no samples"),
        ("ragged", "sample 1's input is (2,) float32 but sample 0's is (1,) float32"),
        ("triples", "sample 0 is a tuple of 3: each sample must be an (input, target) pair or a dict"),
        ("generator", "returned a generator: return a map-style Dataset (len and [i])"),
        ("broken", "--data udata:broken: the factory raised KeyError: 'no such file'"),
        ("masked", "has key 'attention_mask' beside the input 'input_ids' and 'labels'"),
        ("nosuch", "--data 'udata:nosuch': module 'udata' has no attribute 'nosuch'"),
    ],
)
def test_data_that_cannot_be_read_is_one_line_naming_data(user: Path, factory: str, message: str) -> None:
    with pytest.raises(TrainConfigError) as info:
        load_data(f"udata:{factory}", "input_ids", 0)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_the_factory_draws_the_same_samples_on_every_call_and_leaves_the_rng_alone(user: Path) -> None:
    """Seeded from the run's seed inside fork_rng: every process reads the same data; the caller's state is kept."""
    state = torch.random.get_rng_state()
    first, second = load_data("udata:drawn", None, 5), load_data("udata:drawn", None, 5)
    assert torch.equal(first.inputs, second.inputs) and torch.equal(torch.random.get_rng_state(), state)


def test_check_fit_refuses_a_batch_that_does_not_fit_and_a_non_scalar_loss() -> None:
    model = nn.Sequential(nn.Linear(4, 3))
    x, y = torch.randn(4, 4), torch.tensor([0, 1, 2, 0])
    check_fit(model, functional.cross_entropy, x, y, "--data d:f")
    with pytest.raises(TrainConfigError, match=r"--data d:f: a batch of 2 \(input \(2, 5\) float32.*does not fit"):
        check_fit(model, functional.cross_entropy, torch.randn(4, 5), y, "--data d:f")
    with pytest.raises(TrainConfigError, match=r"must return a scalar floating-point tensor .*got shape \(2,\) float32"):
        check_fit(model, lambda out, t: functional.cross_entropy(out, t, reduction="none"), x, y, "--loss l:f")
    with pytest.raises(TrainConfigError, match="the loss fails on the model's output"):
        check_fit(model, lambda out, t: out @ t, x, y, "--loss l:f")


def test_check_fit_leaves_the_model_and_the_rng_as_they_were() -> None:
    """BatchNorm's running statistics, its mode and torch's generator: untouched by the check."""
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Dropout(0.5))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(4, 4)
    state = torch.random.get_rng_state()
    check_fit(model, lambda out, t: out.mean(), x, torch.zeros(4), "--data d:f")
    assert model.training and all(m.training for m in model.modules())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert torch.equal(torch.random.get_rng_state(), state)


def test_build_model_takes_the_users_data_and_loss(user: Path) -> None:
    """--data replaces the dataset (no digits head on mlp), --loss the spec's loss; both cast with the dtype."""
    model = build_model("mlp", {"in_features": 4, "hidden": 8, "blocks": 1}, "auto", "float64", data="udata:pairs",
                        loss="udata:ce", eval_fraction=0.2)  # fmt: skip
    assert model.dataset.inputs.dtype == torch.float64 and len(model.dataset) == 8
    assert model.loss_fn is load_loss("udata:ce")
    assert model.layer_names[-1] != "head"
    with pytest.raises(TrainConfigError, match="give --data or --dataset, not both"):
        build_model("mlp", {}, "digits", data="udata:pairs")
