"""The numbers a model trains in: its parameters' dtype and the precision its forward and backward compute in.

Two settings, one idea each:
- dtype (`--dtype`): the dtype of the parameters, their gradients and the optimizer's state, the master weights
  (float32 or float64);
- precision (`--precision`): what the layers compute in. `full` computes in the dtype; `bf16` and `fp16` run the
  forward under torch.autocast in that 16-bit type over float32 master weights (`fp16` with dynamic loss scaling).

A profile records both (its source's dtype and precision; a profile without them was measured in float32, full),
and a step is predicted only from a profile measured in the run's own numbers: times and bytes of another dtype or
precision are not this run's (float64 on a CPU runs ~10x slower than float32 here), so a prediction across them is
refused, naming both and the way out, never made silently off.

Note:
    Static memory follows from the master weights alone: a device holds, per parameter byte of the dtype, the
    weight, its gradient and the optimizer's state (`sim.cost.layers.static_bytes`); under bf16/fp16 the weights,
    gradients and state stay float32, so a parameter costs what it costs in float32 and float64 doubles it. The
    16-bit copies autocast makes of the weights are saved for the backward of each microbatch in flight, and are
    counted with the saved activations (as the profiler and the runtime's memory meter both measure them).
"""

from __future__ import annotations

from pipeplan.core.errors import PipeplanError, ProfileError

DTYPES = ("float32", "float64")
"""The dtypes of the master weights a run trains (`--dtype`)."""
PRECISIONS = ("full", "bf16", "fp16")
"""What the layers compute in (`--precision`): the dtype itself, or bfloat16 / float16 autocast over float32."""
MIXED = ("bf16", "fp16")
"""The precisions that autocast over float32 master weights."""
DEFAULT_NUMERICS = ("float32", "full")
"""What a profile that records no dtype or precision was measured in."""
"""Bytes of one master weight (and of its gradient, and of each optimizer state tensor's element)."""
PROFILE_DTYPES = ("fp32", "bf16", "float32", "float64")
"""What `profile --dtype` takes: fp32 (= float32) and float64 measured, fp32 projected too; bf16 (a bfloat16 model)
projected only. Mixed precision is its `--precision`, measured only."""
MEASURED_DTYPES = {"fp32": "float32", "float32": "float32", "float64": "float64"}
"""The dtype each measurable `profile --dtype` builds the model in (the name its profile records)."""


def check_numerics(dtype: str, precision: str, error: type[PipeplanError], names: tuple[str, str] = ("--dtype",
                   "--precision")) -> None:  # fmt: skip
    """Raise `error` naming the option (`names`: the dtype's and the precision's) whose value no run trains with.

    Raises:
        error: an unknown dtype or precision, or a 16-bit precision over float64 master weights.
    """
    if dtype not in DTYPES:
        raise error(f"{names[0]} must be {' or '.join(DTYPES)}, got {dtype!r}")
    if precision not in PRECISIONS:
        raise error(f"{names[1]} must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if precision in MIXED and dtype != "float32":
        raise error(
            f"{names[1]} {precision} computes over float32 master weights, got {names[0]} {dtype}: give {names[0]} "
            f"float32, or {names[1]} full to compute in {dtype}"
        )


def numerics_label(dtype: str, precision: str) -> str:
    """`float32`, `float64`, `bf16 autocast over float32`, ...: how messages name a run's numbers."""
    return dtype if precision == "full" else f"{precision} autocast over {dtype}"


def numerics_options(dtype: str, precision: str) -> str:
    """The options that give these numbers (`--dtype float64`, `--precision bf16`), as profile and train name them."""
    if precision == "full":
        return f"--dtype {dtype}"
    return f"--precision {precision}" if dtype == "float32" else f"--dtype {dtype} --precision {precision}"


def prediction_mismatch(profile: str, measured: tuple[str, str], run: tuple[str, str]) -> str | None:
    """The one-line refusal of predicting a run in `run` numbers (dtype, precision) from a profile measured in
    `measured` numbers (`profile` names it as the user gave it); None when they agree."""
    if tuple(measured) == tuple(run):
        return None
    return (
        f"profile {profile} was measured in {numerics_label(*measured)}, but this run trains in "
        f"{numerics_label(*run)}: its times and bytes are another run's; profile the model again with "
        f"{numerics_options(*run)} and predict with that profile, or train with {numerics_options(*measured)}"
    )


LEGACY_DTYPES = {"fp32": "float32"}
"""Names older projected profiles record for a dtype (`profile --project-to --dtype fp32`)."""


def source_numerics(dtype: str | None, precision: str | None) -> tuple[str, str]:
    """(dtype, precision) of a recorded source: DEFAULT_NUMERICS where it records none; older names read as today's."""
    dtype = DEFAULT_NUMERICS[0] if dtype is None else LEGACY_DTYPES.get(dtype, dtype)
    return dtype, DEFAULT_NUMERICS[1] if precision is None else precision


def check_profile_numerics(dtype: str, precision: str, projected: bool, names: tuple[str, str] = ("dtype",
                           "precision"), project: str = "project_to") -> None:  # fmt: skip
    """Raise ProfileError naming the argument (`names`) whose value a profile cannot be measured (or projected) in.

    Raises:
        ProfileError: an unknown dtype or precision, bf16 measured, float64 or a mixed precision projected, or a
            mixed precision over float64.
    """
    if dtype not in PROFILE_DTYPES:
        raise ProfileError(f"{names[0]} must be one of {', '.join(PROFILE_DTYPES)}, got {dtype!r}")
    if precision not in PRECISIONS:
        raise ProfileError(f"{names[1]} must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if dtype == "bf16" and not projected:
        raise ProfileError(
            f"{names[0]} bf16 (a bfloat16 model) is for projections only ({project}); to measure bf16 mixed "
            f"precision, give {names[1]} bf16"
        )
    if projected and (dtype == "float64" or precision != "full"):
        bad = f"{names[0]} float64" if dtype == "float64" else f"{names[1]} {precision}"
        raise ProfileError(f"{bad} is measured, not projected: leave out {project}, or project with {names[0]} fp32 or bf16")
    if not projected:
        check_numerics(MEASURED_DTYPES[dtype], precision, ProfileError, names)
