"""Query results waiting for the ``DoGet`` that fetches them.

A Flight SQL query runs at ``GetFlightInfo`` (whose answer carries the result's schema and
row count) and is fetched by a later ``DoGet`` naming the ticket that answer gave. Between
the two the Arrow table is held here under a random 16-byte handle:

- good once: :meth:`PendingResults.take` removes it;
- for its owner only: the principal that ran the statement (another principal's ``DoGet``
  with the same ticket finds nothing, as for a handle never given);
- for ``seconds`` at most (default :data:`TICKET_SECONDS`);
- at most ``max_count`` results and ``max_bytes`` bytes held at once: keeping a new one
  pushes out the oldest until both hold (the new one stays even when alone over
  ``max_bytes``: its size was bounded by the SQL limits when it was computed).

So a client that runs statements and never fetches them cannot make the node hold more
than the bounds.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa

__all__ = ["MAX_PENDING", "TICKET_SECONDS", "PendingResults"]

TICKET_SECONDS = 60.0
MAX_PENDING = 64


@dataclass(frozen=True, slots=True)
class _Pending:
    table: pa.Table
    owner: str | None
    expires: float


class PendingResults:
    """Results held between ``GetFlightInfo`` and ``DoGet`` (see the module docstring).
    Thread-safe."""

    def __init__(
        self,
        max_bytes: int,
        *,
        max_count: int = MAX_PENDING,
        seconds: float = TICKET_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_bytes = max_bytes
        self.max_count = max_count
        self.seconds = seconds
        self._clock = clock
        self._lock = threading.Lock()  # guards _held, _bytes
        self._held: OrderedDict[bytes, _Pending] = OrderedDict()
        self._bytes = 0

    def keep(self, table: pa.Table, owner: str | None) -> bytes:
        """Hold ``table`` for ``owner``; returns its handle."""
        handle = os.urandom(16)
        now = self._clock()
        with self._lock:
            while self._held and (
                len(self._held) >= self.max_count
                or self._bytes + table.nbytes > self.max_bytes
                or next(iter(self._held.values())).expires < now
            ):
                _, gone = self._held.popitem(last=False)
                self._bytes -= gone.table.nbytes
            self._held[handle] = _Pending(table, owner, now + self.seconds)
            self._bytes += table.nbytes
        return handle

    def take(self, handle: bytes, owner: str | None) -> pa.Table | None:
        """The table held under ``handle`` for ``owner``, removed; None when there is none
        (fetched already, expired, pushed out, another owner's, or never given)."""
        with self._lock:
            found = self._held.get(handle)
            if found is None or found.owner != owner:
                return None
            del self._held[handle]
            self._bytes -= found.table.nbytes
        return found.table if found.expires >= self._clock() else None

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)

    def clear(self) -> None:
        with self._lock:
            self._held.clear()
            self._bytes = 0
