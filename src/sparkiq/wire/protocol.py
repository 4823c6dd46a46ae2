"""The binary protocol between routers, nodes and clients (protocol version 1).

A request is one MessagePack map (``POST /internal/query``, content type
:data:`CONTENT_TYPE`)::

    {"v": 1, "store": str, "query": {"type": str, "fields": {...}},
     "partitions": [int] | None, "bound": position token | None,
     "require_active": bool, "info": bool, "local": bool,
     "at_batch": int | None, "at_time": epoch seconds | None}

``partitions`` names at most :data:`~sparkiq.query.request.MAX_PARTITIONS` (65,536) distinct
partition numbers, each below that number (``None``: every partition); a longer list, a
number out of range or one named twice is refused as the request is decoded (an
``invalid_query`` error on ``partitions``), before any work.

``local`` asks the node to answer from its own replicas only (a router's sub-request);
otherwise the node routes the request itself. Query types travel by the name they are
registered under (:mod:`sparkiq.query.registry`: the built-in types, and every type given a
handler with :func:`sparkiq.register`) with their dataclass fields encoded by
:mod:`sparkiq.wire.values` (a query type that is not a dataclass travels only if it holds no
state); nothing else can be instantiated from the wire.

A response is a sequence of *frames*: a 4-byte big-endian length, then one MessagePack map.
Every requested partition gets a header frame, in order::

    {"p": int, "ok": true, "pos": token, "info": [str], "kind": "value", "value": ...}
    {"p": int, "ok": true, "pos": token, "info": [str], "kind": "rows"}
        then {"p": int, "rows": [[key, row], ...]} frames and {"p": int, "end": true}
    {"p": int, "ok": false, "reason": FailureReason name, "message": str, "pos": token}

A value is any value :mod:`sparkiq.wire.values` encodes: a row, ``None``, a
:class:`~sparkiq.query.versioned.VersionedRecord` (a registered record) or a list of them.
Iterator results (range and window queries) are streamed in chunks of at most
:data:`ROWS_PER_FRAME` rows, so neither side buffers a large scan. A request that cannot be
answered at all gets a single frame ``{"error": {"code", "message", "field"}}``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import msgspec
import orjson

from sparkiq.error_codes import ErrorCode
from sparkiq.errors import InvalidQueryError, NodeUnreachableError, SparkiqError
from sparkiq.query.position import Position, PositionBound
from sparkiq.query.queries import Query, ResultOrder
from sparkiq.query.registry import query_type, query_type_name, query_type_names
from sparkiq.query.request import StateQueryRequest, partition_list_problem
from sparkiq.query.result import FailureReason, QueryResult, RowIterator, StateQueryResult
from sparkiq.query.versioned import VersionedRecord
from sparkiq.wire.values import pack, register_enum, register_record, unpack, unpack_plain

__all__ = [
    "CONTENT_TYPE",
    "MAX_FRAME_BYTES",
    "PROTOCOL_VERSION",
    "ROWS_PER_FRAME",
    "RemoteError",
    "decode_request",
    "encode_request",
    "error_frame",
    "error_of",
    "read_frames",
    "result_frames",
    "results_from_frames",
]

PROTOCOL_VERSION = 1
CONTENT_TYPE = "application/x-sparkiq-v1"
ROWS_PER_FRAME = 512
MAX_FRAME_BYTES = 64 << 20
_LENGTH = struct.Struct(">I")

register_enum(ResultOrder, "ResultOrder")
register_record(VersionedRecord, "VersionedRecord")


class RemoteError(SparkiqError):
    """Another node (or whatever answered) refused or failed a request as a whole; ``code``
    and ``field`` are its answer's (a code this version does not know reads as itself).
    This node's own answer about it is ``upstream_unavailable``: the fault is elsewhere."""

    code = ErrorCode.UPSTREAM_UNAVAILABLE

    @property
    def reply_code(self) -> ErrorCode:
        return ErrorCode.UPSTREAM_UNAVAILABLE

    @classmethod
    def from_answer(cls, code: ErrorCode, doc: Mapping[str, Any], status: int) -> RemoteError:
        error = super().from_answer(code, doc, status)
        error.message = f"{status}: {error.message}"
        error.args = (error.message,)
        return error


