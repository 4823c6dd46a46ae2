"""ASGI plumbing of the HTTP server: reading a request's headers, writing an answer.

The small pieces :class:`~sparkiq.server.app.RestApp` is built from and that know nothing of
sparkiq's routes: header lookups, the caller's address and bearer token, JSON bodies,
answers and JSON errors, chunk coalescing for streamed answers.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from sparkiq.error_codes import ErrorCode
from sparkiq.server.http_errors import HttpError
from sparkiq.wire import arrowipc, jsonapi, protocol

__all__ = [
    "JSON_HEADERS",
    "WHOLE_ANSWER",
    "Receive",
    "Scope",
    "Send",
    "accepts_arrow",
    "accepts_binary",
    "allow",
    "bearer",
    "close_all",
    "coalesced",
    "header",
    "json_object",
    "peer",
    "send_body",
    "send_error",
    "send_in_two",
    "when_disconnected",
]

log = logging.getLogger("sparkiq.server")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

JSON_HEADERS = [(b"content-type", b"application/json")]


async def when_disconnected(receive: Receive, then: Callable[[], Any]) -> None:
    """Call ``then`` when the client disconnects (a push stream's producer thread then ends,
    a statement is canceled); the request's body has been read."""
    while (await receive())["type"] != "http.disconnect":
        pass
    then()


def coalesced(chunks: Iterator[bytes], size: int = 65536) -> Iterator[bytes]:
    """Small frames joined into writes of about ``size`` bytes."""
    buffer: list[bytes] = []
    held = 0
    for chunk in chunks:
        buffer.append(chunk)
        held += len(chunk)
        if held >= size:
            yield b"".join(buffer)
            buffer, held = [], 0
    if buffer:
        yield b"".join(buffer)


def close_all(*iterators: Iterator[bytes]) -> None:
    for iterator in iterators:
        close = getattr(iterator, "close", None)
        if close is not None:
            close()


def json_object(body: bytes) -> dict[str, Any]:
    import orjson

    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise HttpError(ErrorCode.MALFORMED_JSON, f"malformed JSON: {exc}", "body") from None
    if not isinstance(doc, dict):
        raise HttpError(ErrorCode.INVALID_REQUEST, "expected a JSON object", "body")
    return doc


def accepts_arrow(scope: Scope) -> bool:
    return any(
        name == b"accept" and arrowipc.CONTENT_TYPE.encode() in value
        for name, value in scope["headers"]
    )


def accepts_binary(scope: Scope) -> bool:
    return any(
        name == b"accept" and protocol.CONTENT_TYPE.encode() in value
        for name, value in scope["headers"]
    )


def header(scope: Scope, name: str) -> str | None:
    wanted = name.encode()
    for key, value in scope["headers"]:
        if key == wanted:
            text: str = value.decode("latin-1")
            return text
    return None


def peer(scope: Scope) -> str | None:
    """The caller's address (None when the server does not know it)."""
    client = scope.get("client")
    return None if not client else str(client[0])


def bearer(scope: Scope) -> str | None:
    for name, value in scope["headers"]:
        if name == b"authorization":
            text: str = value.decode("latin-1")
            if text[:7].lower() == "bearer ":
                return text[7:].strip()
            return None
    return None


def allow(method: str, allowed: str) -> None:
    if method != allowed:
        raise HttpError(ErrorCode.METHOD_NOT_ALLOWED, f"use {allowed} for this path")


#: The scope key of a server's ``async answer(scope, send, status, headers, body)``: an
#: answer's head and body in one call (ASGI has two messages for it; sparkiq's server
#: offers this, see sparkiq.server.runner). Headers are the app's own (not checked) and
#: without the length.
WHOLE_ANSWER = "sparkiq.whole_answer"


async def send_body(
    send: Send,
    status: int,
    body: bytes,
    headers: list[tuple[bytes, bytes]],
    scope: Scope | None = None,
) -> None:
    """Answer ``status`` with ``body`` (its length added to ``headers``); pass ``scope`` to
    use the server's :data:`WHOLE_ANSWER` where it has one."""
    if scope is not None:
        whole = scope.get(WHOLE_ANSWER)
        if whole is not None:
            await whole(scope, send, status, headers, body)
            return
    await send_in_two(send, status, headers, body)


async def send_in_two(
    send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes
) -> None:
    """An answer as ASGI's two messages: its head (with the body's length), its body."""
    headers = [*headers, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def send_error(send: Send, error: HttpError) -> None:
    doc: dict[str, Any] = {"code": error.code.wire, "message": error.message, "field": error.field}
    doc.update(error.extra)
    headers = list(JSON_HEADERS)
    if error.status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="sparkiq"'))
    try:
        await send_body(send, error.status, jsonapi.dumps({"error": doc}), headers)
    except Exception:  # the response had already started: nothing more can be said
        log.debug("could not send error %s", error.code, exc_info=True)
