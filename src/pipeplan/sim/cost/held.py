"""What a rank's order of actions holds at once: the activation peak, from the order alone."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def peak_held(ops: Iterable[tuple[int, str]], saved_bytes: Sequence[float]) -> float:
    """Most bytes held at once by a rank running (stage, op) actions in this order.

    A microbatch is held on its stage from the start of its F until the end
    of its B (or W when the backward is split): a rank runs one action at a
    time, so the peak follows from the order alone, not from timing.
    """
    held = peak = 0.0
    for stage, op in ops:
        if op == "F":
            held += saved_bytes[stage]
            if held > peak:
                peak = held
        elif op in "BW":
            held -= saved_bytes[stage]
    return peak
