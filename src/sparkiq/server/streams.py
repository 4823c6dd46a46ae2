"""Response bodies produced piece by piece: IQv2 results as streamed JSON, push queries as
newline-delimited JSON, SQL results as JSON."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Iterator
from concurrent.futures import Executor
from typing import Any

from sparkiq.errors import ErrorCode, SparkiqError
from sparkiq.query.result import StateQueryResult
from sparkiq.server.scrub import scrub
from sparkiq.sql.change import Change
from sparkiq.sql.subscription import SubscriptionError
from sparkiq.wire.jsonapi import dumps

__all__ = ["KEEPALIVE_SECONDS", "change_lines", "iq_json_chunks", "push_stream", "sql_json"]

ROWS_PER_CHUNK = 512
KEEPALIVE_SECONDS = 10.0
#: a push chunk of more changes is encoded off the event loop (once for every stream that
#: sends it), so that lookups answered on the loop never wait for a large snapshot
ENCODE_ON_LOOP_MAX = 2_000


def iq_json_chunks(
    store: str, results: StateQueryResult[Any], roots: tuple[str, ...] = ()
) -> Iterator[bytes]:
    """``{"store", "partitions": {p: {...}}, "position"}`` written as it is read.

    A partition is ``{"position", "result"}`` for a single value, ``{"position", "rows":
    [{"key", "row"}, ...]}`` for an iterator result (streamed, never held whole) or
    ``{"position", "failure": {"reason", "message"}}``, the message scrubbed of paths and
    Python internals (:func:`~sparkiq.server.scrub.scrub`, ``roots`` as there).
    """
    items = sorted(results.partition_results.items())
    try:
        yield b'{"store":' + dumps(store) + b',"partitions":{'
        for index, (partition, result) in enumerate(items):
            head = (b"," if index else b"") + dumps(str(partition)) + b":"
            position = dumps(result.position.to_token())
            info = b""
            if result.execution_info:
                info = b',"execution_info":' + dumps(list(result.execution_info))
            if result.failure_reason is not None:
                message = scrub(result.failure_message or "", roots)
                failure = {"reason": result.failure_reason.name, "message": message}
                yield (
                    head
                    + b'{"position":'
                    + position
                    + info
                    + b',"failure":'
                    + dumps(failure)
                    + b"}"
                )
                continue
            value = result.result
            if not isinstance(value, Iterator):
                yield head + b'{"position":' + position + info + b',"result":' + dumps(value) + b"}"
                continue
            yield head + b'{"position":' + position + info + b',"rows":['
            first = True
            chunk: list[bytes] = []
            for key, row in value:
                chunk.append(dumps({"key": key, "row": row}))
                if len(chunk) >= ROWS_PER_CHUNK:
                    yield (b"" if first else b",") + b",".join(chunk)
                    first, chunk = False, []
            if chunk:
                yield (b"" if first else b",") + b",".join(chunk)
            yield b"]}"
        yield b'},"position":' + dumps(results.position.to_token()) + b"}"
    finally:
        for _, result in items:
            close = getattr(result.result, "close", None)
            if close is not None:
                close()


def change_lines(changes: list[Change]) -> bytes:
    """The NDJSON lines of ``changes`` (see :func:`push_stream`). The hub encodes a batch's
    changes once with this for every subscription that delivers the same ones."""
    return b"".join(
        dumps(
            {
                "key": change.key,
                "row": change.row,
                "position": change.token,
                "batch_id": change.batch_id,
                "snapshot": change.snapshot,
            }
        )
        + b"\n"
        for change in changes
    )


async def push_stream(
    subscription: Any, roots: tuple[str, ...] = (), executor: Executor | None = None
) -> AsyncGenerator[bytes, None]:
    """One JSON line per change (``{"key", "row", "position", "batch_id", "snapshot"}``,
    the fields of :class:`~sparkiq.sql.change.Change`; ``row`` null for a deletion), an
    empty line every :data:`KEEPALIVE_SECONDS` while nothing happens, and a final
    ``{"error": ...}`` line if the subscription fails (e.g. the client reads too slowly),
    its message scrubbed as the REST API's errors. Awaited on the event loop: a stream
    holds no thread while it waits (catching up reads the changelog on ``executor``).
    Closing the generator closes the subscription."""
    try:
        while True:
            try:
                chunk = await subscription.poll_chunk_async(KEEPALIVE_SECONDS, executor)
            except SparkiqError as exc:
                # a subscription's own failure says why; anything else failed the push
                code = exc.code if isinstance(exc, SubscriptionError) else ErrorCode.PUSH_FAILED
                error = {
                    "code": code.wire,
                    "message": scrub(exc.message, roots),
                }
                yield dumps({"error": error}) + b"\n"
                return
            if chunk is None:
                if getattr(subscription, "closed", False):
                    return
                yield b"\n"
                continue
            if len(chunk) > ENCODE_ON_LOOP_MAX:  # a snapshot's partition, a huge batch
                loop = asyncio.get_running_loop()
                yield await loop.run_in_executor(executor, chunk.encoded, change_lines)
            else:
                yield chunk.encoded(change_lines)
    finally:
        subscription.close()


def sql_json(result: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "columns": list(result.columns),
        "rows": result.rows,
        "position": result.position.to_token(),
    }
    token = getattr(result, "next_page_token", None)
    if token is not None:
        doc["next_page_token"] = token
    explain = getattr(result, "explain", None)
    if explain is not None:
        doc["explain"] = explain
    return doc
