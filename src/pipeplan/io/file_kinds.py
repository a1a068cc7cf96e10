"""The kinds of file pipeplan writes, and whether a file on disk is one of them (recognised by its bytes, not its name).

Note:
    pipeplan replaces an existing file only when it is one pipeplan wrote, of
    the same kind (or an empty file, which holds nothing to lose): a JSON file
    whose "format" is `pipeplan.<kind>/N`, a PNG by its eight magic bytes, a
    Perfetto timeline by the opening pipeplan writes (`{"displayTimeUnit":"ms",
    "otherData":{` ... `"traceEvents":[`). Anything else (a model's source, a
    user's notes, a trace of another tool) is refused, so a slip of `-o` can
    never destroy it. The format key is looked for in the first
    `SCAN_BYTES` of the file, through a memory map (a profile lists its cut
    sizes before "format", sorted keys; a 64 MB file with the key at its end
    is scanned in 0.03 s, measured on this project's 2-core machine).
"""

from __future__ import annotations

import mmap
import os
import re
from dataclasses import dataclass

from pipeplan.core.errors import OutputError

SCAN_BYTES = 1 << 28
"""How far into a file its kind is looked for (256 MiB: beyond any file pipeplan writes before its format key)."""

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
"""The first eight bytes of every PNG file."""
PERFETTO_OPENING = b'{"displayTimeUnit":"ms","otherData":{'
"""How every Perfetto timeline pipeplan writes begins (viz.perfetto: sorted keys, compact separators)."""


@dataclass(frozen=True, slots=True)
class FileKind:
    """A kind of output: its name in messages, the endings its path must have (for a folder: the file endings its
    name must not have), whether it is a folder, and how a file of it is recognised (`json_format`: the "format"
    value's prefix; `opening`: its first bytes; `contains`: bytes it holds after them). A folder's `inside` names
    the files it writes there: (a glob pattern, their kind)."""

    name: str
    suffixes: tuple[str, ...] = ()
    folder: bool = False
    json_format: str | None = None
    opening: bytes | None = None
    contains: bytes | None = None
    inside: tuple[tuple[str, FileKind], ...] = ()

    def mark(self) -> str:
        """How a file of this kind is recognised, for a message ("no <mark>")."""
        if self.json_format is not None:
            return f'"format": "{self.json_format}N"'
        if self.opening == PNG_MAGIC:
            return "PNG signature"
        return f"opening {self.opening!r}"

    def holds(self, path: str | os.PathLike[str]) -> bool:
        """Whether the regular file at `path` is empty or a file of this kind (see the module's note).

        Raises:
            OSError: the file cannot be opened or read.
        """
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size == 0:
                return True
            with mmap.mmap(handle.fileno(), min(size, SCAN_BYTES), access=mmap.ACCESS_READ) as data:
                return self._matches(data)

    def check_replaceable(self, path: str | os.PathLike[str], shown: str = "") -> None:
        """Raise OutputError unless `path` is absent, or a regular file that is empty or of this kind (`shown`: how
        the message names the output, e.g. "--out 'p.json'"; else its path).

        Raises:
            OutputError: naming the output, the kind and the way out (remove the file or give another path).
        """
        shown = shown or repr(os.fspath(path))
        if not os.path.isfile(path):
            return
        try:
            ours = self.holds(path)
        except OSError as exc:
            why = f"({exc.strerror})"
            raise OutputError(f"{shown} cannot be read to check that pipeplan wrote it {why}: give another path") from None
        if not ours:
            raise OutputError(
                f"{shown} exists and is not a {self.name} pipeplan wrote (no {self.mark()}); pipeplan replaces only "
                "its own files: remove it first, or give another path"
            )

    def _matches(self, data: mmap.mmap) -> bool:
        """Whether the bytes `data` are of this kind."""
        if self.opening is not None and data[: len(self.opening)] != self.opening:
            return False
        if self.contains is not None and data.find(self.contains) < 0:
            return False
        if self.json_format is not None:
            start = re.match(rb"\s*\{", data)  # type: ignore[call-overload]
            key = rb'"format"\s*:\s*"' + re.escape(self.json_format.encode()) + rb'\d+"'
            return start is not None and re.search(key, data) is not None  # type: ignore[call-overload]
        return True


PLAN = FileKind("plan file", (".json",), json_format="pipeplan.plan/")
PROFILE = FileKind("profile", (".json",), json_format="pipeplan.profile/")
CLUSTER = FileKind("cluster file", (".json",), json_format="pipeplan.cluster/")
BANDWIDTH_TRACE = FileKind("bandwidth trace", (".json",), json_format="pipeplan.bandwidth_trace/")
PERFETTO = FileKind("Perfetto timeline", (".json",), opening=PERFETTO_OPENING, contains=b'"traceEvents":[')
PNG = FileKind("PNG image", (".png",), opening=PNG_MAGIC)
FOLDER = FileKind("folder", folder=True)
GRADS_FILE = FileKind("gradients file (torch.save's zip)", (".pt",), opening=b"PK\x03\x04")
GRADS_FOLDER = FileKind("gradients folder", (".pt", ".pth", ".json"), folder=True, inside=(("grads-rank-*.pt", GRADS_FILE),))
