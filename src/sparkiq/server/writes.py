"""One socket write per answer: a connection's writes of one event-loop turn sent together.

uvicorn writes an answer in two ``transport.write`` calls, its status line and headers
(``http.response.start``), then its body (``http.response.body``), and the event loop's
transport sends each at once: two ``send(2)`` system calls for every answer. On a key lookup
these two calls were over half the server's CPU time (py-spy under the closed loop of
``bench.http``), more than routing, the lookup and JSON together; ASGI has no message for a
whole answer, so the server has to join them.

:class:`CoalescingTransport` stands between uvicorn's protocol and the connection's
transport: a write with nothing held is held; the next write in the same turn is sent with
it, as one; a write left alone goes out at the start of the loop's next turn, so a streamed
answer's head or chunk waits no longer than that. The connections of one server share a
:class:`WriteFlusher`, which sends what all of them left held with one ``call_soon`` a turn
(a ``call_soon`` per answer would take back a good part of the system call saved). Closing,
or shutting down the writing side, sends what is held first, so nothing is lost or
reordered; once the connection is closing, a held write is dropped (as the transport
itself would).
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["CoalescingTransport", "WriteFlusher"]

#: The largest write joined to a held one by copying both.
_JOIN_BYTES = 64 * 1024


class WriteFlusher:
    """Sends, at the start of the loop's next turn, what :class:`CoalescingTransport` s
    still hold. One per server (its connections all run on its one event loop)."""

    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held: list[CoalescingTransport] = []

    def add(self, transport: CoalescingTransport, loop: asyncio.AbstractEventLoop) -> None:
        if not self._held:
            loop.call_soon(self._flush)
        self._held.append(transport)

    def _flush(self) -> None:
        held, self._held = self._held, []
        for transport in held:
            transport.flush()


class CoalescingTransport:
    """``transport`` with writes of one loop turn joined (see the module docstring); every
    other attribute is ``transport``'s. One per connection, used on its event loop only."""

    __slots__ = ("_flusher", "_held", "_loop", "transport")

    def __init__(
        self,
        transport: asyncio.Transport,
        loop: asyncio.AbstractEventLoop,
        flusher: WriteFlusher,
    ) -> None:
        self.transport = transport
        self._loop = loop
        self._flusher = flusher
        self._held: bytes | None = None

    def write(self, data: bytes) -> None:
        held = self._held
        if held is None:
            if data:
                self._held = bytes(data)
                self._flusher.add(self, self._loop)
            return
        self._held = None
        if len(data) <= _JOIN_BYTES:
            self.transport.write(held + data)
        else:  # a copy of a large body costs more than the call it saves
            self.transport.write(held)
            self.transport.write(data)

    def write_now(self, data: bytes) -> None:
        """Send ``data``, a whole answer, now (after what is held, joined with it)."""
        held = self._held
        if held is None:
            self.transport.write(data)
        else:
            self._held = None
            self.transport.write(held + data)

    def flush(self) -> None:
        """Send what is held now (nothing when nothing is)."""
        held, self._held = self._held, None
        if held is not None and not self.transport.is_closing():
            self.transport.write(held)

    def write_eof(self) -> None:
        self.flush()
        self.transport.write_eof()

    def close(self) -> None:
        self.flush()
        self.transport.close()

    def abort(self) -> None:
        self._held = None
        self.transport.abort()

    def is_closing(self) -> bool:
        return self.transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)
