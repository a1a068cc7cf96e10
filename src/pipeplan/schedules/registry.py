"""The one table of schedule facts (TABLE: generator, parameters, synchronous or not) and make_schedule."""

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from pipeplan.core.errors import ScheduleError
from pipeplan.core.limits import ACTIONS
from pipeplan.core.schedule import Schedule
from pipeplan.schedules.gpipe import gpipe
from pipeplan.schedules.interleaved import interleaved_one_f_one_b
from pipeplan.schedules.kfkb import kfkb
from pipeplan.schedules.one_f_one_b import one_f_one_b
from pipeplan.schedules.pipemare import default_minibatches, pipemare
from pipeplan.schedules.sizes import check_schedule_size, check_sizes
from pipeplan.schedules.zero_bubble import zero_bubble_h1


@dataclass(frozen=True, slots=True)
class ScheduleFacts:
    """What pipeplan knows about one schedule: how it is made and which parameters it takes.

    `generator(stages, microbatches, k, chunks)` makes it (None for `list`: an explicit order a planner makes from
    costs); `takes_k` (a group size, 1 <= k <= m), `takes_chunks` (v chunk-stages per rank); `asynchronous`: its
    stages step inside the schedule (U) without a flush, so a planner never picks it for a synchronous iteration;
    `split_backward`: B runs as I (input) and W (weights), three actions per stage and microbatch.
    """

    name: str
    generator: Callable[..., Schedule] | None
    takes_k: bool = False
    takes_chunks: bool = False
    asynchronous: bool = False
    split_backward: bool = False


TABLE: dict[str, ScheduleFacts] = {
    facts.name: facts
    for facts in (
        ScheduleFacts("gpipe", lambda stages, microbatches, k=1, chunks=1: gpipe(stages, microbatches)),
        ScheduleFacts("1f1b", lambda stages, microbatches, k=1, chunks=1: one_f_one_b(stages, microbatches)),
        ScheduleFacts("kfkb", lambda stages, microbatches, k=1, chunks=1: kfkb(stages, microbatches, k), takes_k=True),
        ScheduleFacts(
            "interleaved-1f1b",
            lambda stages, microbatches, k=1, chunks=1: interleaved_one_f_one_b(stages, microbatches, chunks),
            takes_chunks=True,
        ),
        ScheduleFacts(
            "zb-h1", lambda stages, microbatches, k=1, chunks=1: zero_bubble_h1(stages, microbatches), split_backward=True
        ),
        ScheduleFacts("list", None, takes_chunks=True),
        ScheduleFacts("pipemare", lambda stages, microbatches, k=1, chunks=1: pipemare(stages, microbatches), asynchronous=True),
    )
}
"""THE table of schedule facts; every other list of schedule names is derived from it (help texts included)."""

SCHEDULES: dict[str, Callable[..., Schedule]] = {n: f.generator for n, f in TABLE.items() if f.generator is not None}
"""name -> generator(stages, microbatches, k, chunks); every generator takes all four. `pipemare` is asynchronous:
its schedule covers default_minibatches(p, m) minibatches of m microbatches each, without a flush."""
ASYNCHRONOUS = frozenset(n for n, f in TABLE.items() if f.asynchronous)
"""Schedules whose stages step inside the schedule (U) without a flush."""
TAKES_K = frozenset(n for n, f in TABLE.items() if f.takes_k)
"""Schedules with a group size k (1 <= k <= m); every other one takes none (k stays 1)."""
TAKES_CHUNKS = frozenset(n for n, f in TABLE.items() if f.takes_chunks)
"""Schedules with chunk-stages per rank (v): interleaved-1f1b, and a `list` plan's stored order; others take none."""
PLANNABLE = tuple(n for n, f in TABLE.items() if not f.asynchronous)
"""What a plan may run (an iteration with a flush), in the table's order: the generated ones and `list`."""
GENERATED = tuple(sorted((n for n in PLANNABLE if TABLE[n].generator is not None), key=lambda n: n != "1f1b"))
"""The synchronous schedules a generator makes, 1f1b first (the plain form every variant of a plan starts from)."""


GENERATOR_NAMES = ", ".join(SCHEDULES)
"""The generators' names, for a message: 'gpipe, 1f1b, ..., pipemare'."""


def names_text(names: tuple[str, ...] | list[str], last: str = "or") -> str:
    """Schedule names for a help text or a message: 'a, b, c or d'."""
    return f"{', '.join(names[:-1])} {last} {names[-1]}" if len(names) > 1 else "".join(names)


def no_k_to_adapt(name: str) -> str | None:
    """Why --adaptive cannot run schedule `name`, or None when it can (a schedule with a k: kfkb). The one message
    plan, adapt and train give for it.

    Note:
        1F1B is kFkB with k = 1, but a run named 1f1b says its k stays 1; adaptive runs are named kfkb.
    """
    if name in TAKES_K:
        return None
    return (
        f"--adaptive chooses kfkb's k between iterations; schedule {name!r} has no k to adapt "
        "(use --schedule kfkb, or a kfkb plan; 1f1b is kfkb with --k 1)"
    )


