"""Where a node's resident memory is, so that growth can be told apart from a leak.

A serving process holds memory in places no single counter sees: RocksDB's block cache and
memtables (bounded, reported by :func:`sparkiq.stores.rocksdb_options.rocksdb_memory`), Arrow's
memory pool (the replicas' versions), the C allocator's heap (RocksDB, DuckDB, Python
objects over 512 bytes) and Python's own small-object arenas. The C allocator keeps memory
it was given back: after a burst, the freed chunks stay in its arenas (one per thread that
allocated, up to eight per core) and the resident size keeps its peak. Reported apart,
"in use" growing past RocksDB's bounded share (its memtables are allocated there too) is a
leak, and "free, held" growing is the allocator's retention.

glibc's ``mallinfo2`` (2.33 and later) reads the allocator's own accounting; where the C
library has none (musl, macOS) those two parts are left out. Every value is read when
asked: a scrape every few seconds costs a walk over the allocator's free lists.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
from collections.abc import Callable

__all__ = ["process_memory"]


class _MallInfo2(ctypes.Structure):
    # struct mallinfo2 from <malloc.h>, every field a size_t
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",  # bytes the arenas took from the system (mmap-served chunks aside)
            "ordblks",  # free chunks
            "smblks",  # free fastbin chunks
            "hblks",  # chunks served by mmap of their own
            "hblkhd",  # bytes in those chunks
            "usmblks",  # always 0
            "fsmblks",  # bytes in free fastbin chunks
            "uordblks",  # bytes in chunks in use, in every arena
            "fordblks",  # bytes in free chunks (each arena's top included), in every arena
            "keepcost",  # free bytes at the top of the main arena, trimmable
        )
    ]


@functools.cache  # looked up on first use, not at import
def _mallinfo2() -> Callable[[], _MallInfo2] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None).mallinfo2
    except (AttributeError, OSError):  # not glibc, or a glibc before 2.33
        return None
    function.restype = _MallInfo2
    function.argtypes = []
    return function


def _resident() -> int | None:
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def process_memory() -> dict[str, int]:
    """Bytes by part: ``resident`` (the process's RSS), ``malloc_in_use`` (chunks the C
    allocator handed out and not yet freed, mmap-served ones included), ``malloc_free_held``
    (freed chunks the allocator keeps in its arenas), ``arrow`` (Arrow's memory pool, when
    pyarrow is loaded). A part that cannot be read on this platform is absent."""
    out: dict[str, int] = {}
    resident = _resident()
    if resident is not None:
        out["resident"] = resident
    mallinfo2 = _mallinfo2()
    if mallinfo2 is not None:
        info = mallinfo2()
        out["malloc_in_use"] = info.uordblks + info.hblkhd
        out["malloc_free_held"] = info.fordblks
    arrow = sys.modules.get("pyarrow")  # never imported for this: a node without Arrow data
    if arrow is not None:
        out["arrow"] = int(arrow.total_allocated_bytes())
    return out
