"""api.data_checks: the user's --data, --loss, --eval-fraction and --eval checked once before any process starts,
and data= / loss= through profile_model and train_local."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import importable
from pipeplan.api.data_checks import check_user_data, user_dataset
from pipeplan.core.errors import ProfileError, TrainConfigError

DATA = """
import torch

def pairs():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(12, 64, generator=g)
    return [(x[i], i % 10) for i in range(12)]

def split():
    rows = pairs()
    return rows[:8], rows[8:]

def ce(out, target):
    return torch.nn.functional.cross_entropy(out, target)
"""


@pytest.fixture
def user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return importable(tmp_path, monkeypatch, "cdata", DATA)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"eval_fraction": 1.0, "data": "d:f"}, "--eval-fraction must be a number >= 0 and < 1"),
        ({"eval_fraction": 0.2}, "--eval-fraction 0.2 holds out part of --data; without --data"),
        ({"data": "d:f", "dataset": "digits"}, "give --data or --dataset, not both"),
        pytest.param(
            {"evaluate": True, "dataset": "sample"},
            "--eval needs data with a held-out split; --module mlp's own samples",
            marks=pytest.mark.torch,  # the model's own samples are read with torch
        ),
    ],
)
def test_flags_that_do_not_go_together_are_refused_without_building(kwargs: dict[str, object], message: str) -> None:
    """Nothing is imported or built for these (build=False: as a torchrun rank checks)."""
    args = {"dataset": "auto", **kwargs}
    dataset = args.pop("dataset")
    with pytest.raises(TrainConfigError, match=message.replace("(", r"\(")):
        check_user_data("mlp", {}, str(dataset), build=False, **args)  # type: ignore[arg-type]


@pytest.mark.torch
def test_eval_is_fine_for_data_with_a_split() -> None:
    check_user_data("mlp", {}, "digits", evaluate=True, build=False)
    check_user_data("charlm", {}, "auto", evaluate=True, build=False)


def test_a_profile_of_your_data_needs_data_again() -> None:
    assert user_dataset("data", "d:f", "p.json", None) == "auto"
    assert user_dataset("digits", None, "p.json", None) == "digits"
    with pytest.raises(TrainConfigError, match=r"plan p.json's profile prof.json was measured on your own samples"):
        user_dataset("data", None, "p.json", "prof.json")
    with pytest.raises(TrainConfigError, match=r"plan p.json's profile prof.json was measured on your own samples"):
        user_dataset(None, None, "p.json", "prof.json", "data")  # the dataset the profile records
    assert user_dataset(None, None, "p.json", "prof.json", "digits") == "auto"


@pytest.mark.torch
def test_profile_model_measures_your_data_and_records_only_that_it_did(user: Path) -> None:
    """A batch of your samples is what is measured; the source says `data`, never the factory; a --data run of
    the plan builds the profiled layers (no digits head on mlp)."""
    pytest.importorskip("torch")
    from pipeplan import api

    profile = api.profile_model("mlp", 2, options={"in_features": 64, "hidden": 16, "blocks": 1}, data="cdata:pairs",
                                loss="cdata:ce", runs=1, warmup=0)  # fmt: skip
    assert profile.source is not None and profile.source.dataset == "data" and "cdata" not in repr(profile.source)
    with pytest.raises(ProfileError, match="a projection"):
        api.profile_model("mlp", 2, data="cdata:pairs", project_to="A100", runs=0)
    check_user_data("mlp", {"in_features": 64, "hidden": 16, "blocks": 1}, "auto", data="cdata:split",
                    loss="cdata:ce", evaluate=True)  # fmt: skip
    with pytest.raises(TrainConfigError, match="--eval needs data with a held-out split; --data cdata:pairs"):
        check_user_data("mlp", {"in_features": 64}, "auto", data="cdata:pairs", loss="cdata:ce", evaluate=True)
