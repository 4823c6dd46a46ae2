"""The versioned key query types as values: builders, validation, and their travel on the
node protocol (queries and VersionedRecord results) and in the REST JSON."""

from __future__ import annotations

import datetime as dt

import orjson
import pytest

from sparkiq import (
    MultiVersionedKeyQuery,
    Position,
    QueryResult,
    ResultOrder,
    StateQueryRequest,
    StateQueryResult,
    VersionedKeyQuery,
    VersionedRecord,
)
from sparkiq.errors import InvalidQueryError
from sparkiq.query.registry import query_type
from sparkiq.schema.types import TableSchema
from sparkiq.wire import jsonapi
from sparkiq.wire.protocol import (
    decode_request,
    encode_request,
    read_frames,
    result_frames,
    results_from_frames,
)
from sparkiq.wire.values import pack, unpack
from tests.changelog.helpers import SCHEMA_JSON

WHEN = dt.datetime(2026, 3, 1, 12, 30, 15, 250000, tzinfo=dt.UTC)
SCHEMA = TableSchema.from_spark_json(SCHEMA_JSON, ["k"], None)


def test_builders_return_new_immutable_queries() -> None:
    base = VersionedKeyQuery.with_key("AA")
    assert base == VersionedKeyQuery("AA") and base.single_key and base.routing_key() == "AA"
    assert base.as_of(3) == VersionedKeyQuery("AA", as_of_batch=3)
    assert base.as_of(WHEN) == VersionedKeyQuery("AA", as_of_time=WHEN)
    assert base.as_of(3).as_of(WHEN).as_of_batch is None  # the last as_of wins
    multi = (
        MultiVersionedKeyQuery.with_key(("a", 1))
        .from_time(WHEN)
        .to_time(WHEN + dt.timedelta(hours=1))
        .from_batch(2)
        .to_batch(9)
        .with_descending_timestamps()
    )
    assert multi.routing_key() == ("a", 1) and multi.single_key
    assert (multi.batch_from, multi.batch_to, multi.order) == (2, 9, ResultOrder.DESCENDING)
    assert multi.with_ascending_timestamps().order is ResultOrder.ASCENDING
    assert MultiVersionedKeyQuery.with_key("a").order is ResultOrder.ANY
    assert {base, base.as_of(3)} == {VersionedKeyQuery("AA"), VersionedKeyQuery("AA", 3)}


