"""Point-to-point activations and gradients: posted early, awaited right before use, shapes sent once.

Note:
    Every process knows the whole schedule, so a receiver knows the exact
    order in which each peer sends to it (`Topology.send_order`). Receives
    are posted in that order and tagged with the message's index in it, so
    matching is exact under gloo (tags) and under NCCL (order). The first
    message of a channel (kind, boundary, sender, receiver) is preceded by
    a small shape message; later messages reuse the shape.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from pipeplan.core.schedule import Action
from pipeplan.runtime.errors import RuntimeFault
from pipeplan.runtime.topology import Message, Role, Topology

SHAPE_TAG = 1 << 20
"""Shape messages use tag SHAPE_TAG + the payload's index, apart from payload tags."""

_MAX_DIMS = 8
_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.bool, torch.uint8)


@dataclass
class _Recv:
    message: Message
    buffer: torch.Tensor | None
    work: object | None
    posted_s: float


@dataclass(frozen=True, slots=True)
class TransferRecord:
    """When a message was sent (sender clock) or arrived (receiver clock); seconds from perf_counter."""

    message: Message
    at_s: float
    sent: bool


def _encode_shape(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.dim() > _MAX_DIMS:
        raise RuntimeFault(f"cannot send a tensor with {tensor.dim()} dimensions (at most {_MAX_DIMS})")
    header = [_DTYPES.index(tensor.dtype), tensor.dim(), *tensor.shape] + [0] * (_MAX_DIMS - tensor.dim())
    return torch.tensor(header, dtype=torch.int64)


def _decode_shape(header: torch.Tensor) -> tuple[torch.dtype, tuple[int, ...]]:
    values = header.tolist()
    return _DTYPES[values[0]], tuple(values[2 : 2 + values[1]])


class Comm:
    """The messages of one process: posts receives ahead, sends after compute, waits with a timeout."""

    def __init__(self, topology: Topology, role: Role, device: torch.device, timeout_s: float, record: bool = False) -> None:
        self.topology = topology
        self.role = role
        self.device = device
        self.timeout = timedelta(seconds=timeout_s)
        self.record = record
        me = role.process
        self._order = {q: topology.send_order(q, me) for q in topology.peers(me) if q != me}
        self._index = {(m.kind, m.boundary, m.microbatch, q): i for q, msgs in self._order.items() for i, m in enumerate(msgs)}
        self._out_index: dict[tuple[str, int, int, int], int] = {}
        for q in range(topology.world_size):
            if q != me:
                for i, m in enumerate(topology.send_order(me, q)):
                    self._out_index[(m.kind, m.boundary, m.microbatch, q)] = i
        self._shapes: dict[tuple[str, int, int, int], tuple[torch.dtype, tuple[int, ...]]] = {}
        self._shape_sent: set[tuple[str, int, int, int]] = set()
        self.records: list[TransferRecord] = []
        self._begin()

    def _begin(self) -> None:
        self._cursor = dict.fromkeys(self._order, 0)
        self._pending_shape: dict[int, tuple[torch.Tensor, object]] = {}
        self._recvs: dict[tuple[str, int, int, int], _Recv] = {}
        self._local: dict[tuple[str, int, int, int], torch.Tensor] = {}
        self._sends: list[tuple[object, torch.Tensor, Message]] = []

    def begin_step(self) -> None:
        """Forget the previous iteration's bookkeeping (shapes are kept)."""
        self._begin()
        self.records = []

    # ---- receiving -------------------------------------------------------------------------------------------
    def prefetch(self, actions: list[Action]) -> None:
        """Post the receives `actions` need (and those the peers send before them), without blocking."""
        self._prune_sends()
        for action in actions:
            for m in self.topology.recvs(self.role, action):
                if m.src != self.role.process:
                    self._advance(m.src, self._index[(m.kind, m.boundary, m.microbatch, m.src)], block=False, action=action)

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
            buffer = torch.empty(shape, dtype=dtype, device=self.device)
            work = dist.irecv(buffer, src=peer, tag=i)
            self._recvs[(m.kind, m.boundary, m.microbatch, peer)] = _Recv(m, buffer, work, time.perf_counter())
            self._cursor[peer] = i + 1

    def receive(self, action: Action) -> torch.Tensor | None:
        """The tensor `action` consumes from other stages (pieces concatenated), waiting for it if needed."""
        needed = self.topology.recvs(self.role, action)
        if not needed:
            return None
        pieces = []
        for m in needed:
            key = (m.kind, m.boundary, m.microbatch, m.src)
            if m.src == self.role.process:
                pieces.append(self._local.pop(key))
                continue
            if key not in self._recvs:
                self._advance(m.src, self._index[key], block=True, action=action)
            recv = self._recvs.pop(key)
            self._wait(recv.work, action, m.describe())
            if self.record:
                self.records.append(TransferRecord(m, time.perf_counter(), sent=False))
            pieces.append(recv.buffer)
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces)

    # ---- sending ---------------------------------------------------------------------------------------------
    def send(self, action: Action, tensor: torch.Tensor | None) -> None:
        """Post the sends of `action`'s output (activation or input gradient) to the next or previous stage."""
        messages = self.topology.sends(self.role, action)
        if not messages:
            return
        if tensor is None:
            raise RuntimeFault(f"action {action} produced no tensor to send")
        tensor = tensor.detach()
        now = time.perf_counter()
        for m in messages:
            piece = tensor[m.src_lo : m.src_hi]
            if m.dst == self.role.process:
                self._local[(m.kind, m.boundary, m.microbatch, m.src)] = piece
                continue
            piece = piece.contiguous()
            index = self._out_index[(m.kind, m.boundary, m.microbatch, m.dst)]
            if m.channel not in self._shape_sent:
                header = _encode_shape(piece)
                self._sends.append((dist.isend(header, dst=m.dst, tag=SHAPE_TAG + index), header, m))
                self._shape_sent.add(m.channel)
            self._sends.append((dist.isend(piece, dst=m.dst, tag=index), piece, m))
            if self.record:
                self.records.append(TransferRecord(m, now, sent=True))

    def _prune_sends(self) -> None:
        if len(self._sends) > 8:
            self._sends = [s for s in self._sends if not s[0].is_completed()]

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
