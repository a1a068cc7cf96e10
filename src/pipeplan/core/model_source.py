"""Which model a profile's measurements are rebuilt from: the user chooses the code, a profile only records it.

Note:
    A profile (and a plan, which names its profile) is data that people share. Its `source` records how its model
    was built (`pipeplan profile`): shown by `pipeplan show`, and compared with the model a run is given. Running
    it would let the file choose code to import and call (`"module": "os:system"`). So a recorded source is built
    only when it is a built-in name (no code: a fixed table of factories); a `package.module:factory` is imported
    only when the user names it too (`--module` on the command line, `module=` in the API), and a recorded source
    that differs from the user's is refused, naming both.
"""

from __future__ import annotations

from pipeplan.core.errors import TrainConfigError
from pipeplan.core.precision import PRECISIONS
from pipeplan.core.profile import ProfileSource

BUILTIN_MODELS = (
    "mlp", "transformer", "gpt2-small", "gpt2-medium", "gpt2-large", "gpt2-xl", "bert-base", "bert-large", "charlm",
    "rescnn",
)  # fmt: skip
"""The built-in MODULE_SPEC names (models.zoo.builtin.BUILTIN_SPECS's keys, torch-free; tests check the two agree)."""
USER_DATA = "data"
"""The dataset a source records for a model measured on the user's own samples (`--data`): the factory is not
recorded, so the samples are never chosen by a profile; train names them again with --data."""
DATASET_NAMES = ("auto", "digits", "pysource", "sample", USER_DATA)
"""The datasets a source may record: auto, models.zoo.datasets.DATASETS and USER_DATA (tests check they agree)."""
DTYPE_NAMES = ("float32", "float64")
"""The dtypes a source may record: models.build.DTYPES's keys (tests check the two agree)."""


def model_to_build(source: ProfileSource | None, given: str | None, profile: str, flag: str) -> str | None:
    """The MODULE_SPEC to build the model of a profile with: `given` (the user's), which must be the one the profile
    recorded; without it the recorded one, when it is a built-in name. None when neither is known.

    Args:
        source: the profile's recorded source (None: not recorded).
        given: the MODULE_SPEC the user named (None: none).
        profile: the profile as the user gave it (a path or a name), for the messages.
        flag: how the user names a module here (`--module`, `module=`), for the way out.

    Raises:
        TrainConfigError: the profile records code the user did not name, another model than the user's, or a
            dataset, dtype or precision that is not one of the known names.
    """
    if source is None:
        return given
    recorded = source.module.strip()
    spec = _chosen(recorded, given, profile, flag)
    for field, value, known in (
        ("dataset", source.dataset, DATASET_NAMES),
        ("dtype", source.dtype, DTYPE_NAMES),
        ("precision", source.precision, PRECISIONS),
    ):
        if value not in known:
            raise TrainConfigError(
                f"profile {profile} records its model's {field} as {value!r}, not one of {', '.join(known)}: profile "
                "the model again (pipeplan profile)"
            )
    return spec


def _chosen(recorded: str, given: str | None, profile: str, flag: str) -> str:
    """`given` when it is `recorded`; `recorded` alone when it is a built-in (see model_to_build)."""
    if given is not None:
        if given.strip() != recorded:
            raise TrainConfigError(
                f"{_named(flag, given)} is not the model profile {profile} was measured on ({recorded!r}): give "
                f"{_named(flag, recorded)}, or profile {given} (pipeplan profile) and use that profile"
            )
        return given.strip()
    if recorded not in BUILTIN_MODELS:
        raise TrainConfigError(
            f"profile {profile} records its model as {recorded!r}, code that a profile never chooses to run: "
            f"if you trust that module, name it yourself with {_named(flag, recorded)}"
        )
    return recorded


def _named(flag: str, value: str) -> str:
    """`--module VALUE` on the command line, `module='VALUE'` in Python."""
    return f"{flag}{value!r}" if flag.endswith("=") else f"{flag} {value}"
