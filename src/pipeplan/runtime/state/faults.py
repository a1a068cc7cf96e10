"""Injected faults, to test that a failing rank brings the whole job down with a clear message, never a hang.

`PIPEPLAN_FAULT=RANK:STEP:ACTION:MODE` (e.g. `1:3:1F2:kill`) makes process
RANK, at iteration STEP, just before action ACTION, do MODE: `raise` (an
exception), `exit` (exit code 13 without cleanup), `kill` (SIGKILL itself,
as the OOM killer would) or `hang` (sleep forever).

`PIPEPLAN_OVERFLOW=RANK:STEP` makes process RANK find an fp16 overflow in its gradients at iteration STEP (as a
too large loss scale would): the whole job must skip that step and halve the scale (runtime.execution.loss_scale).
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

from pipeplan.core.schedule import Action
from pipeplan.runtime.rank_errors import TrainConfigError

FAULT_ENV = "PIPEPLAN_FAULT"
OVERFLOW_ENV = "PIPEPLAN_OVERFLOW"
MODES = ("raise", "exit", "kill", "hang")


class InjectedFault(RuntimeError):
    """The exception a `raise` fault throws."""


@dataclass(frozen=True, slots=True)
class FaultInjector:
    """At most one fault: (process, step, action, mode); None fields never fire."""

    process: int | None = None
    step: int | None = None
    action: Action | None = None
    mode: str = "raise"

    @classmethod
    def parse(cls, text: str) -> FaultInjector:
        """Parse `RANK:STEP:ACTION:MODE`.

        Raises:
            TrainConfigError: naming the variable and the bad value.
        """
        parts = text.split(":")
        if len(parts) != 4 or parts[3] not in MODES or not parts[0].isdigit() or not parts[1].isdigit():
            raise TrainConfigError(f"{FAULT_ENV} must be RANK:STEP:ACTION:MODE with MODE in {', '.join(MODES)}, got {text!r}")
        return cls(int(parts[0]), int(parts[1]), Action.parse(parts[2]), parts[3])

    @classmethod
    def from_env(cls) -> FaultInjector:
        """The fault named by $PIPEPLAN_FAULT, or one that never fires."""
        text = os.environ.get(FAULT_ENV, "")
        return cls.parse(text) if text else cls()

    def check(self, process: int, step: int, action: Action) -> None:
        """Fire the fault if (process, step, action) is the one it names."""
        if self.action is None or (process, step, action) != (self.process, self.step, self.action):
            return
        if self.mode == "raise":
            raise InjectedFault(f"injected fault at rank {process}, step {step}, action {action}")
        if self.mode == "exit":
            os._exit(13)
        if self.mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        while True:
            time.sleep(3600)


def overflow_at(process: int, step: int) -> bool:
    """True when $PIPEPLAN_OVERFLOW names this process and iteration.

    Raises:
        TrainConfigError: naming the variable and its value when it is not RANK:STEP.
    """
    text = os.environ.get(OVERFLOW_ENV, "")
    if not text:
        return False
    parts = text.split(":")
    if len(parts) != 2 or not all(part.isdigit() for part in parts):
        raise TrainConfigError(f"{OVERFLOW_ENV} must be RANK:STEP, got {text!r}")
    return (int(parts[0]), int(parts[1])) == (process, step)