@pytest.mark.parametrize(
    ("build", "error", "match"),
    [
        (lambda: VersionedKeyQuery.with_key("a").as_of(True), TypeError, "batch id"),
        (lambda: VersionedKeyQuery.with_key("a").as_of(1.5), TypeError, "got float 1.5"),
        (lambda: VersionedKeyQuery("a", 1, WHEN), ValueError, "a batch or a time, not both"),
        (lambda: VersionedKeyQuery("a", as_of_time="now"), TypeError, "as_of_time must be"),
        (lambda: MultiVersionedKeyQuery("a", batch_to=-2), ValueError, "batch_to must be"),
        (lambda: MultiVersionedKeyQuery("a", order="up"), TypeError, "order must be"),
        (
            lambda: MultiVersionedKeyQuery.with_key("a").from_batch(3).to_batch(1),
            ValueError,
            "the range is empty",
        ),
    ],
)
def test_bad_arguments_say_what_is_wrong(build: object, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        build()  # type: ignore[operator]


def test_the_query_types_travel_between_nodes_by_name() -> None:
    assert query_type("VersionedKeyQuery") is VersionedKeyQuery
    assert query_type("MultiVersionedKeyQuery") is MultiVersionedKeyQuery
    for query in (
        VersionedKeyQuery.with_key("AA").as_of(4),
        VersionedKeyQuery.with_key("AA").as_of(WHEN),
        VersionedKeyQuery.with_key("AA").as_of(dt.datetime(2026, 3, 1, 12, 0)),  # naive
        MultiVersionedKeyQuery.with_key(("x", 2))
        .from_time(WHEN)
        .to_batch(7)
        .with_descending_timestamps(),
    ):
        request = StateQueryRequest.in_store("t").with_query(query).as_of(9)
        decoded, local = decode_request(encode_request(request, local=True))
        assert decoded == request and local


def test_a_query_of_bad_fields_from_the_wire_names_the_field() -> None:
    body = pack(
        {
            "v": 1,
            "store": "t",
            "query": {"type": "VersionedKeyQuery", "fields": {"key": "a", "as_of_batch": -3}},
        }
    )
    with pytest.raises(InvalidQueryError, match=r"query\.fields: VersionedKeyQuery: as_of_batch"):
        decode_request(body)


def record(n: int, valid_to: int | None) -> VersionedRecord:
    return VersionedRecord(
        {"k": "a", "n": n, "at": dt.datetime(2024, 1, 1, 10, 0)},
        n,
        valid_to,
        WHEN,
        None if valid_to is None else WHEN + dt.timedelta(seconds=1),
    )


def test_records_and_lists_of_records_travel_in_result_frames() -> None:
    position = Position.from_map({"t": {0: 5}})
    results = StateQueryResult(
        {
            0: QueryResult.for_result(record(1, 3), position),
            1: QueryResult.for_result([record(1, 3), record(3, None)], position),
            2: QueryResult.for_result(None, position),
        }
    )
    frames = read_frames([b"".join(result_frames(results))])
    back = results_from_frames(frames)
    assert back[0].result == record(1, 3) and isinstance(back[0].result, VersionedRecord)
    assert back[1].result == [record(1, 3), record(3, None)]
    assert back[2].result is None and back[2].position == position
    assert unpack(pack(record(2, None))) == record(2, None)


def test_an_unknown_record_on_the_wire_is_refused() -> None:
    import msgspec

    forged = msgspec.msgpack.encode(
        msgspec.msgpack.Ext(9, msgspec.msgpack.encode(["os.system", ["echo"]]))
    )
    with pytest.raises(ValueError, match=r"unknown record 'os\.system'"):
        unpack(forged)


def test_rest_json_builds_both_queries() -> None:
    def parse(query: dict[str, object]) -> object:
        body = orjson.dumps({"query": query})
        return jsonapi.request_from_json("t", SCHEMA, body).query

    assert parse({"type": "versioned_key", "key": "a"}) == VersionedKeyQuery("a")
    assert parse({"type": "versioned_key", "key": "a", "as_of": 4}) == VersionedKeyQuery("a", 4)
    assert parse(
        {"type": "versioned_key", "key": "a", "as_of": "2026-03-01T12:30:15.25+00:00"}
    ) == VersionedKeyQuery("a", as_of_time=WHEN)
    assert parse(
        {
            "type": "multi_versioned_key",
            "key": "a",
            "from": "2026-03-01T12:30:15.25+00:00",
            "to_batch": 8,
            "order": "descending",
        }
    ) == MultiVersionedKeyQuery("a", WHEN, None, None, 8, ResultOrder.DESCENDING)
    assert jsonapi.dumps(record(1, None)) == orjson.dumps(
        {
            "value": {"k": "a", "n": 1, "at": "2024-01-01T10:00:00"},
            "valid_from": 1,
            "valid_to": None,
            "valid_from_time": "2026-03-01T12:30:15.250000+00:00",
            "valid_to_time": None,
        }
    )


@pytest.mark.parametrize(
    ("query", "field", "match"),
    [
        ({"type": "versioned_key"}, "query.key", "needs a key"),
        ({"type": "versioned_key", "key": 3}, "query.key", "string"),
        ({"type": "versioned_key", "key": "a", "as_of": -1}, "query.as_of", "batch id"),
        ({"type": "versioned_key", "key": "a", "as_of": True}, "query.as_of", "batch id"),
        ({"type": "versioned_key", "key": "a", "as_of": "soon"}, "query.as_of", "soon"),
        ({"type": "versioned_key", "key": "a", "from": "x"}, "query.from", "unknown field"),
        ({"type": "multi_versioned_key", "key": "a", "order": "up"}, "query.order", "descending"),
        ({"type": "multi_versioned_key", "key": "a", "order": []}, "query.order", "expected"),
        ({"type": "multi_versioned_key", "key": "a", "to_batch": "3"}, "query.to_batch", "batch"),
        (
            {"type": "multi_versioned_key", "key": "a", "from_batch": 4, "to_batch": 2},
            "query",
            "range is empty",
        ),
    ],
)
def test_bad_rest_json_names_the_field(query: dict[str, object], field: str, match: str) -> None:
    with pytest.raises(InvalidQueryError, match=match) as caught:
        jsonapi.request_from_json("t", SCHEMA, orjson.dumps({"query": query}))
    assert getattr(caught.value, "field", None) == field
