"""The user's data and loss checked once, before any process starts (`train`, `profile`, and the API's train_local
and profile_model): the flags that go together, `--eval` against data that holds nothing out, and with `--data` or
`--loss` one batch of the data run through the model and the loss (models.user_data.check_fit)."""

from __future__ import annotations

from collections.abc import Mapping

from pipeplan.core.errors import PipeplanError, TrainConfigError

DATA_SPEC = "a package.module:factory returning the samples"
LOSS_SPEC = "a package.module:function (output, target) -> scalar loss"


def check_user_data(
    module: str,
    options: Mapping[str, object],
    dataset: str,
    *,
    data: str | None = None,
    loss: str | None = None,
    eval_fraction: float = 0.0,
    evaluate: bool = False,
    dtype: str = "float32",
    seed: int = 0,
    build: bool = True,
    error: type[PipeplanError] = TrainConfigError,
) -> None:
    """Refuse, in one line naming the flag and the value, what a run of this model and data would fail on.

    Without `build` only what needs no model is checked (a torchrun rank: its worker builds the model and says the
    rest); with it, `--data`/`--loss` build the model here, as the workers will (torch), and run one batch.

    Raises:
        `error` (TrainConfigError by default): --eval-fraction out of [0, 1) or without --data, --data beside a
            --dataset, --eval for data without a held-out split, or models.user_data's refusals.
    """
    if not isinstance(eval_fraction, int | float) or isinstance(eval_fraction, bool) or not 0 <= eval_fraction < 1:
        raise error(f"--eval-fraction must be a number >= 0 and < 1 (the share of --data held out), got {eval_fraction!r}")
    if eval_fraction and data is None:
        raise error(
            f"--eval-fraction {eval_fraction} holds out part of --data; without --data, --dataset digits and pysource "
            "hold out their own split: give --data MODULE:FACTORY, or leave --eval-fraction out"
        )
    if data is not None and dataset not in ("auto", "data"):
        raise error(f"give --data or --dataset, not both (got --dataset {dataset} and --data {data})")
    if evaluate and data is None:
        from pipeplan.models.build import resolve_dataset
        from pipeplan.models.zoo.datasets import eval_without_split

        if resolve_dataset(module, dataset) == "sample":
            raise error(eval_without_split(f"--module {module}'s own samples (--dataset sample)"))
    if not build or (data is None and loss is None):
        return
    from pipeplan.models.build import build_model
    from pipeplan.models.zoo.datasets import eval_without_split

    try:
        model = build_model(module, dict(options), "auto" if data is not None else dataset, dtype, seed, data=data,
                            loss=loss, eval_fraction=eval_fraction)  # fmt: skip
    except PipeplanError as exc:
        if isinstance(exc, error) or error is TrainConfigError:
            raise
        raise error(str(exc)) from None
    if evaluate and model.dataset.test_inputs is None:
        raise error(eval_without_split(f"--data {data}"))


def user_dataset(
    dataset: str | None, data: str | None, plan: str | None, profile: str | None, recorded: str | None = None
) -> str:
    """The --dataset a run builds with: `auto` beside --data; a plan's profile measured on the user's own samples
    (`recorded`: the dataset its source records, as its reader read it, is `data`) needs --data again, as a profile
    never records the factory. `profile` names it in the message.

    Raises:
        TrainConfigError: naming the plan, its profile and --data.
    """
    from pipeplan.core.model_source import USER_DATA

    if data is None and USER_DATA in (dataset, recorded):
        raise TrainConfigError(
            f"plan {plan}'s profile {profile} was measured on your own samples (--data), which a profile does not "
            "record: give --data MODULE:FACTORY again"
        )
    return "auto" if data is not None and dataset in (None, USER_DATA) else dataset or "auto"
