"""One connection's messages as bytes: framing what the client sends, and encoding the
answers every query sends.

PostgreSQL's "Frontend/Backend Protocol", version 3.0, frames a message as ``Byte1``
identifier, ``Int32`` length (counting itself, not the identifier) and the payload; only the
first message of a connection (the startup message, or a cancel request) has no identifier.
:class:`Frames` cuts a client's bytes into such messages itself, so that no byte a client
sent ahead is ever held inside the codec:

- while the client logs in, each whole message is handed to pygwire's
  ``BackendConnection``, whose state machine tells the ambiguous login messages apart (a
  ``p`` is a password, or either SCRAM message, by what was asked);
- once it has logged in, each message is decoded by its identifier with pygwire's message
  class (:func:`decode`) and the connection's state machine is left out: a session answers
  each message by its type and its own statements and portals, and the state machine's
  bookkeeping was a quarter of a prepared key lookup's time in the node.

The answers sent on every query (``BindComplete``, ``DataRow``, ``CommandComplete``,
``ReadyForQuery``...) are encoded here with ``struct``; a ``RowDescription`` is encoded by
pygwire once and the bytes reused (:func:`row_description`). Every other answer is pygwire's
``to_wire()``.

A message longer than :data:`MAX_MESSAGE_BYTES` (pygwire's bound, Postgres' own 1 GiB) or
shorter than its length field fails with ``FramingError``: the session ends the connection
with SQLSTATE 08P01, as Postgres does.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from pygwire import messages as m
from pygwire.exceptions import DecodingError, FramingError

__all__ = [
    "BIND_COMPLETE",
    "CLOSE_COMPLETE",
    "EMPTY_QUERY",
    "MAX_MESSAGE_BYTES",
    "NO_DATA",
    "PARSE_COMPLETE",
    "PORTAL_SUSPENDED",
    "Frames",
    "command_complete",
    "data_row",
    "decode",
    "ready_for_query",
    "row_description",
]

MAX_MESSAGE_BYTES = 1 << 30

_LENGTH = struct.Struct("!i")
_HEAD = struct.Struct("!ci")
_COUNT = struct.Struct("!h")
_NULL = b"\xff\xff\xff\xff"

# The messages a logged-in client may send, by identifier. COPY's and a function call's
# decode too: the session ends the connection on them (it speaks neither).
_FRONTEND: dict[int, type[m.PGMessage]] = {
    cls.identifier[0]: cls
    for cls in (
        m.Query,
        m.Parse,
        m.Bind,
        m.Describe,
        m.Execute,
        m.Sync,
        m.Flush,
        m.Close,
        m.Terminate,
        m.CopyData,
        m.CopyDone,
        m.CopyFail,
        m.FunctionCall,
    )
}

PARSE_COMPLETE = b"1\x00\x00\x00\x04"
BIND_COMPLETE = b"2\x00\x00\x00\x04"
CLOSE_COMPLETE = b"3\x00\x00\x00\x04"
NO_DATA = b"n\x00\x00\x00\x04"
EMPTY_QUERY = b"I\x00\x00\x00\x04"
PORTAL_SUSPENDED = b"s\x00\x00\x00\x04"
_READY = {False: b"Z\x00\x00\x00\x05I", True: b"Z\x00\x00\x00\x05T"}


class Frames:
    """Cuts the bytes ``read`` returns (it raises when the client is gone) into whole
    messages, ``head`` first (bytes already read off the socket)."""

    def __init__(self, read: Callable[[], bytes], head: bytes = b"") -> None:
        self._read = read
        self._buf = head
        self._pos = 0
        self._last = 0  # where the message ready() took last started

    def _fill(self, size: int) -> None:
        """Read until ``size`` bytes from the current position are held."""
        buf = self._buf[self._pos :]
        while len(buf) < size:
            buf += self._read()
        self._buf, self._pos = buf, 0

    def startup(self) -> bytes:
        """The first message whole (length included): a startup message or a request."""
        self._fill(4)
        (length,) = _LENGTH.unpack_from(self._buf, self._pos)
        if not 8 <= length <= MAX_MESSAGE_BYTES:
            raise FramingError(f"a startup message of {length} bytes")
        self._fill(length)
        whole = self._buf[self._pos : self._pos + length]
        self._pos += length
        return whole

    @property
    def buffered(self) -> int:
        """Bytes read and not yet taken as a message."""
        return len(self._buf) - self._pos

    def feed(self, data: bytes) -> None:
        """Bytes read by someone else (the reactor's non-blocking read)."""
        self._buf = self._buf[self._pos :] + data
        self._pos = 0

    def ready(self) -> tuple[int, bytes] | None:
        """The next message if it is whole in what was read, else None (nothing read)."""
        if len(self._buf) - self._pos < 5:
            return None
        _, length = _HEAD.unpack_from(self._buf, self._pos)
        if len(self._buf) - self._pos < 1 + length and 4 <= length <= MAX_MESSAGE_BYTES:
            return None
        self._last = self._pos
        ident, start, end = self._take()
        return ident, self._buf[start:end]

    def push_back(self) -> None:
        """Give back the message :meth:`ready` took last (someone else will take it)."""
        self._pos = self._last

    def whole(self) -> bytes:
        """The next message with its identifier and length, as sent (for pygwire)."""
        _, start, end = self._take()
        return self._buf[start - 5 : end]

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        """``(identifier, payload)`` of each message, as they come."""
        while True:
            ident, start, end = self._take()
            yield ident, self._buf[start:end]

    def _take(self) -> tuple[int, int, int]:
        """The next message's identifier and where its payload starts and ends in
        ``_buf`` (read as far as needed)."""
        if len(self._buf) - self._pos < 5:
            self._fill(5)
        ident, length = _HEAD.unpack_from(self._buf, self._pos)
        if not 4 <= length <= MAX_MESSAGE_BYTES:
            raise FramingError(f"a message {ident!r} of {length} bytes")
        if len(self._buf) - self._pos < 1 + length:
            self._fill(1 + length)
        start = self._pos + 5
        self._pos = end = self._pos + 1 + length
        return ident[0], start, end


def decode(ident: int, payload: bytes) -> m.PGMessage:
    """The frontend message ``payload`` holds, by its identifier; ``FramingError`` for an
    identifier no client may send once logged in, or a payload that is not its message."""
    fast = _DECODERS.get(ident)
    cls = _FRONTEND.get(ident)
    if cls is None:
        raise FramingError(f"unknown message identifier {bytes((ident,))!r}")
    try:
        return cls.decode(memoryview(payload)) if fast is None else fast(payload)
    except (struct.error, ValueError, IndexError, DecodingError) as exc:
        # ValueError: a string without its NUL, or one that is not UTF-8
        raise FramingError(f"{cls.__name__} message truncated or malformed: {exc}") from None


def _string(payload: bytes, start: int) -> tuple[str, int]:
    """The NUL-terminated string at ``start`` and where what follows it starts."""
    end = payload.index(0, start)
    return payload[start:end].decode(), end + 1


def _codes(payload: bytes, start: int) -> tuple[list[int], int]:
    """An ``Int16`` count and that many ``Int16`` codes."""
    (count,) = _COUNT.unpack_from(payload, start)
    return list(struct.unpack_from(f"!{count}h", payload, start + 2)), start + 2 + 2 * count


def _bind(payload: bytes) -> m.Bind:
    # Decoded here rather than by pygwire, whose string reads copy the rest of the payload
    # for each of the two names: a Bind is sent on every run of a prepared statement.
    portal, pos = _string(payload, 0)
    statement, pos = _string(payload, pos)
    formats, pos = _codes(payload, pos)
    (count,) = _COUNT.unpack_from(payload, pos)
    pos += 2
    values: list[bytes | None] = []
    for _ in range(count):
        (size,) = _LENGTH.unpack_from(payload, pos)
        pos += 4
        if size == -1:
            values.append(None)
            continue
        if size < 0 or pos + size > len(payload):
            raise DecodingError(f"a parameter value of {size} bytes")
        values.append(payload[pos : pos + size])
        pos += size
    results, pos = _codes(payload, pos)
    return m.Bind(portal, statement, formats, values, results)


def _execute(payload: bytes) -> m.Execute:
    portal, pos = _string(payload, 0)
    (max_rows,) = _LENGTH.unpack_from(payload, pos)
    return m.Execute(portal, max_rows)


def _describe(payload: bytes) -> m.Describe:
    return m.Describe(chr(payload[0]), _string(payload, 1)[0])


_SYNC = m.Sync()

_DECODERS: dict[int, Callable[[bytes], m.PGMessage]] = {
    ord("B"): _bind,
    ord("E"): _execute,
    ord("D"): _describe,
    ord("S"): lambda payload: _SYNC,
}


def ready_for_query(in_transaction: bool) -> bytes:
    """``ReadyForQuery``: idle, or in a transaction block."""
    return _READY[in_transaction]


def command_complete(tag: str) -> bytes:
    data = tag.encode() + b"\x00"
    return b"C" + _LENGTH.pack(4 + len(data)) + data


def data_row(values: Sequence[bytes | None]) -> bytes:
    """A ``DataRow`` of encoded values (None: NULL)."""
    parts = [_COUNT.pack(len(values))]
    size = 6
    for value in values:
        if value is None:
            parts.append(_NULL)
            size += 4
        else:
            parts.append(_LENGTH.pack(len(value)))
            parts.append(value)
            size += 4 + len(value)
    return b"D" + _LENGTH.pack(size) + b"".join(parts)


def row_description(fields: list[Any]) -> bytes:
    """A ``RowDescription`` of pygwire ``FieldDescription`` s, as bytes to keep and reuse."""
    return m.RowDescription(fields=fields).to_wire()
