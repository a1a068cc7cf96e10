"""PipeMare C4 and C6: what delayed gradients cost without a pipeline, and where in the model the cost lies.

Usage: .venv/bin/python benchmarks/pipemare_staleness.py [--only c4|c6] [--long 1024] [--out staleness.json]

One process trains a study model with the gradient of each layer's step t (taken on the weights of step t)
applied some steps later: the staleness an asynchronous pipeline stage of that delay sees, with no pipeline, no
processes and no forward/backward weight discrepancy in the way (each gradient is exact, only late).

C4: every layer delayed by the same tau (0, 1, 3), per dataset, optimizer and rate (STALE's runs).
C6: the pysource character model of the study (Adam 3e-3, cosine, batch 128, its four layers one per stage, as
`train -p 4` splits them) with per-layer delays: one layer at a time, the pipeline's [3, 2, 1, 0], and that with
PipeMare's rescheduled rates (alpha_k / tau^(p_k), K = the run), with the delayed layers' rates divided by tau for
the whole run, and with the forward run on weights predicted tau steps ahead (w + tau * the last step's change:
weight prediction, which PipeMare does not do); at the study's 256 steps and at --long steps.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from pipeplan.models.build import Model, build_model
from pipeplan.models.zoo.datasets import batch_indices
from pipeplan.runtime.execution.evaluate import held_out_scores
from pipeplan.runtime.execution.optim import RateSchedule, make_optimizer
from pipeplan.runtime.options import AsyncSettings
from pipeplan.runtime.training.asynchronous import StageUpdater

STALE = {"digits": ("mlp", {"hidden": 128, "blocks": 3}, 32, 176, "constant"),
         "pysource": ("charlm", {"layers": 2, "d_model": 64}, 128, 256, "cosine")}  # fmt: skip
"""The runs: module, options, batch, steps and base-rate schedule (pysource: the study's model, batch, steps and
schedule, benchmarks/pipemare.py PYSOURCE)."""

Hook = Callable[[int], contextlib.AbstractContextManager[None]]


def delayed_training(
    model: Model,
    steps: int,
    batch: int,
    taus: Sequence[int],
    seed: int,
    step: Callable[[list[int]], None],
    before: Callable[[int], None] | None = None,
    forward_on: Hook | None = None,
) -> None:
    """Train `model` on one process for `steps` steps of `batch` samples; layer i's gradient of step t (taken on the
    weights of step t) lands in its parameters' .grad `taus[i]` steps later, and `step(layers)` then applies those
    layers' gradients. `before(t)` runs at the start of step t; `forward_on(t)`, if given, is the context the
    forward and backward of step t run in (weight prediction shifts the weights inside it)."""
    layers = [list(layer.parameters()) for layer in model.layers]
    params = [p for group in layers for p in group]
    data = model.dataset
    pending: list[collections.deque[tuple[torch.Tensor, ...]]] = [collections.deque() for _ in layers]
    for t in range(steps):
        if before is not None:
            before(t)
        idx = batch_indices(len(data), batch, t, seed)
        with forward_on(t) if forward_on is not None else contextlib.nullcontext():
            out = data.inputs[idx]
            for layer in model.layers:
                out = layer(out)
            grads = torch.autograd.grad(model.loss_fn(out, data.targets[idx]), params)
        ready, first = [], 0
        for i, group in enumerate(layers):
            pending[i].append(grads[first : first + len(group)])
            first += len(group)
            if len(pending[i]) > taus[i]:
                for p, g in zip(group, pending[i].popleft(), strict=True):
                    p.grad = g
                ready.append(i)
        if ready:
            step(ready)


BASE, RESCHEDULED, DIVIDED, PREDICTED = (
    "alpha_k",
    "rescheduled (K = run)",
    "divided by tau",
    "alpha_k, forward on predicted weights",
)
"""C6's rate rules: the base rate; PipeMare's rescheduling (`--lr-reschedule`, K = the run); the base rate divided by
the layer's delay for the whole run; the base rate with every forward on predicted weights (`--weight-prediction`)."""


