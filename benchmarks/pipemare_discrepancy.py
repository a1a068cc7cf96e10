"""PipeMare C5: does discrepancy correction bring a backward's weights back to its forward's?

Usage: .venv/bin/python benchmarks/pipemare_discrepancy.py [--steps 192] [--out c5.json]

One process trains a model with every gradient applied tau steps late (as a stage with delay tau sees it; the
gradient of step t is taken on the weights of step t), through the runtime's own `StageUpdater` (the optimizer
step, the velocity delta and the extrapolation w - tau * delta that `--discrepancy-decay` applies). At every step
after the first 32 it compares the weights a backward would use against those its forward used tau steps
before: naive asynchronous training uses w_t, discrepancy correction w_t - tau * delta_t. Reported: the median over
steps of |w_hat - w_(t-tau)| / |w_t - w_(t-tau)| (below 1: the correction brings the weights closer; 0: exactly
back), per optimizer, tau and D, for the digits MLP and the pysource character model of the PipeMare study.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
from pathlib import Path

import torch

from pipeplan.models.build import build_model
from pipeplan.runtime.execution.optim import make_optimizer
from pipeplan.runtime.options import AsyncSettings
from pipeplan.runtime.training.asynchronous import StageUpdater

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pipemare_staleness import delayed_training

MODELS = {
    "digits": ("mlp", {"hidden": 128, "blocks": 3}, "digits", 64),
    "pysource": ("charlm", {"layers": 2, "d_model": 64}, "pysource", 128),
}
SKIP = 32


def flat(params: list[torch.Tensor]) -> torch.Tensor:
    """All parameters as one vector (a copy)."""
    return torch.cat([p.detach().reshape(-1) for p in params]).clone()


def ratio(model_name: str, optimizer: str, lr: float, tau: int, decay: float, steps: int, seed: int = 0) -> float:
    """Median |w_hat - w_(t-tau)| / |w_t - w_(t-tau)| over steps SKIP.. of one delayed-gradient run."""
    module, options, dataset, batch = MODELS[model_name]
    torch.manual_seed(seed)
    model = build_model(module, options, dataset, seed=seed)
    params = [p for layer in model.layers for p in layer.parameters()]
    updater = StageUpdater(params, lambda ps, rate: make_optimizer(optimizer, ps, rate), lr, tau, AsyncSettings(None, decay, 0))
    history: collections.deque[torch.Tensor] = collections.deque(maxlen=tau + 1)
    ratios = []

    def compare(t: int) -> None:
        history.append(flat(params))  # the weights this step's forward uses
        if t >= SKIP and len(history) == tau + 1:
            forward_weights, now = history[0], history[-1]
            with updater.corrected(asynchronous=True):
                corrected = flat(params)
            apart = float((now - forward_weights).norm())
            if apart > 0:
                ratios.append(float((corrected - forward_weights).norm()) / apart)

    taus = [tau] * len(model.layers)  # every layer alike: all are ready together, one step applies them
    delayed_training(model, steps, batch, taus, seed, lambda _ready: updater.step(asynchronous=True), before=compare)
    return statistics.median(ratios)


def main() -> None:
    """Every model x optimizer x tau x D; a table and, with --out, JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=192, help="steps per run")
    parser.add_argument("--out", help="write the results as JSON")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    print("| model | optimizer | lr | tau | D | median |w_hat - w_fwd| / |w - w_fwd| |")
    print("|---|---|---|---|---|---|")
    for model_name in MODELS:
        for optimizer, lr in (("adam", 3e-3), ("sgd_momentum", 0.1)):
            for tau in (1, 3):
                for decay in (0.5, 0.9):
                    value = ratio(model_name, optimizer, lr, tau, decay, args.steps)
                    row = {"model": model_name, "optimizer": optimizer, "lr": lr, "tau": tau, "decay": decay}
                    rows.append(row | {"ratio": value})
                    print(f"| {model_name} | {optimizer} | {lr:g} | {tau} | {decay} | {value:.3f} |", flush=True)
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(rows, handle, indent=1)


if __name__ == "__main__":
    main()
