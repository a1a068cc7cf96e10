"""Point-to-point activations and gradients: posted early, awaited right before use, shapes sent once.

Note:
    Every process knows the whole schedule, so a receiver knows the exact
    order in which each peer sends to it (`Topology.send_order`). Receives
    are posted in that order and tagged with the message's index in it, so
    matching is exact under gloo (tags) and under NCCL (order). The first
    message of a channel (kind, boundary, sender, receiver) is preceded by
    a small shape message; later messages reuse the shape. On an emulated
    network (runtime.transport.link_emulation) each message is preceded by a stamp of
    its emulated start and arrival, and the receiver holds it until then.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from pipeplan.core.schedule import Action
from pipeplan.runtime.placement import Message, Role, Topology
from pipeplan.runtime.rank_errors import RuntimeFault
from pipeplan.runtime.transport.link_emulation import Wire

SHAPE_TAG = 1 << 20
"""Shape messages use tag SHAPE_TAG + the payload's index, apart from payload tags."""
STAMP_TAG = 1 << 21
"""Emulated-arrival stamps use tag STAMP_TAG + the payload's index."""

_MAX_DIMS = 8
_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.bool, torch.uint8)


@dataclass
class _Recv:
    message: Message
    buffer: torch.Tensor | None
    work: object | None
    posted_s: float
    stamp: tuple[torch.Tensor, object] | None = None


@dataclass(frozen=True, slots=True)
class TransferRecord:
    """When a message was sent (sender clock) or arrived (receiver clock); seconds from perf_counter.

    A received message also says how long its receiver waited for it (`wait_s`: ~0 when it had arrived before it
    was needed), when its receive was posted (`posted_s`) and, on an emulated network, its emulated start and
    arrival (ms on the trace's clock).
    """

    message: Message
    at_s: float
    sent: bool
    nbytes: int = 0
    wait_s: float = 0.0
    emulated: tuple[float, float] | None = None
    posted_s: float = 0.0


