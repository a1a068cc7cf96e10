"""Interleaved 1F1B (Megatron-LM; Narayanan et al., 2021): v model chunks per rank."""

from pipeplan.core.errors import ScheduleError
from pipeplan.core.schedule import Action, Schedule
from pipeplan.schedules.sizes import check_sizes


def _chunk_action(rank: int, ranks: int, chunks: int, virtual: int, op: str) -> Action:
    """The action a rank runs at its `virtual`-th forward (op F) or backward (op B).

    Microbatches go through the chunks in groups of p: forwards visit chunk 0
    for microbatches 0..p-1, then chunk 1 for the same group, and so on;
    backwards visit the chunks in reverse order.
    """
    group, offset = divmod(virtual, ranks * chunks)
    chunk = offset // ranks
    if op == "B":
        chunk = chunks - 1 - chunk
    microbatch = group * ranks + virtual % ranks
    return Action.trusted(chunk * ranks + rank, op, microbatch)


def interleaved_warmup(rank: int, ranks: int, microbatches: int, chunks: int) -> int:
    """Forwards rank `rank` runs before its first backward-bearing step (Megatron's num_warmup_microbatches).

    (v-1)·p + 2(p-1-r), capped at m·v. With v = 1 it is p-1-r, the plain 1F1B
    warm-up (Megatron falls back to the non-interleaved schedule there).
    """
    if chunks == 1:
        return min(ranks - 1 - rank, microbatches)
    return min((chunks - 1) * ranks + 2 * (ranks - 1 - rank), microbatches * chunks)


def interleaved_one_f_one_b(stages: int, microbatches: int, chunks: int = 2) -> Schedule:
    """Each of p ranks holds v chunks; chunk-stage s = c·p + r runs on rank r = s mod p.

    Args:
        stages: pipeline ranks p.
        microbatches: microbatches m per iteration, a multiple of p.
        chunks: model chunks v per rank (p·v chunk-stages in all).

    Returns:
        A schedule of p·v stages on p ranks. With uniform chunk costs f/v,
        b/v and no transfer time its iteration time is (m + (p-1)/v)(f+b).

    Raises:
        ScheduleError: p, m or v below 1, or m not a multiple of p.

    Note:
        Megatron-LM's order: rank r runs W_r = min((v-1)p + 2(p-1-r), m·v)
        forwards, then m·v - W_r steps of (next forward, next backward), then
        the remaining W_r backwards. The k-th forward on a rank is chunk
        (k // p) mod v of microbatch (k // (p·v))·p + k mod p; backwards walk
        the chunks from last to first.
    """
    check_sizes(stages=stages, microbatches=microbatches, chunks=chunks)
    if microbatches % stages != 0:
        raise ScheduleError(f"interleaved-1f1b needs microbatches (m) a multiple of stages (p), got m={microbatches}, p={stages}")
    total = microbatches * chunks
    ranks = []
    for rank in range(stages):
        warmup = interleaved_warmup(rank, stages, microbatches, chunks)
        # phase 1: warm-up forwards.
        order = [_chunk_action(rank, stages, chunks, k, "F") for k in range(warmup)]
        # phase 2: steady state — one forward, then one backward.
        for k in range(total - warmup):
            order.append(_chunk_action(rank, stages, chunks, k + warmup, "F"))
            order.append(_chunk_action(rank, stages, chunks, k, "B"))
        # phase 3: cool-down — the remaining backwards.
        order.extend(_chunk_action(rank, stages, chunks, k, "B") for k in range(total - warmup, total))
        ranks.append(tuple(order))
    stage_to_rank = tuple(stage % stages for stage in range(stages * chunks))
    return Schedule(tuple(ranks), stage_to_rank, "interleaved-1f1b")
