"""REST JSON: requests of every query type are parsed by the key columns' Spark types, rows are
rendered for people, and every mistake is an InvalidQueryError naming its field."""

from __future__ import annotations

import base64
import datetime as dt
from decimal import Decimal
from typing import Any

import orjson
import pytest

from sparkiq import (
    InvalidQueryError,
    KeyQuery,
    Position,
    PositionBound,
    RangeQuery,
    ResultOrder,
    StateQueryRequest,
    WindowKeyQuery,
    WindowRangeQuery,
)
from sparkiq.schema.types import TableSchema
from sparkiq.wire.jsonapi import dumps, key_from_json, key_from_text, request_from_json


def schema(keys: list[tuple[str, str]], window: bool = False) -> TableSchema:
    fields = [{"name": n, "type": t, "nullable": True, "metadata": {}} for n, t in keys]
    if window:
        fields.append(
            {
                "name": "window",
                "type": {
                    "type": "struct",
                    "fields": [
                        {"name": "start", "type": "timestamp", "nullable": True, "metadata": {}},
                        {"name": "end", "type": "timestamp", "nullable": True, "metadata": {}},
                    ],
                },
                "nullable": True,
                "metadata": {},
            }
        )
    fields.append({"name": "v", "type": "long", "nullable": True, "metadata": {}})
    doc = {"type": "struct", "fields": fields}
    return TableSchema.from_spark_json(doc, [n for n, _ in keys], "window" if window else None)


STRING = schema([("k", "string")])
COMPOSITE = schema([("region", "string"), ("day", "date"), ("id", "long")])
WINDOWED = schema([("k", "string")], window=True)


def parse(table: TableSchema, body: Any) -> StateQueryRequest:
    return request_from_json("t", table, orjson.dumps(body))


T0 = dt.datetime(2024, 5, 1, 10, 0)


@pytest.mark.parametrize(
    ("table", "body", "query"),
    [
        (STRING, {"query": {"type": "key", "key": "p-1"}}, KeyQuery.with_key("p-1")),
        (
            COMPOSITE,
            {"query": {"type": "key", "key": ["eu", "2024-05-01", "7"]}},
            KeyQuery.with_key(("eu", dt.date(2024, 5, 1), 7)),
        ),
        (
            STRING,
            {"query": {"type": "range", "lower": "a", "upper": "c", "order": "descending"}},
            RangeQuery.with_range("a", "c").with_result_order(ResultOrder.DESCENDING),
        ),
        (STRING, {"query": {"type": "range", "lower": "a"}}, RangeQuery.with_lower_bound("a")),
        (STRING, {"query": {"type": "range", "upper": "c"}}, RangeQuery.with_upper_bound("c")),
        (STRING, {"query": {"type": "range"}}, RangeQuery.with_no_bounds()),
        (
            WINDOWED,
            {"query": {"type": "window_key", "key": "p", "from": "2024-05-01T10:00:00"}},
            WindowKeyQuery.with_key_and_window_starts("p", T0, None),
        ),
        (
            WINDOWED,
            {"query": {"type": "window_range", "to": "2024-05-01T10:00:00+02:00"}},
            WindowRangeQuery.with_window_starts(
                None, dt.datetime(2024, 5, 1, 10, tzinfo=dt.timezone(dt.timedelta(hours=2)))
            ),
        ),
    ],
)
def test_every_query_type_parses_to_the_in_process_query(
    table: TableSchema, body: Any, query: Any
) -> None:
    assert parse(table, body) == StateQueryRequest.in_store("t").with_query(query)


def test_request_options_parse() -> None:
    position = Position.from_map({"t": {0: 3}})
    request = parse(
        STRING,
        {
            "query": {"type": "key", "key": "a"},
            "partitions": [2, 0],
            "bound": position.to_token(),
            "require_active": True,
            "execution_info": True,
        },
    )
    assert request == (
        StateQueryRequest.in_store("t")
        .with_query(KeyQuery.with_key("a"))
        .with_partitions({0, 2})
        .with_position_bound(PositionBound.at(position))
        .require_active()
        .enable_execution_info()
    )


@pytest.mark.parametrize(
    ("type_name", "json_value", "expected"),
    [
        ("string", "x", "x"),
        ("integer", 5, 5),
        ("integer", "-5", -5),
        ("long", "+9223372036854775807", 2**63 - 1),
        ("short", 3, 3),
        ("byte", -1, -1),
        ("double", 1, 1.0),
        ("double", "2.5", 2.5),
        ("float", 0.5, 0.5),
        ("boolean", True, True),
        ("boolean", "FALSE", False),
        ("date", "2024-02-29", dt.date(2024, 2, 29)),
        ("timestamp", "2024-05-01T10:00:00", T0),
        ("timestamp_ntz", "2024-05-01T10:00:00", T0),
        ("decimal(10,2)", "12.50", Decimal("12.50")),
        ("decimal(10,2)", 3, Decimal(3)),
        ("decimal(10,2)", 0.1, Decimal("0.1")),
        ("binary", base64.b64encode(b"\x00\xff").decode(), b"\x00\xff"),
        ("string", None, None),
    ],
)
def test_keys_are_converted_by_the_key_columns_spark_type(
    type_name: str, json_value: Any, expected: Any
) -> None:
    got = key_from_json(schema([("k", type_name)]), json_value)
    assert got == expected and type(got) is type(expected)