def error_of(body: bytes) -> dict[str, Any] | None:
    """The ``error`` member of an error answer's body (JSON or MessagePack, both with
    ``code`` and ``message``), or None when the body is not one: something other than a
    sparkiq node answered."""
    for decode in (orjson.loads, unpack_plain):
        try:
            error = decode(body)["error"]
        except Exception:  # not this encoding (or not an error answer): try the next
            continue
        if isinstance(error, dict) and "code" in error and "message" in error:
            return error
    return None


def encode_request(request: StateQueryRequest, *, local: bool = False) -> bytes:
    bound = request.bound.position
    doc = {
        "v": PROTOCOL_VERSION,
        "store": request.store,
        "query": _query_doc(request.query),
        "partitions": None if request.partitions is None else sorted(request.partitions),
        "bound": None if bound is None else bound.to_token(),
        "require_active": request.is_require_active,
        "info": request.is_execution_info_enabled,
        "local": local,
    }
    if request.at_batch is not None:
        doc["at_batch"] = request.at_batch
    if request.at_time is not None:
        doc["at_time"] = request.at_time.timestamp()
    return pack(doc)


def _query_doc(query: Query) -> dict[str, Any]:
    name = query_type_name(type(query))
    if name is None:
        raise InvalidQueryError(
            f"{type(query).__name__} cannot be sent to another node: register it (with its "
            "handler) with sparkiq.register() in every process that sends or answers it"
        )
    if dataclasses.is_dataclass(query):
        fields: dict[str, Any] = {f.name: getattr(query, f.name) for f in dataclasses.fields(query)}
    elif getattr(query, "__dict__", None):
        raise InvalidQueryError(
            f"{type(query).__name__} holds state outside dataclass fields and cannot be sent "
            "to another node: make it a frozen dataclass"
        )
    else:
        fields = {}
    return {"type": name, "fields": fields}


def decode_request(body: bytes) -> tuple[StateQueryRequest, bool]:
    """The request and its ``local`` flag; :class:`InvalidQueryError` names a bad field."""
    try:
        doc = unpack(body, tables=False)
    except (msgspec.DecodeError, ValueError) as exc:
        raise InvalidQueryError(f"request body is not a sparkiq v1 message: {exc}") from None
    if not isinstance(doc, dict) or doc.get("v") != PROTOCOL_VERSION:
        raise InvalidQueryError(
            f"unsupported protocol version {doc.get('v') if isinstance(doc, dict) else None!r}; "
            f"this node speaks version {PROTOCOL_VERSION}"
        )
    query_doc = doc.get("query")
    if not isinstance(query_doc, dict):
        raise _field_error("query", f"expected a map with type and fields, got {query_doc!r}")
    name = query_doc.get("type")
    cls = query_type(name) if isinstance(name, str) else None
    if cls is None:
        raise _field_error(
            "query.type",
            f"unknown query type {name!r}; this node knows {query_type_names()} (register a "
            "custom query type with sparkiq.register() in every process)",
        )
    fields = query_doc.get("fields") or {}
    if not isinstance(fields, dict) or not all(isinstance(k, str) for k in fields):
        raise _field_error("query.fields", f"expected a map of field names, got {fields!r}")
    try:
        query = cls(**fields)
    except (TypeError, ValueError) as exc:
        raise _field_error("query.fields", f"{cls.__name__}: {exc}") from None
    store = doc.get("store")
    if not isinstance(store, str) or not store:
        raise _field_error("store", "must be a non-empty string")
    request = StateQueryRequest.in_store(store).with_query(query)
    partitions = doc.get("partitions")
    if partitions is not None:
        problem = partition_list_problem(partitions)
        if problem is not None:
            raise _field_error("partitions", problem)
        request = request.with_partitions(partitions)
    if doc.get("bound") is not None:
        try:
            bound = Position.from_token(doc["bound"])
        except (TypeError, ValueError) as exc:
            raise _field_error("bound", str(exc)) from None
        request = request.with_position_bound(PositionBound.at(bound))
    if doc.get("require_active"):
        request = request.require_active()
    if doc.get("info"):
        request = request.enable_execution_info()
    at_batch, at_time = doc.get("at_batch"), doc.get("at_time")
    try:
        if at_batch is not None:
            request = request.as_of(at_batch)
        if at_time is not None:
            if isinstance(at_time, bool) or not isinstance(at_time, int | float):
                raise ValueError(f"expected epoch seconds, got {at_time!r}")
            request = request.as_of_time(dt.datetime.fromtimestamp(at_time, dt.UTC))
    except (TypeError, ValueError, OverflowError, OSError) as exc:
        field = "at_batch" if at_batch is not None and at_time is None else "at_time"
        raise _field_error(field, str(exc)) from None
    return request, bool(doc.get("local"))