def trained(
    dataset: str, optimizer: str, lr: float, taus: Sequence[int] | int, seed: int = 0, steps: int | None = None, rule: str = BASE
) -> float:
    """Held-out accuracy after delayed-gradient training (STALE[dataset]; `steps` overrides its length). `taus`: one
    delay for every layer, or one per layer; `rule` one of C6's rate rules. Each layer steps through the runtime's
    own StageUpdater (its rates, its prediction), as a pipeline stage of that delay would."""
    module, options, batch, default_steps, schedule = STALE[dataset]
    total = steps or default_steps
    model = build_model(module, options, dataset, seed=seed)
    delays = [taus] * len(model.layers) if isinstance(taus, int) else list(taus)
    if len(delays) != len(model.layers):
        raise ValueError(f"taus has {len(delays)} delays, the model {len(model.layers)} layers")
    settings = AsyncSettings(lr_reschedule=total if rule == RESCHEDULED else None, weight_prediction=rule == PREDICTED)
    updaters = [
        StageUpdater(list(layer.parameters()), lambda params, rate: make_optimizer(optimizer, params, rate), lr, tau, settings,
                     RateSchedule(lr / max(tau, 1) if rule == DIVIDED else lr, schedule, total))
        for layer, tau in zip(model.layers, delays, strict=True)
    ]  # fmt: skip

    def step(ready: list[int]) -> None:
        for i in ready:
            updaters[i].step(asynchronous=True)

    @contextlib.contextmanager
    def ahead(_t: int) -> Iterator[None]:
        with contextlib.ExitStack() as shifts:
            for updater in updaters:
                shifts.enter_context(updater.predicted(asynchronous=True))
            yield

    delayed_training(model, total, batch, delays, seed, step, forward_on=ahead if rule == PREDICTED else None)
    return held_out_scores(model, torch.device("cpu"))[0]


def c4() -> list[dict[str, Any]]:
    """Every layer delayed alike: tau 0, 1, 3 per dataset, optimizer and rate."""
    print("C4 delayed gradients without a pipeline (seed 0; digits batch 32, 176 steps, constant rate; pysource as the")
    print("study: batch 128, 256 steps, cosine), held-out accuracy\n")
    print("| dataset | optimizer | lr | τ = 0 | τ = 1 | τ = 3 |")
    print("|---|---|---|---|---|---|")
    rows = []
    for dataset, optimizer, lr in (("digits", "sgd_momentum", 0.03), ("digits", "adam", 3e-3), ("digits", "adam", 1e-3),
                                   ("pysource", "adam", 3e-3), ("pysource", "adam", 1e-2)):  # fmt: skip
        accs = [trained(dataset, optimizer, lr, tau) for tau in (0, 1, 3)]
        rows.append({"dataset": dataset, "optimizer": optimizer, "lr": lr, "accuracy": dict(zip((0, 1, 3), accs, strict=True))})
        print(f"| {dataset} | {optimizer} | {lr:g} | {' | '.join(f'{a:.3f}' for a in accs)} |", flush=True)
    return rows


PIPELINE = (3, 2, 1, 0)
"""The study's per-stage delays (4 stages, one microbatch per minibatch), one charlm layer per stage."""


def c6(long: int) -> list[dict[str, Any]]:
    """pysource, Adam 3e-3: per-layer delays, and the pipeline's delays under each rate rule and with prediction."""
    print("\nC6 where the delay costs (pysource, charlm 2 layers x d_model 64, Adam 3e-3, cosine, batch 128, seed 0;")
    print("layers: embedding, block 1, block 2, head), held-out accuracy\n")
    print(f"| delays per layer | rates | 256 steps | {long} steps |")
    print("|---|---|---|---|")
    cases: list[tuple[tuple[int, ...], str, bool]] = [
        ((0, 0, 0, 0), BASE, True), ((3, 0, 0, 0), BASE, False), ((0, 2, 0, 0), BASE, False), ((0, 1, 0, 0), BASE, False),
        ((0, 0, 1, 0), BASE, False), (PIPELINE, BASE, True), (PIPELINE, RESCHEDULED, True), (PIPELINE, DIVIDED, False),
        (PIPELINE, PREDICTED, True),
    ]  # fmt: skip
    rows = []
    for taus, rule, also_long in cases:
        accs = []
        for steps in (256, long) if also_long else (256,):
            accs.append(trained("pysource", "adam", 3e-3, taus, steps=steps, rule=rule))
        rows.append({"taus": list(taus), "rates": rule, "accuracy": accs})
        cells = [f"{a:.3f}" for a in accs] + ["-"] * (2 - len(accs))
        print(f"| {list(taus)} | {rule} | {' | '.join(cells)} |", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("c4", "c6"), help="one of the two tables")
    parser.add_argument("--long", type=int, default=1024, help="C6's longer run, in steps")
    parser.add_argument("--out", help="write the results as JSON")
    args = parser.parse_args()
    torch.set_num_threads(1)
    out = {}
    if args.only in (None, "c4"):
        out["c4"] = c4()
    if args.only in (None, "c6"):
        out["c6"] = c6(args.long)
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(out, handle, indent=1)


if __name__ == "__main__":
    sys.exit(main())