@pytest.mark.parametrize(
    ("type_name", "json_value", "message"),
    [
        ("integer", 1.5, "expected a int value"),
        ("integer", True, "expected a int value"),
        ("integer", "1e3", "expected a int value"),
        ("double", "abc", "not a valid double"),
        ("boolean", "yes", "expected a boolean value"),
        ("date", "2024-13-01", "not a valid date"),
        ("date", 20240101, "as an ISO date string"),
        ("timestamp_ntz", "2024-05-01T10:00:00+02:00", "no time zone"),
        ("decimal(10,2)", "twelve", "not a valid decimal(10,2)"),
        ("decimal(10,2)", True, "as a string like '12.50'"),
        ("binary", "***", "not a valid binary"),
        ("string", 5, "expected a string value"),
    ],
)
def test_bad_keys_name_the_field_and_say_what_to_send(
    type_name: str, json_value: Any, message: str
) -> None:
    with pytest.raises(InvalidQueryError) as caught:
        parse(schema([("k", type_name)]), {"query": {"type": "key", "key": json_value}})
    assert caught.value.field == "query.key"  # type: ignore[attr-defined]
    assert message in str(caught.value), str(caught.value)


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        (b"{not json", "body", "malformed JSON"),
        (b"[1]", "body", "expected a JSON object"),
        (b'{"query": {"type": "key", "key": "a"}, "limit": 3}', "limit", "unknown field"),
        (b'{"query": 5}', "query", "expected an object"),
        (b'{"query": {"type": "CountQuery"}}', "query.type", "expected one of"),
        (b'{"query": {"type": "key"}}', "query.key", "needs a key"),
        (b'{"query": {"type": "window_key"}}', "query.key", "needs a key"),
        (b'{"query": {"type": "range", "order": "up"}}', "query.order", "expected one of"),
        (b'{"query": {"type": "window_range", "from": 5}}', "query.from", "ISO timestamp"),
        (b'{"query": {"type": "window_range", "to": "noon"}}', "query.to", "noon"),
        (b'{"query": {"type": "range"}, "partitions": [true]}', "partitions", "JSON array"),
        (b'{"query": {"type": "range"}, "partitions": 1}', "partitions", "JSON array"),
        (b'{"query": {"type": "range"}, "bound": "nope"}', "bound", "not a valid position"),
        (b'{"query": {"type": "range"}, "bound": 1}', "bound", "token string"),
    ],
)
def test_malformed_bodies_name_the_offending_field(body: bytes, field: str, message: str) -> None:
    with pytest.raises(InvalidQueryError) as caught:
        request_from_json("t", WINDOWED, body)
    assert caught.value.field == field  # type: ignore[attr-defined]
    assert message in str(caught.value), str(caught.value)


def test_composite_keys_need_an_array_of_every_column() -> None:
    for bad in ["eu", ["eu", "2024-05-01"], {"region": "eu"}]:
        with pytest.raises(InvalidQueryError, match=r"pass a JSON array of 3 values") as caught:
            key_from_json(COMPOSITE, bad)
        assert caught.value.field == "key"  # type: ignore[attr-defined]
    with pytest.raises(InvalidQueryError) as element:
        key_from_json(COMPOSITE, ["eu", "someday", 1])
    assert element.value.field == "key[1]"  # type: ignore[attr-defined]


def test_keys_from_url_text() -> None:
    assert key_from_text(schema([("k", "long")]), "42") == 42
    assert key_from_text(COMPOSITE, '["eu", "2024-05-01", 7]') == ("eu", dt.date(2024, 5, 1), 7)
    with pytest.raises(InvalidQueryError, match="URL-encoded"):
        key_from_text(COMPOSITE, "eu,2024-05-01,7")


def test_rows_render_for_people_without_losing_precision() -> None:
    row = {
        "k": "a",
        "day": dt.date(2024, 5, 1),
        "ts": T0,
        "amount": Decimal("12345678901234567890.12"),
        "raw": bytearray(b"\x00\xff"),
        "tags": ["x"],
        "counts": {1: 2},
        "none": None,
    }
    assert orjson.loads(dumps(row)) == {
        "k": "a",
        "day": "2024-05-01",
        "ts": "2024-05-01T10:00:00",
        "amount": "12345678901234567890.12",
        "raw": "AP8=",
        "tags": ["x"],
        "counts": {"1": 2},
        "none": None,
    }
    with pytest.raises(TypeError, match="not JSON serializable"):
        dumps({"x": object()})