def _field_error(field: str, message: str) -> InvalidQueryError:
    return InvalidQueryError(f"{field}: {message}", field=field)


# -- responses ---------------------------------------------------------------------------------


def _frame(doc: Any) -> bytes:
    data = pack(doc)
    return _LENGTH.pack(len(data)) + data


def error_frame(code: ErrorCode | str, message: str, field: str | None = None) -> bytes:
    return _frame(
        {"error": {"code": ErrorCode.parse(code).wire, "message": message, "field": field}}
    )


def result_frames(results: StateQueryResult[Any]) -> Iterator[bytes]:
    """Frames for every partition result, streaming iterator results chunk by chunk.

    Closes every iterator result, also when the consumer stops early (``close()`` on the
    generator)."""
    items = sorted(results.partition_results.items())
    try:
        for partition, result in items:
            yield from _partition_frames(partition, result)
    finally:
        for _, result in items:
            if isinstance(result.result, RowIterator):
                result.result.close()


def _partition_frames(partition: int, result: QueryResult[Any]) -> Iterator[bytes]:
    position = result.position.to_token()
    if result.failure_reason is not None:
        yield _frame(
            {
                "p": partition,
                "ok": False,
                "reason": result.failure_reason.name,
                "message": result.failure_message,
                "pos": position,
            }
        )
        return
    value = result.result
    header = {"p": partition, "ok": True, "pos": position, "info": list(result.execution_info)}
    if not isinstance(value, Iterator):
        yield _frame(header | {"kind": "value", "value": value})
        return
    yield _frame(header | {"kind": "rows"})
    chunk: list[Any] = []
    for item in value:
        chunk.append(item)
        if len(chunk) >= ROWS_PER_FRAME:
            yield _frame({"p": partition, "rows": chunk})
            chunk = []
    if chunk:
        yield _frame({"p": partition, "rows": chunk})
    yield _frame({"p": partition, "end": True})


def read_frames(chunks: Iterable[bytes]) -> Iterator[Any]:
    """Decoded frames from a byte stream cut anywhere (HTTP chunks)."""
    buffer = bytearray()
    for chunk in chunks:
        buffer += chunk
        while len(buffer) >= 4:
            (length,) = _LENGTH.unpack_from(buffer)
            if length > MAX_FRAME_BYTES:
                raise RemoteError(f"frame of {length} bytes exceeds {MAX_FRAME_BYTES}")
            if len(buffer) < 4 + length:
                break
            try:
                frame = unpack(memoryview(buffer)[4 : 4 + length].tobytes())
            except ValueError as exc:
                raise RemoteError(
                    f"malformed response frame: {exc}", code=ErrorCode.BAD_FRAME
                ) from None
            del buffer[: 4 + length]
            yield frame
    if buffer:
        raise NodeUnreachableError(
            "the response ended in the middle of a frame: the node went away mid-answer"
        )