def _encode_shape(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.dim() > _MAX_DIMS:
        raise RuntimeFault(f"cannot send a tensor with {tensor.dim()} dimensions (at most {_MAX_DIMS})")
    header = [_DTYPES.index(tensor.dtype), tensor.dim(), *tensor.shape] + [0] * (_MAX_DIMS - tensor.dim())
    return torch.tensor(header, dtype=torch.int64)


def _decode_shape(header: torch.Tensor) -> tuple[torch.dtype, tuple[int, ...]]:
    values = header.tolist()
    return _DTYPES[values[0]], tuple(values[2 : 2 + values[1]])


class Comm:
    """The messages of one process: posts receives ahead, sends after compute, waits with a timeout.

    `actions` are this process's actions in order; before action i the
    receives of actions i..i+lookahead are posted (`prefetch(i)`).
    """

    def __init__(
        self,
        topology: Topology,
        role: Role,
        actions: tuple[Action, ...],
        device: torch.device,
        timeout_s: float,
        lookahead: int = 2,
        wire: Wire | None = None,
    ) -> None:
        self.role = role
        self.wire = wire
        self.device = device
        self.timeout = timedelta(seconds=timeout_s)
        self.record = False
        me = role.process
        self._order = {q: topology.send_order(q, me) for q in topology.peers(me) if q != me}
        index = {(m.kind, m.boundary, m.microbatch, q): i for q, msgs in self._order.items() for i, m in enumerate(msgs)}
        out_index: dict[tuple[str, int, int, int], int] = {}
        for q in range(topology.world_size):
            if q != me:
                for i, m in enumerate(topology.send_order(me, q)):
                    out_index[(m.kind, m.boundary, m.microbatch, q)] = i
        # per action: the messages it needs (with the peer's index) and those it sends (with their tag).
        self._needs = {a: [(m, index.get(_key(m))) for m in topology.recvs(role, a)] for a in actions}
        self._makes = {
            a: [(m, out_index.get((m.kind, m.boundary, m.microbatch, m.dst))) for m in topology.sends(role, a)] for a in actions
        }
        # per position: for each peer, the last index to have posted before running it.
        self._post_upto: list[list[tuple[int, int]]] = []
        for i in range(len(actions)):
            upto: dict[int, int] = {}
            for a in actions[i : i + 1 + lookahead]:
                for m, j in self._needs[a]:
                    if j is not None:
                        upto[m.src] = max(upto.get(m.src, -1), j)
            self._post_upto.append(sorted(upto.items()))
        self._actions = actions
        self._shapes: dict[tuple[str, int, int, int], tuple[torch.dtype, tuple[int, ...]]] = {}
        self._shape_sent: set[tuple[str, int, int, int]] = set()
        self.records: list[TransferRecord] = []
        self.receive_s = 0.0
        """Seconds spent in `receive` since the caller last set it to 0 (waiting for inputs, mostly)."""
        self._begin()

    def _begin(self) -> None:
        self._cursor = dict.fromkeys(self._order, 0)
        self._pending_shape: dict[int, tuple[torch.Tensor, object]] = {}
        self._recvs: dict[tuple[str, int, int, int], _Recv] = {}
        self._local: dict[tuple[str, int, int, int], torch.Tensor] = {}
        self._sends: list[tuple[object, torch.Tensor, Message]] = []

    def begin_step(self, record: bool = False) -> None:
        """Forget the previous iteration's bookkeeping (shapes are kept); record transfer times if asked."""
        self._begin()
        self.record = record
        self.records = []

    # ---- receiving -------------------------------------------------------------------------------------------
    def prefetch(self, position: int) -> None:
        """Post the receives that the actions from `position` on (lookahead) need, and earlier ones, without blocking."""
        if len(self._sends) > 8:
            self._sends = [s for s in self._sends if not s[0].is_completed()]
        action = self._actions[position]
        for peer, upto in self._post_upto[position]:
            if self._cursor[peer] <= upto:
                self._advance(peer, upto, block=False, action=action)

    def _advance(self, peer: int, upto: int, block: bool, action: Action) -> None:
        """Post peer's messages up to index `upto`; a message of unknown shape waits for its shape first."""
        order = self._order[peer]
        while self._cursor[peer] <= upto:
            i = self._cursor[peer]
            m = order[i]
            if m.channel not in self._shapes:
                if peer not in self._pending_shape:
                    header = torch.empty(2 + _MAX_DIMS, dtype=torch.int64)
                    self._pending_shape[peer] = (header, dist.irecv(header, src=peer, tag=SHAPE_TAG + i))
                header, work = self._pending_shape[peer]
                if not block and not work.is_completed():
                    return
                self._wait(work, action, f"the shape of {m.describe()}")
                del self._pending_shape[peer]
                self._shapes[m.channel] = _decode_shape(header)
            dtype, shape = self._shapes[m.channel]
            stamp = None
            if self.wire is not None:  # posted before the payload: the order the sender sends them in
                times = torch.empty(2, dtype=torch.float64, device=self.device)
                stamp = (times, dist.irecv(times, src=peer, tag=STAMP_TAG + i))
            buffer = torch.empty(shape, dtype=dtype, device=self.device)
            work = dist.irecv(buffer, src=peer, tag=i)
            self._recvs[_key(m)] = _Recv(m, buffer, work, time.perf_counter(), stamp)
            self._cursor[peer] = i + 1

    def receive(self, action: Action) -> torch.Tensor | None:
        """The tensor `action` consumes from other stages (pieces concatenated), waiting for it if needed."""
        needed = self._needs[action]
        if not needed:
            return None
        called = time.perf_counter()
        pieces = []
        for m, index in needed:
            key = _key(m)
            if index is None:
                pieces.append(self._local.pop(key))
                continue
            if key not in self._recvs:
                self._advance(m.src, index, block=True, action=action)
            recv = self._recvs.pop(key)
            began = time.perf_counter()
            self._wait(recv.work, action, m.describe())
            emulated = None
            if recv.stamp is not None:
                assert self.wire is not None
                self._wait(recv.stamp[1], action, f"the emulated arrival of {m.describe()}")
                start_ms, end_ms = recv.stamp[0].tolist()
                emulated = (start_ms, end_ms)
                self.wire.deliver(end_ms)
            if self.record:
                arrived = time.perf_counter()
                nbytes = recv.buffer.numel() * recv.buffer.element_size()
                self.records.append(TransferRecord(m, arrived, False, nbytes, arrived - began, emulated, recv.posted_s))
            pieces.append(recv.buffer)
            if m.kind == "grad":
                self._release(m, action)
        tensor = pieces[0] if len(pieces) == 1 else torch.cat(pieces)
        self.receive_s += time.perf_counter() - called
        return tensor

    # ---- sending ---------------------------------------------------------------------------------------------
    def send(self, action: Action, tensor: torch.Tensor | None) -> None:
        """Post the sends of `action`'s output (activation or input gradient) to the next or previous stage."""
        messages = self._makes[action]
        if not messages:
            return
        if tensor is None:
            raise RuntimeFault(f"action {action} produced no tensor to send")
        tensor = tensor.detach()
        now = time.perf_counter()
        for m, index in messages:
            piece = tensor[m.src_lo : m.src_hi]
            if index is None:
                self._local[_key(m)] = piece
                continue
            piece = piece.contiguous()
            if m.channel not in self._shape_sent:
                header = _encode_shape(piece)
                self._sends.append((dist.isend(header, dst=m.dst, tag=SHAPE_TAG + index), header, m))
                self._shape_sent.add(m.channel)
            nbytes = piece.numel() * piece.element_size()
            if self.wire is not None:
                stamp = torch.tensor(self.wire.send(m.src, m.dst, nbytes), dtype=torch.float64, device=self.device)
                self._sends.append((dist.isend(stamp, dst=m.dst, tag=STAMP_TAG + index), stamp, m))
            self._sends.append((dist.isend(piece, dst=m.dst, tag=index), piece, m))
            if self.record:
                self.records.append(TransferRecord(m, now, True, nbytes))

    def _release(self, grad: Message, action: Action) -> None:
        """Drop the sends of the activation `grad` was computed from: its receiver used it, so they are delivered.

        A gloo send reports completion only once waited on, so without this every activation sent would stay
        in memory until the end of the iteration, beyond the backward that frees it (the waits return at once).
        """
        origin = ("act", grad.boundary, grad.microbatch, grad.src)
        kept = []
        for send in self._sends:
            work, _, m = send
            if (m.kind, m.boundary, m.microbatch, m.dst) == origin:
                self._wait(work, action, f"delivery of {m.kind} of microbatch {m.microbatch} to process {m.dst}")
            else:
                kept.append(send)
        self._sends = kept

    def finish_step(self, action: Action | None) -> None:
        """Wait until every send of the iteration has been delivered."""
        for work, _, m in self._sends:
            self._wait(work, action, f"delivery of {m.kind} of microbatch {m.microbatch} to process {m.dst}")
        self._sends = []

    def _wait(self, work: object, action: Action | None, what: str) -> None:
        try:
            work.wait(self.timeout)
        except RuntimeError as exc:
            where = f"action {action}" if action is not None else "the end of the iteration"
            raise RuntimeFault(f"at {where}: waiting for {what} failed: {str(exc).splitlines()[0]}") from exc


def _key(m: Message) -> tuple[str, int, int, int]:
    """(kind, boundary, microbatch, sender): a message's identity on its receiver."""
    return (m.kind, m.boundary, m.microbatch, m.src)
