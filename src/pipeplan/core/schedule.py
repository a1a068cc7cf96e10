"""The schedule language: actions such as `2F0`, per-rank action lists, validation."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from pipeplan.core.errors import ScheduleError, ScheduleTooLargeError
from pipeplan.core.limits import ACTIONS, RANKS, Limit

OPS = ("F", "B", "I", "W", "U")
"""F forward, B full backward, I backward for input, W backward for weights, U optimizer step."""

INDEX = Limit(
    ACTIONS.value - 1, "", f"a schedule holds at most {ACTIONS.value:,.0f} actions, so no stage or microbatch number reaches it"
)
"""The largest stage or microbatch number of an action."""

_ACTION_RE = re.compile(r"^(\d{1,18})([FBIWU])(\d{1,18})$")
_LONG_NUMBER = re.compile(r"\d{19}")
_new = object.__new__
_set = object.__setattr__


@dataclass(frozen=True, slots=True)
class Action:
    """One unit of compute: stage `stage` runs `op` on microbatch `microbatch`."""

    stage: int
    op: str
    microbatch: int

    def __post_init__(self) -> None:
        if isinstance(self.stage, bool) or not isinstance(self.stage, int) or self.stage < 0:
            raise ScheduleError(f"action stage must be an integer >= 0, got {self.stage!r}")
        if self.op not in OPS:
            raise ScheduleError(f"action op must be one of {', '.join(OPS)}, got {self.op!r}")
        mb = self.microbatch
        if isinstance(mb, bool) or not isinstance(mb, int) or mb < 0:
            raise ScheduleError(f"action microbatch must be an integer >= 0, got {mb!r}")
        INDEX.check(ScheduleTooLargeError, f"action {self.stage}{self.op}{mb}: stage", self.stage)
        INDEX.check(ScheduleTooLargeError, f"action {self.stage}{self.op}{mb}: microbatch", mb)

    def __str__(self) -> str:
        return f"{self.stage}{self.op}{self.microbatch}"

    @classmethod
    def trusted(cls, stage: int, op: str, microbatch: int) -> Action:
        """An action built without the checks, for generators whose arguments are valid by construction (a
        schedule of 64 ranks x 1024 microbatches makes 131,072 of them; the checks were most of their cost)."""
        action = _new(cls)
        _set(action, "stage", stage)
        _set(action, "op", op)
        _set(action, "microbatch", microbatch)
        return action

    @classmethod
    def parse(cls, text: str) -> Action:
        """Parse the text form `{stage}{op}{microbatch}`, e.g. `2F0`.

        Raises:
            ScheduleError: the text is not an action.
        """
        match = _ACTION_RE.match(text.strip())
        if match is None and _LONG_NUMBER.search(text):
            digits = max(len(run) for run in re.findall(r"\d+", text))
            raise ScheduleTooLargeError(
                f"action {text.strip()[:30]!r}: stage or microbatch too large: {digits} digits, the limit is "
                f"{INDEX.value:,.0f}, because {INDEX.because}"
            )
        if match is None:
            raise ScheduleError(f"not an action: {text!r} (expected e.g. '2F0': stage, op in FBIWU, microbatch)")
        return cls(int(match.group(1)), match.group(2), int(match.group(3)))


@dataclass(frozen=True, slots=True)
class Schedule:
    """Compute actions per rank, in the order each rank runs them.

    `stage_to_rank[s]` is the rank that runs stage s (several stages per rank
    for interleaved schedules). `name` is the generator's name, informational.
    """

    ranks: tuple[tuple[Action, ...], ...]
    stage_to_rank: tuple[int, ...]
    name: str = ""
    _by_rank: tuple[tuple[int, ...], ...] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        if not isinstance(self.ranks, tuple) or not all(isinstance(r, tuple) for r in self.ranks):
            raise ScheduleError("schedule ranks must be a tuple of tuples of actions")
        if len(self.ranks) < 1:
            raise ScheduleError("schedule must have at least one rank, got 0")
        RANKS.check(ScheduleTooLargeError, "schedule", len(self.ranks))
        ACTIONS.check(ScheduleTooLargeError, "schedule", sum(map(len, self.ranks)))
        INDEX.check(ScheduleTooLargeError, "schedule stage_to_rank: stage", len(self.stage_to_rank) - 1)
        if len(self.stage_to_rank) < 1:
            raise ScheduleError("schedule must have at least one stage, got 0")
        for stage, rank in enumerate(self.stage_to_rank):
            if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < len(self.ranks):
                raise ScheduleError(f"stage_to_rank[{stage}] must be a rank in 0..{len(self.ranks) - 1}, got {rank!r}")
        by_rank: list[list[int]] = [[] for _ in self.ranks]
        for stage, rank in enumerate(self.stage_to_rank):
            by_rank[rank].append(stage)
        object.__setattr__(self, "_by_rank", tuple(tuple(stages) for stages in by_rank))

    @property
    def num_ranks(self) -> int:
        """Number of ranks (devices of one pipeline replica)."""
        return len(self.ranks)

    @property
    def num_stages(self) -> int:
        """Number of stages (chunks for interleaved schedules)."""
        return len(self.stage_to_rank)

    @property
    def num_microbatches(self) -> int:
        """Number of microbatches: one more than the largest microbatch index."""
        return 1 + max((a.microbatch for rank in self.ranks for a in rank), default=-1)

    @property
    def split_backward(self) -> bool:
        """True when backward is split into I and W (zero-bubble schedules)."""
        return any(a.op in "IW" for rank in self.ranks for a in rank)

    def stages_of(self, rank: int) -> tuple[int, ...]:
        """The stages placed on `rank`, in increasing order."""
        return self._by_rank[rank]

    def to_text(self) -> list[list[str]]:
        """Per-rank action lists in text form."""
        return [[str(a) for a in rank] for rank in self.ranks]

    @classmethod
    def from_text(
        cls, ranks: Iterable[Iterable[str | None]], stage_to_rank: tuple[int, ...] | None = None, name: str = ""
    ) -> Schedule:
        """Build a schedule from per-rank text actions; None or '' cells are idle and skipped.

        Without `stage_to_rank`, each stage goes to the rank whose list holds it.
        """
        parsed = tuple(tuple(Action.parse(c) for c in rank if c is not None and c.strip() != "") for rank in ranks)
        if stage_to_rank is None:
            stage_to_rank = infer_stage_to_rank(parsed)
        return cls(parsed, tuple(stage_to_rank), name)


def infer_stage_to_rank(ranks: tuple[tuple[Action, ...], ...]) -> tuple[int, ...]:
    """Map each stage to the single rank whose action list holds it.

    Raises:
        ScheduleError: a stage appears on two ranks, or a stage number is skipped.
    """
    owner: dict[int, int] = {}
    for rank, actions in enumerate(ranks):
        for pos, action in enumerate(actions):
            seen = owner.setdefault(action.stage, rank)
            if seen != rank:
                raise ScheduleError(
                    f"stage {action.stage} appears on rank {seen} and on rank {rank} (position {pos}, action {action})"
                )
    if not owner:
        raise ScheduleError("schedule has no actions")
    missing = [s for s in range(max(owner) + 1) if s not in owner]
    if missing:
        raise ScheduleError(f"stage {missing[0]} has no actions (stages must be numbered 0..{max(owner)})")
    return tuple(owner[s] for s in range(max(owner) + 1))