def results_from_frames(
    frames: Iterator[Any],
    partitions: Iterable[int] | None = None,
    on_close: Callable[[], None] | None = None,
) -> dict[int, QueryResult[Any]]:
    """Per-partition results from a response's frames.

    When ``partitions`` (the partitions asked for, in order) is given, the last one's
    iterator result is read lazily from the stream, and ``on_close`` runs when it is
    closed or exhausted; rows of the partitions before it are read as they come, since the
    stream must move past them. Ask for one partition per request to stream everything.
    """
    last = max(partitions, default=None) if partitions is not None else None
    results: dict[int, QueryResult[Any]] = {}
    lazy = False
    try:
        for frame in frames:
            if isinstance(frame, dict) and isinstance(frame.get("error"), dict):
                error = frame["error"]
                raise RemoteError(
                    str(error.get("message", "request refused")),
                    code=ErrorCode.parse(str(error.get("code") or ErrorCode.UPSTREAM_UNAVAILABLE)),
                    field=error.get("field"),
                )
            header = _header(frame)
            partition, position = header.partition, header.position
            if header.failure is not None:
                results[partition] = QueryResult.for_failure(
                    header.failure, header.message, position
                )
                continue
            if header.kind == "value":
                results[partition] = QueryResult.for_result(frame["value"], position, header.info)
                continue
            rows = _rows_of(frames)
            if partition != last:
                rows = iter(list(rows))
            else:
                lazy = True
            results[partition] = QueryResult.for_result(
                RowIterator(rows, on_close if lazy else None), position, header.info
            )
            if lazy:
                break
        asked = None if partitions is None else set(partitions)
        missing = sorted(asked - results.keys()) if asked is not None else []
        if missing or (asked is None and not results):
            # a connection cut between frames ends the stream cleanly: not an answer
            lazy = False  # so the stream is closed
            raise NodeUnreachableError(
                f"the response ended before the results of partitions {missing or 'any'}: "
                "the node went away mid-answer"
            )
    finally:
        if not lazy and on_close is not None:
            on_close()
    return results


@dataclasses.dataclass(frozen=True, slots=True)
class _Header:
    partition: int
    position: Position
    failure: FailureReason | None
    message: str
    kind: str
    info: tuple[str, ...]


def _header(frame: Any) -> _Header:
    """A partition's header frame, checked: a malformed one is a :class:`RemoteError`."""
    try:
        partition, ok = frame["p"], frame["ok"]
        if not isinstance(partition, int) or isinstance(partition, bool):
            raise ValueError(f"partition {partition!r} is not a number")
        position = Position.from_token(frame["pos"])
        if not ok:
            return _Header(
                partition, position, FailureReason[frame["reason"]], str(frame["message"]), "", ()
            )
        kind = frame["kind"]
        if kind not in ("value", "rows") or (kind == "value" and "value" not in frame):
            raise ValueError(f"unknown result kind {kind!r}")
        info = tuple(str(line) for line in frame.get("info") or ())
        return _Header(partition, position, None, "", kind, info)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise RemoteError(
            f"malformed partition header frame {frame!r:.200}: {exc!r}", code=ErrorCode.BAD_FRAME
        ) from None


def _rows_of(frames: Iterator[Any]) -> Iterator[tuple[Any, Any]]:
    """The rows of one partition, from the frames that follow its header."""
    for frame in frames:
        if not isinstance(frame, dict):
            raise RemoteError(f"malformed rows frame {frame!r:.200}", code=ErrorCode.BAD_FRAME)
        if frame.get("end"):
            return
        rows = frame.get("rows")
        if not isinstance(rows, list) or not all(
            isinstance(item, list | tuple) and len(item) == 2 for item in rows
        ):
            raise RemoteError(f"malformed rows frame {frame!r:.200}", code=ErrorCode.BAD_FRAME)
        yield from rows
    raise NodeUnreachableError(
        "the response ended before the partition's last row: the node went away mid-answer"
    )
