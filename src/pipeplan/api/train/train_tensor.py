"""What `pipeplan train` runs of a 3D plan (tensor-parallel stages, sharded state), checked before any process
starts: from the plan and the flags (check_runnable), then on the model the workers will build (check_split_model)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipeplan.core.plan import Plan


def check_runnable(plan: Plan, path: str, flags: dict[str, object]) -> None:
    """What train runs of a plan with tensor-parallel stages or sharded state, from the plan and the flags (the
    model is checked by `check_split_model`): the runtime's limits (runtime.options.check_tensor_parallel_plan), and
    beside a tensor-parallel stage none of `flags` (flag -> value; None, False and "full" are not given) whose
    machinery reads the stages' weights whole (checkpoints, saved gradients, evaluation, re-profiling, an emulated
    network, a lower precision): the runtime does not run them with sharded weights yet.

    Raises:
        TrainConfigError: naming the plan, the stage's tp or the plan's field, or the flag, and the way out.
    """
    from pipeplan.runtime.options import check_tensor_parallel_plan
    from pipeplan.runtime.rank_errors import TrainConfigError

    check_tensor_parallel_plan(plan, TrainConfigError, f"plan {path}: ")
    tp = next(((s, st.tp) for s, st in enumerate(plan.stages) if st.tp > 1), None)
    given = next((flag for flag, value in flags.items() if value not in (None, False, "full")), None)
    if tp is not None and given is not None:
        raise TrainConfigError(
            f"plan {path}: stage {tp[0]} has tp {tp[1]}, and train runs tensor-parallel stages without {given} yet: "
            f"leave {given} out, or train a plan with tp 1"
        )


def check_split_model(plan: Plan, path: str, model: tuple[str, dict[str, str], str, str, int, str | None, str | None]) -> None:
    """The model of a plan with tensor-parallel stages against them, before any process starts: built here as the
    workers will (`model`: module, options, dataset, dtype, seed, --data, --loss), its stages checked by
    runtime.execution.tp_layers.check_tensor_parallel (blocks to split, a tp dividing their heads and hidden size,
    and a sequence-parallel stage's sequence length: on two samples of the data).

    Raises:
        TrainConfigError: naming the plan, the stage and the layer, and the way out.
    """
    if all(st.tp == 1 for st in plan.stages):
        return
    from pipeplan.core.errors import PlanError
    from pipeplan.models.build import build_model
    from pipeplan.runtime.execution.tp_layers import check_tensor_parallel
    from pipeplan.runtime.rank_errors import TrainConfigError

    module, options, dataset, dtype, seed, data, loss = model
    built = build_model(module, dict(options), dataset, dtype, seed, data=data, loss=loss)
    try:
        check_tensor_parallel(plan, built.layers, built.layer_names, built.graph, built.batch(2))
    except PlanError as exc:
        raise TrainConfigError(f"plan {path}: {exc}") from None
