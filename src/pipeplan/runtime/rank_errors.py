"""Errors of the runtime: a failed rank reports the rank, the step and the action it was running."""

from pipeplan.core.errors import PipeplanError, TrainConfigError


class RuntimeFault(PipeplanError, RuntimeError):
    """Training on one process failed: a peer died, a wait timed out, or an action raised."""


__all__ = ["RuntimeFault", "TrainConfigError"]
