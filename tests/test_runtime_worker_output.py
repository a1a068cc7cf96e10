"""The launcher's relay of its workers' stderr passes every line, and each `error:` message once, its rank aside."""

from __future__ import annotations

from pipeplan.runtime.training.worker_output import StderrRelay, error_key


def test_error_key_leaves_out_the_rank_only() -> None:
    """`error: Kind: rank N: msg` and `error: rank N: msg` compare without `rank N: `; other lines have no key."""
    assert error_key("error: TrainConfigError: rank 3: bad --steps\n") == "error: TrainConfigError: bad --steps"
    assert error_key("error: rank 1: a peer ended") == "error: a peer ended"
    assert error_key("error: PlanError: stage 0 on rank 2 does not fit") == "error: PlanError: stage 0 on rank 2 does not fit"
    assert error_key("step 1/10 loss 0.5") is None
    assert error_key("note: error: not at the start") is None


def test_the_relay_passes_each_error_once_and_every_other_line() -> None:
    """The same error from ranks 0, 1 and 2 passes once; a different error, notes and repeated notes all pass."""
    relay = StderrRelay()
    lines = [
        "error: TrainConfigError: rank 1: --lr must be > 0, got -1",
        "note: resuming",
        "error: TrainConfigError: rank 0: --lr must be > 0, got -1",
        "note: resuming",
        "error: RuntimeFault: rank 0: the peer of rank 1 died",
        "error: TrainConfigError: rank 2: --lr must be > 0, got -1",
    ]
    assert [line for line in lines if relay.passes(line)] == [lines[0], lines[1], lines[3], lines[4]]
