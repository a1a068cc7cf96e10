"""Exceptions of pipeplan: each names the bad field and value."""


class PipeplanError(Exception):
    """Base of every error pipeplan reports to a user as one line."""


class ScheduleError(PipeplanError, ValueError):
    """A schedule is malformed: a missing, duplicated or misordered action."""


class ScheduleTooLargeError(ScheduleError):
    """A schedule would hold more actions than can be generated and simulated (schedules.registry.MAX_ACTIONS)."""


class DeadlockError(PipeplanError, RuntimeError):
    """A schedule cannot finish: every unfinished rank waits on another."""


class ProfileError(PipeplanError, ValueError):
    """A model profile is malformed or unreadable."""


class ClusterError(PipeplanError, ValueError):
    """A cluster description is malformed or unreadable."""


class PlanError(PipeplanError, ValueError):
    """No plan satisfies the request, or a plan file is malformed."""


class OutputError(PipeplanError, ValueError):
    """An output file named on the command line cannot be written."""


class NoSpaceError(OutputError):
    """An output could not be written because its disk is full (ENOSPC, EDQUOT, EFBIG); nothing half-written is left.

    `path` is the output's path, for the command line to name the option that gave it.
    """

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path!r} not written: {reason}; nothing half-written was left: free some space or write elsewhere")
        self.path = path
        self.reason = reason


class CostError(PipeplanError, ValueError):
    """Costs given to the simulator are malformed (negative, NaN, wrong length)."""


class TrainConfigError(PipeplanError, ValueError):
    """Training options are inconsistent (world size, batch size, dataset, checkpoint)."""


class AdaptError(PipeplanError, ValueError):
    """The adaptive controller's inputs disagree (stage or link counts, an unknown link, no k that fits memory)."""
