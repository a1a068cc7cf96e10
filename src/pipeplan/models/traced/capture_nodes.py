"""How an exported node runs inside a captured layer (models.traced.capture): sizes read from the batch, the layer's mode.

An export with a dynamic batch expresses sizes through the batch symbol
(`s0`, `8*s0`); inside a layer `BatchExpression` evaluates one from the
batch of a batch-first input. An export also fixes the training mode into
the graph (dropout's `train`, batch norm's `training` and its step counter,
attention's `dropout_p`); `follow_mode` and `add_while_training` make those
read the layer's own `training` flag.
`quiet` silences torch while it exports (a failed export prints its partial
graph; pipeplan says one line).
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Iterator
from typing import Any

import torch
from torch import fx, nn


class BatchExpression(nn.Module):
    """A size the export expressed through the batch size (`s0`, `8*s0`): evaluated from a batch-first input."""

    def __init__(self, expression: Any, symbol: Any) -> None:
        super().__init__()
        self.expression = expression
        self.symbol = symbol

    def forward(self, batch_first: torch.Tensor) -> int:
        """The size for the batch of `batch_first`."""
        return int(self.expression.xreplace({self.symbol: batch_first.shape[0]}))


def train_only(training: bool, value: float) -> float:
    """An attention dropout probability while training, 0 in evaluation (the model's own `self.training` test)."""
    return value if training else 0.0


def follow_mode(target: object, args: list[Any] | tuple[Any, ...], kwargs: dict[str, Any], training: fx.Node) -> Any:
    """Dropout, batch norm and attention dropout made to read the layer's `training` flag (export fixed them)."""
    args = list(args)
    aten = torch.ops.aten
    if target in (aten.dropout.default, aten.feature_dropout.default, aten.alpha_dropout.default) and len(args) == 3:
        args[2] = training
    elif target is aten.batch_norm.default and len(args) >= 6:
        args[5] = training
    elif target is aten.scaled_dot_product_attention.default:
        if len(args) > 4:
            args[4] = mode_value(args[4], training)
        elif "dropout_p" in kwargs:
            kwargs["dropout_p"] = mode_value(kwargs["dropout_p"], training)
    return args, kwargs


def add_while_training(training: bool, counter: torch.Tensor, step: object) -> torch.Tensor:
    """`counter += step` while training only: a buffer counted in place from no data (batch norm's
    num_batches_tracked) counts training steps, as the module's own `if self.training` does."""
    return counter.add_(step) if training else counter


def mode_value(p: object, training: fx.Node) -> object:
    """`p` while training, 0 in evaluation (an fx node), or p itself when it is 0."""
    if isinstance(p, (int, float)) and p == 0:
        return p
    return training.graph.call_function(train_only, (training, p))


def is_size(node: fx.Node) -> bool:
    """Whether node computes a size (a SymInt), not a tensor."""
    return isinstance(node.meta.get("val"), (torch.SymInt, torch.SymFloat, torch.SymBool))


def mutates(node: fx.Node) -> bool:
    """Whether node writes one of its inputs in place (a buffer update, an in-place op)."""
    schema = getattr(node.target, "_schema", None)
    return bool(schema is not None and schema.is_mutable)


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """torch's own logging and printing silenced (a failed export prints its partial graph; pipeplan says one line)."""
    loggers = [logging.getLogger(n) for n in list(logging.root.manager.loggerDict) if n.split(".")[0] == "torch"]
    levels = [(logger, logger.level) for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    sink = io.StringIO()
    try:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            yield
    finally:
        for logger, level in levels:
            logger.setLevel(level)
