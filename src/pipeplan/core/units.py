"""Unit conversions: the one place that knows how many ms a second holds, bytes a GB or GiB, us a ms.

Inside pipeplan every time is in milliseconds, every size in bytes and every rate in bytes/s; files and flags
use GB/s (10^9 bytes/s), microseconds for latencies and GiB (2^30 bytes) for memory, and io converts at the
boundary with these functions. Each conversion is one multiplication or division by the constant below, so a
value converted here is the same float as the hand-written `x * 1000.0` it replaces.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:  # numpy only for the type: importing units (the CLI's help) loads no numpy
    import numpy as np

MS_PER_S = 1000.0
"""Milliseconds in a second."""
US_PER_S = 1e6
"""Microseconds in a second."""
US_PER_MS = 1000.0
"""Microseconds in a millisecond."""
S_PER_US = 1e-6
"""Seconds in a microsecond."""
BYTES_PER_GB = 1e9
"""Bytes in a GB (the decimal unit of bandwidth in files and flags: GB/s = 10^9 bytes/s)."""
BYTES_PER_GIB = float(2**30)
"""Bytes in a GiB (the binary unit of memory in files and flags)."""
BYTES_PER_MIB = float(2**20)
"""Bytes in a MiB."""

Number = TypeVar("Number", float, "np.ndarray")


def s_to_ms(seconds: Number) -> Number:
    """Seconds to milliseconds."""
    return seconds * MS_PER_S


def ms_to_s(ms: Number) -> Number:
    """Milliseconds to seconds."""
    return ms / MS_PER_S


def us_to_ms(us: Number) -> Number:
    """Microseconds to milliseconds."""
    return us / US_PER_MS


def ms_to_us(ms: Number) -> Number:
    """Milliseconds to microseconds (a file's latency, a timeline's timestamps)."""
    return ms * US_PER_MS


def us_to_s(us: Number) -> Number:
    """Microseconds to seconds."""
    return us * S_PER_US


def s_to_us(seconds: Number) -> Number:
    """Seconds to microseconds."""
    return seconds * US_PER_S


def wire_ms(nbytes: Number, bytes_per_s: Number) -> Number:
    """Milliseconds to move `nbytes` at `bytes_per_s`: nbytes / rate x 1000."""
    return nbytes / bytes_per_s * MS_PER_S


def ms_per_byte(bytes_per_s: Number) -> Number:
    """Milliseconds one byte takes at `bytes_per_s`."""
    return MS_PER_S / bytes_per_s


def gb_per_s_to_bytes_per_s(gb_per_s: Number) -> Number:
    """GB/s (10^9 bytes/s, files and flags) to bytes/s."""
    return gb_per_s * BYTES_PER_GB


def bytes_per_s_to_gb_per_s(bytes_per_s: Number) -> Number:
    """Bytes/s to GB/s (10^9 bytes/s)."""
    return bytes_per_s / BYTES_PER_GB


def gib_to_bytes(gib: Number) -> Number:
    """GiB (2^30 bytes) to bytes."""
    return gib * BYTES_PER_GIB


def bytes_to_gib(nbytes: Number) -> Number:
    """Bytes to GiB (2^30 bytes)."""
    return nbytes / BYTES_PER_GIB


def bytes_to_mib(nbytes: Number) -> Number:
    """Bytes to MiB (2^20 bytes)."""
    return nbytes / BYTES_PER_MIB
