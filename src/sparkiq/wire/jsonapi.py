"""JSON for the REST API: requests parsed field by field, rows rendered for people.

Keys and bounds arrive as JSON values (or URL text) and are converted by the key column's
Spark type: ``"2024-05-01"`` for a date, ``"2024-05-01T10:00:00"`` for a timestamp (naive
means the node's local time, as PySpark does; an offset is honoured), a string or a number
for a decimal, base64 for binary. A composite key is a JSON array in key-column order.

Rows go out as JSON objects: dates and timestamps in ISO 8601, decimals as strings (no
precision lost), binary as base64. Every conversion error is an
:class:`~sparkiq.errors.InvalidQueryError` whose ``field`` names the offending field.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
from decimal import Decimal, InvalidOperation
from typing import Any

import orjson

from sparkiq.errors import InvalidQueryError
from sparkiq.query.instant import instant_problem
from sparkiq.query.position import Position, PositionBound
from sparkiq.query.queries import (
    KeyQuery,
    Query,
    RangeQuery,
    ResultOrder,
    WindowKeyQuery,
    WindowRangeQuery,
)
from sparkiq.query.request import StateQueryRequest, partition_list_problem
from sparkiq.query.versioned import MultiVersionedKeyQuery, VersionedKeyQuery
from sparkiq.schema.kinds import KINDS
from sparkiq.schema.types import DataType, TableSchema

__all__ = [
    "dumps",
    "field_error",
    "key_from_json",
    "key_from_text",
    "request_from_json",
]

_QUERY_TYPES = (
    "key",
    "range",
    "window_key",
    "window_range",
    "versioned_key",
    "multi_versioned_key",
)
_VERSION_ORDERS = {
    "any": ResultOrder.ANY,
    "ascending": ResultOrder.ASCENDING,
    "descending": ResultOrder.DESCENDING,
}


def field_error(field: str, message: str) -> InvalidQueryError:
    """An :class:`InvalidQueryError` about one request field."""
    return InvalidQueryError(f"{field}: {message}", field=field)


def _default(value: Any) -> Any:
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode()
    if isinstance(value, set | frozenset):
        return sorted(value)
    raise TypeError(f"{type(value).__qualname__} is not JSON serializable")


_OPTIONS = orjson.OPT_NON_STR_KEYS | orjson.OPT_PASSTHROUGH_SUBCLASS


def dumps(value: Any) -> bytes:
    """JSON bytes for a response: rows, keys, metadata. Integers beyond 64 bits (DuckDB's
    HUGEINT) are written as the JSON numbers they are."""
    try:
        return orjson.dumps(value, default=_default, option=_OPTIONS)
    except orjson.JSONEncodeError as exc:
        if "64-bit" not in str(exc):
            raise
        return orjson.dumps(_wide_ints(value), default=_default, option=_OPTIONS)


def _wide_ints(value: Any) -> Any:
    """``value`` with every integer orjson cannot write as a raw JSON fragment (the rare
    path: only taken when such an integer is present)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return orjson.Fragment(str(value)) if not -(1 << 63) <= value < 1 << 64 else value
    if isinstance(value, dict):
        return {k: _wide_ints(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_wide_ints(v) for v in value]
    return value


# -- keys --------------------------------------------------------------------------------------


#: Longest number text a key accepts: DECIMAL(38) with sign, point and exponent fits, and
#: nothing longer reaches ``int()`` or ``Decimal()`` (whose cost grows with the digits).
MAX_NUMBER_CHARS = 100


def _shown(value: Any) -> str:
    """``repr(value)``, cut short: error messages never echo megabytes back."""
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def _scalar(dtype: DataType, value: Any, field: str) -> Any:
    kind = KINDS.get(dtype.name)
    python = None if kind is None else kind.python
    if python in (int, float, Decimal) and isinstance(value, str) and len(value) > MAX_NUMBER_CHARS:
        raise field_error(
            field,
            f"{_shown(value)} has {len(value)} characters; a {dtype.simple_string()} key "
            f"is at most {MAX_NUMBER_CHARS}",
        )
    try:
        if value is None:
            return None
        if python is str:
            if isinstance(value, str):
                return value
        elif python is int:
            if isinstance(value, int) and not isinstance(value, bool):
                return value
            if isinstance(value, str) and value.strip().lstrip("+-").isdigit():
                return int(value)
        elif python is float:
            if isinstance(value, int | float) and not isinstance(value, bool):
                return float(value)
            if isinstance(value, str):
                return float(value)
        elif python is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("true", "false"):
                return value.lower() == "true"
        elif python is dt.date:
            if isinstance(value, str):
                return dt.date.fromisoformat(value)
        elif python is dt.datetime:
            if isinstance(value, str):
                parsed = dt.datetime.fromisoformat(value)
                if kind is not None and not kind.zoned and parsed.tzinfo is not None:
                    raise ValueError(f"{dtype.name} keys have no time zone")
                return parsed
        elif python is Decimal:
            if isinstance(value, str | int) and not isinstance(value, bool):
                return Decimal(str(value))
            if isinstance(value, float):
                return Decimal(repr(value))
        elif python is bytes and isinstance(value, str):
            return base64.b64decode(value, validate=True)
    except (ValueError, InvalidOperation, binascii.Error) as exc:
        raise field_error(
            field, f"{_shown(value)} is not a valid {dtype.simple_string()}: {exc}"
        ) from None
    raise field_error(
        field,
        f"expected a {dtype.simple_string()} value"
        f"{_HINTS.get(python, '')}, got {type(value).__name__} {_shown(value)}",
    )


# by the class of the value PySpark gives for the key's type
_HINTS: dict[type | None, str] = {
    dt.date: " as an ISO date string like '2024-05-01'",
    dt.datetime: " as an ISO timestamp string like '2024-05-01T10:00:00'",
    bytes: " as base64 text",
    Decimal: " as a string like '12.50'",
}


def key_from_json(schema: TableSchema, value: Any, field: str = "key") -> Any:
    """A key (scalar, or tuple for a composite key) from its JSON form."""
    types = schema.key_types
    if len(types) == 1:
        return _scalar(types[0], value, field)
    columns = list(schema.key_columns)
    if not isinstance(value, list) or len(value) != len(types):
        raise field_error(
            field, f"the key has columns {columns}: pass a JSON array of {len(types)} values"
        )
    return tuple(
        _scalar(t, v, f"{field}[{i}]") for i, (t, v) in enumerate(zip(types, value, strict=True))
    )


def key_from_text(schema: TableSchema, text: str, field: str = "key") -> Any:
    """A key from URL text: the value itself for one key column, a JSON array for several."""
    if len(schema.key_types) == 1:
        return _scalar(schema.key_types[0], text, field)
    try:
        parsed = orjson.loads(text)
    except orjson.JSONDecodeError:
        raise field_error(
            field,
            f"the key has columns {list(schema.key_columns)}: pass a JSON array such as "
            '["a", 1] (URL-encoded)',
        ) from None
    return key_from_json(schema, parsed, field)


# -- requests ----------------------------------------------------------------------------------


def _time(value: Any, field: str, *, instant: bool = False) -> dt.datetime | None:
    """An ISO time; with ``instant``, one a node can place among commit times
    (sparkiq.query.instant). Window starts need not be: they are only compared."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise field_error(field, f"expected an ISO timestamp string, got {_shown(value)}")
    try:
        when = dt.datetime.fromisoformat(value)
    except ValueError as exc:
        raise field_error(field, str(exc)) from None
    problem = instant_problem(when) if instant else None
    if problem is not None:
        raise field_error(field, problem)
    return when


def _query_from_json(schema: TableSchema, doc: Any) -> Query:
    if not isinstance(doc, dict):
        raise field_error("query", 'expected an object such as {"type": "key", "key": ...}')
    kind = doc.get("type")
    if kind not in _QUERY_TYPES:
        raise field_error("query.type", f"expected one of {list(_QUERY_TYPES)}, got {_shown(kind)}")
    if kind == "key":
        if "key" not in doc:
            raise field_error("query.key", "a key query needs a key")
        return KeyQuery.with_key(key_from_json(schema, doc["key"], "query.key"))
    if kind == "range":
        query = RangeQuery.with_no_bounds()
        lower = doc.get("lower")
        upper = doc.get("upper")
        if lower is not None and upper is not None:
            query = RangeQuery.with_range(
                key_from_json(schema, lower, "query.lower"),
                key_from_json(schema, upper, "query.upper"),
            )
        elif lower is not None:
            query = RangeQuery.with_lower_bound(key_from_json(schema, lower, "query.lower"))
        elif upper is not None:
            query = RangeQuery.with_upper_bound(key_from_json(schema, upper, "query.upper"))
        order = doc.get("order", "any")
        try:
            return query.with_result_order(ResultOrder(order))
        except ValueError:
            orders = [o.value for o in ResultOrder]
            raise field_error(
                "query.order", f"expected one of {orders}, got {_shown(order)}"
            ) from None
    if kind in ("versioned_key", "multi_versioned_key"):
        return _versioned_query_from_json(schema, kind, doc)
    time_from = _time(doc.get("from"), "query.from")
    time_to = _time(doc.get("to"), "query.to")
    if kind == "window_key":
        if "key" not in doc:
            raise field_error("query.key", "a window_key query needs a key")
        key = key_from_json(schema, doc["key"], "query.key")
        return WindowKeyQuery.with_key_and_window_starts(key, time_from, time_to)
    return WindowRangeQuery.with_window_starts(time_from, time_to)


def _batch(value: Any, field: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise field_error(field, f"expected a batch id (an integer >= 0), got {_shown(value)}")
    return value


def _versioned_query_from_json(schema: TableSchema, kind: str, doc: dict[str, Any]) -> Query:
    """``{"type": "versioned_key", "key", "as_of": batch id | ISO time}`` or
    ``{"type": "multi_versioned_key", "key", "from", "to", "from_batch", "to_batch",
    "order": "ascending" | "descending"}`` (every field but the key optional)."""
    allowed = (
        {"type", "key", "as_of"}
        if kind == "versioned_key"
        else {"type", "key", "from", "to", "from_batch", "to_batch", "order"}
    )
    unknown = sorted(set(doc) - allowed)
    if unknown:
        raise field_error(
            f"query.{unknown[0]}",
            f"unknown field of a {kind} query; expected {sorted(allowed - {'type'})}",
        )
    if "key" not in doc:
        raise field_error("query.key", f"a {kind} query needs a key")
    key = key_from_json(schema, doc["key"], "query.key")
    if kind == "versioned_key":
        query = VersionedKeyQuery.with_key(key)
        as_of = doc.get("as_of")
        if as_of is None:
            return query
        if isinstance(as_of, str):
            when = _time(as_of, "query.as_of", instant=True)
            assert when is not None
            return query.as_of(when)
        batch_id = _batch(as_of, "query.as_of")
        assert batch_id is not None
        return query.as_of(batch_id)
    order = doc.get("order", "any")
    if not isinstance(order, str) or order not in _VERSION_ORDERS:
        raise field_error(
            "query.order", f"expected one of {list(_VERSION_ORDERS)}, got {_shown(order)}"
        )
    bounds = (
        _time(doc.get("from"), "query.from", instant=True),
        _time(doc.get("to"), "query.to", instant=True),
        _batch(doc.get("from_batch"), "query.from_batch"),
        _batch(doc.get("to_batch"), "query.to_batch"),
    )
    try:
        return MultiVersionedKeyQuery(key, *bounds, _VERSION_ORDERS[order])
    except ValueError as exc:  # the bounds make an empty range
        raise field_error("query", str(exc)) from None


def request_from_json(store: str, schema: TableSchema, body: bytes) -> StateQueryRequest:
    """An IQv2 request from the JSON body of ``POST /stores/{store}/query``."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise field_error("body", f"malformed JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise field_error("body", "expected a JSON object with a 'query' field")
    fields = {"query", "partitions", "bound", "after", "require_active", "execution_info"}
    unknown = sorted(set(doc) - fields - {"as_of"})
    if unknown:
        raise field_error(
            unknown[0],
            "unknown field; expected query, partitions, bound, after, require_active, "
            "execution_info, as_of",
        )
    request = StateQueryRequest.in_store(store).with_query(
        _query_from_json(schema, doc.get("query"))
    )
    partitions = doc.get("partitions")
    if partitions is not None:
        problem = partition_list_problem(partitions)
        if problem is not None:
            raise field_error(
                "partitions", f"expected a JSON array of partition numbers; {problem}"
            )
        request = request.with_partitions(partitions)
    bound = bound_from_json(doc)
    if bound is not None:
        request = request.with_position_bound(bound)
    if doc.get("require_active"):
        request = request.require_active()
    if doc.get("execution_info"):
        request = request.enable_execution_info()
    as_of = doc.get("as_of")
    if as_of is not None:
        request = _as_of(request, as_of)
    return request


def _as_of(request: StateQueryRequest, as_of: Any) -> StateQueryRequest:
    """``"as_of"``: a batch id, or a time as ISO 8601 text (without an offset: local)."""
    expected = "expected a batch id (an int >= 0) or an ISO 8601 time, got"
    if isinstance(as_of, str):
        try:
            when = dt.datetime.fromisoformat(as_of)
        except ValueError as exc:
            raise field_error("as_of", f"{expected} {as_of!r} ({exc})") from None
        problem = instant_problem(when)
        if problem is not None:
            raise field_error("as_of", problem)
        return request.as_of_time(when)
    try:
        return request.as_of(as_of)
    except (TypeError, ValueError) as exc:
        raise field_error("as_of", f"{expected} {as_of!r} ({exc})") from None


#: How many acknowledged records one ``"after"`` may name (a producer's batch, not a log).
MAX_AFTER_RECORDS = 10_000


def bound_from_json(doc: dict[str, Any]) -> PositionBound | None:
    """The bound of a request body: ``"bound"`` (a position token) and ``"after"`` (the
    records a producer sent: ``[{"topic", "partition", "offset"}]``, see
    :meth:`PositionBound.after`), both when both are given; None when neither is."""
    bound = None
    token = doc.get("bound")
    if token is not None:
        bound = PositionBound.at(position_from_token(token))
    after = doc.get("after")
    if after is None:
        return bound
    shape = 'expected [{"topic": ..., "partition": ..., "offset": ...}, ...], the records sent'
    if isinstance(after, dict):
        after = [after]
    if not isinstance(after, list) or not after:
        raise field_error("after", f"{shape}; got {_shown(after)}")
    if len(after) > MAX_AFTER_RECORDS:
        raise field_error(
            "after",
            f"names {len(after)} records; at most {MAX_AFTER_RECORDS} (the highest "
            "offset of each partition is enough)",
        )
    acks = []
    for index, record in enumerate(after):
        if not isinstance(record, dict) or set(record) != {"topic", "partition", "offset"}:
            raise field_error(f"after[{index}]", f"{shape}; got {_shown(record)}")
        acks.append((record["topic"], record["partition"], record["offset"]))
    try:
        produced = PositionBound.after(*acks)
    except (TypeError, ValueError) as exc:
        raise field_error("after", str(exc)) from None
    return produced if bound is None else bound.merge(produced)


def position_from_token(token: Any, field: str = "bound") -> Position:
    if not isinstance(token, str):
        raise field_error(field, f"expected a position token string, got {_shown(token)}")
    try:
        return Position.from_token(token)
    except (TypeError, ValueError) as exc:
        raise field_error(field, f"not a valid position token: {exc}") from None