def check_schedule_options(name: str, microbatches: int, k: int, chunks: int) -> None:
    """Refuse a k or a chunk count that schedule `name` would not use, and a kfkb group larger than m.

    Note:
        kFkB with k >= m is GPipe (Ada-Grouper): the warm-up already holds all
        m forwards. k = m is accepted (it says what runs); k > m would be
        labelled k but run as k = m, so it is refused.

    Raises:
        ScheduleError: naming k or chunks, the value and the schedule.
    """
    if k != 1 and name not in TAKES_K:
        raise ScheduleError(f"k={k} applies only to kfkb; schedule {name!r} takes no k")
    if chunks != 1 and name not in TAKES_CHUNKS:
        raise ScheduleError(f"chunks={chunks} applies only to interleaved-1f1b; schedule {name!r} takes no chunks")
    if name in TAKES_K and isinstance(k, int) and isinstance(microbatches, int) and k > microbatches >= 1:
        raise ScheduleError(
            f"kfkb with k={k} > microbatches={microbatches}: a group holds at most the m microbatches (k = m is "
            f"already gpipe); use k <= {microbatches}, or the schedule gpipe"
        )


MAX_ACTIONS = int(ACTIONS.value)
"""The most actions a generated schedule may hold (core.limits.ACTIONS): 1F1B at p=64, m=1024 has 131,072 and
simulates in a second; beyond this a request is refused at once instead of ending in a MemoryError minutes later
(measured: `simulate 1f1b -p 2 -m 1000000 --json`, 4,000,000 actions, peaks at 1.5 GB in 10 s on the 2-core machine:
about 370 bytes each)."""


def action_count(name: str, stages: int, microbatches: int, chunks: int = 1) -> int:
    """How many actions schedule `name` holds: F and B (zero-bubble: F, I and W) per stage and microbatch; pipemare
    also a U per stage and minibatch, over its minibatches."""
    facts = TABLE[name]
    if facts.asynchronous:
        return (2 * microbatches + 1) * stages * default_minibatches(stages, microbatches)
    per = 3 if facts.split_backward else 2
    return per * stages * (chunks if facts.takes_chunks else 1) * microbatches


def make_schedule(name: str, stages: int, microbatches: int, k: int = 1, chunks: int = 1) -> Schedule:
    """Generate the schedule called `name` for `stages` ranks and `microbatches` microbatches.

    `k` is used by kfkb, `chunks` (v) by interleaved-1f1b; any other schedule refuses a value other than 1.

    Raises:
        ScheduleError: unknown name, bad sizes, a k or chunks the schedule does not take, kfkb's k above m.
        ScheduleTooLargeError: more actions or ranks than core.limits allows (checked before generating).
    """
    generator = SCHEDULES.get(name)
    if generator is None:
        raise ScheduleError(f"unknown schedule {name!r}; choose one of {', '.join(SCHEDULES)}")
    check_sizes(stages=stages, microbatches=microbatches, k=k, chunks=chunks)
    check_schedule_options(name, microbatches, k, chunks)
    return _generate(name, stages, microbatches, k, chunks)


@lru_cache(maxsize=64)
def _generate(name: str, stages: int, microbatches: int, k: int, chunks: int) -> Schedule:
    """The generator's schedule, remembered: a planner asks for the same (name, p, m) for hundreds of candidates, and
    a Schedule is an immutable value. Raises ScheduleError when it would be too large (not remembered)."""
    sizes = {"stages": stages, "microbatches": microbatches} | ({"chunks": chunks} if TABLE[name].takes_chunks else {})
    check_schedule_size(name, sizes, stages, action_count(name, stages, microbatches, chunks))
    return SCHEDULES[name](stages, microbatches, k=k, chunks=chunks)


def warmup_group(name: str, microbatches: int, k: int = 1) -> int:
    """g, the schedule's warm-up group: its last stage runs g forwards before its first backward, and stage s of p
    runs min(g (p - s), m) (warmup_forwards). m under gpipe (every forward first), k under kfkb (at most m), 1 under
    1f1b and zb-h1.

    Raises:
        ScheduleError: a schedule without one warm-up group (interleaved, list, pipemare).
    """
    if name == "gpipe":
        return microbatches
    if name in TAKES_K:
        return min(k, microbatches)
    if name in ("1f1b", "zb-h1"):
        return 1
    raise ScheduleError(f"schedule {name!r} has no single warm-up group; only gpipe, 1f1b, kfkb and zb-h1 have one")


def warmup_forwards(name: str, stages: int, microbatches: int, k: int = 1) -> tuple[int, ...]:
    """Per stage s of `stages`, the forwards it runs before its first backward: min(g (stages - s), m), g the
    schedule's warmup_group (the microbatches it holds at once under gpipe, 1f1b and kfkb)."""
    g = warmup_group(name, microbatches, k)
    return tuple(min(g * (stages - s), microbatches) for s in range(stages))


def splits_backward(name: str) -> bool:
    """Whether schedule `name` runs B as I and W (zb-h1: three actions per stage and microbatch); False for a name
    the table does not hold (a request's "auto")."""
    facts = TABLE.get(name)
    return facts is not None and facts.split_backward


INTERLEAVED = frozenset(n for n, f in TABLE.items() if f.takes_chunks and f.generator is not None)
"""Generated schedules with v chunk-stages per rank (interleaved-1f1b): they need p | m, so a planner steps m by p."""
WARMUP_FAMILY = frozenset(n for n in GENERATED if not TABLE[n].takes_chunks and not TABLE[n].split_backward)
"""The kFkB family (1f1b is k = 1, gpipe k = m): g forwards of warm-up, then k forwards and k backwards in turn;
rank r holds min(k (p - r), m) activations at its peak (a closed form)."""
PLAIN = GENERATED[0]
"""The plain schedule every variant of a plan starts from (1f1b)."""
ORDERED = frozenset(n for n, f in TABLE.items() if f.generator is None)
"""Schedules that are an explicit order a planner makes from costs (list), not a generator's."""
