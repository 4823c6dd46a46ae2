"""The binary node protocol: requests of every query type and results of every kind make the
round trip exactly, through a byte stream cut anywhere; malformed requests and frames give a
clear error naming what is wrong, never a crash and never a wrong answer."""

from __future__ import annotations

import dataclasses
import datetime as dt
import struct
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from sparkiq import (
    FailureReason,
    InvalidQueryError,
    KeyQuery,
    NodeUnreachableError,
    Position,
    PositionBound,
    Query,
    QueryResult,
    RangeQuery,
    ResultOrder,
    RowIterator,
    StateQueryRequest,
    StateQueryResult,
    WindowKeyQuery,
    WindowRangeQuery,
)
from sparkiq.sql import SqlFragmentQuery
from sparkiq.wire.protocol import (
    PROTOCOL_VERSION,
    ROWS_PER_FRAME,
    RemoteError,
    decode_request,
    encode_request,
    error_frame,
    read_frames,
    result_frames,
    results_from_frames,
)
from sparkiq.wire.values import pack

T0 = dt.datetime(2024, 1, 1, 12, 0)
POSITION = Position.from_map({"t": {0: 7, 3: 9}, "kafka-orders": {1: 120}})

QUERIES: list[Query] = [
    KeyQuery.with_key("p-17"),
    KeyQuery.with_key(("eu", 42, dt.date(2024, 1, 3))),
    KeyQuery.with_key(Decimal("12.50")),
    KeyQuery.with_key(None),
    RangeQuery.with_range(10, 20),
    RangeQuery.with_lower_bound(dt.datetime(2024, 1, 1, tzinfo=dt.UTC)),
    RangeQuery.with_upper_bound(b"\x00\xff"),
    RangeQuery.with_no_bounds().with_result_order(ResultOrder.DESCENDING),
    RangeQuery.with_range(None, None),
    WindowKeyQuery.with_key("p-1"),
    WindowKeyQuery.with_key_and_window_starts("p-1", T0, T0 + dt.timedelta(minutes=5)),
    WindowRangeQuery.with_window_starts(None, T0),
    WindowRangeQuery(),
    SqlFragmentQuery(columns=("k", "n"), sql="SELECT k FROM __sq_part", lower=b"\x01", upper=None),
    SqlFragmentQuery(
        ("k", "n"), None, None, None, 5, 9, keys=(b"\x01a\x00\x01", b"\x00"), key_partitions=(3, 0)
    ),
]


@pytest.mark.parametrize("query", QUERIES, ids=lambda q: type(q).__name__)
def test_requests_of_every_query_type_round_trip(query: Query) -> None:
    request = StateQueryRequest.in_store("sales").with_query(query)
    decoded, local = decode_request(encode_request(request))
    assert decoded == request and type(decoded.query) is type(query)
    assert local is False


def test_every_request_option_round_trips() -> None:
    request = (
        StateQueryRequest.in_store("sales")
        .with_query(KeyQuery.with_key(("a", 1)))
        .with_partitions({3, 1})
        .with_position_bound(PositionBound.at(POSITION))
        .require_active()
        .enable_execution_info()
    )
    decoded, local = decode_request(encode_request(request, local=True))
    assert decoded == request
    assert decoded.partitions == frozenset({1, 3})
    assert decoded.bound.position == POSITION
    assert local is True


def frames_of(results: dict[int, QueryResult[Any]], cut: int) -> Iterator[bytes]:
    """The response's bytes in chunks of ``cut`` bytes, as HTTP may deliver them."""
    data = b"".join(result_frames(StateQueryResult(results)))
    return (data[i : i + cut] for i in range(0, len(data), cut))


def rows(n: int) -> list[tuple[Any, dict[str, Any]]]:
    return [
        ((f"k{i:05d}", T0 + dt.timedelta(minutes=i)), {"k": f"k{i:05d}", "n": i, "d": Decimal(i)})
        for i in range(n)
    ]


@pytest.mark.parametrize("cut", [1, 7, 4096, 1 << 30])
def test_results_of_every_kind_round_trip_through_a_stream_cut_anywhere(cut: int) -> None:
    big = rows(ROWS_PER_FRAME * 2 + 3)  # three frames of rows
    arrow = pa.table({"k": ["a", "b"], "n": [1, None]})
    sent: dict[int, QueryResult[Any]] = {
        0: QueryResult.for_result({"k": "a", "when": T0, "tags": ["x"]}, POSITION, ("did it",)),
        1: QueryResult.for_result(None, POSITION),
        2: QueryResult.for_result(RowIterator(iter(big)), POSITION),
        3: QueryResult.for_result(RowIterator(iter([])), Position.empty()),
        4: QueryResult.for_result(arrow, POSITION),
        5: QueryResult.for_result(12345, POSITION),
    }
    for i, reason in enumerate(FailureReason):
        sent[10 + i] = QueryResult.for_failure(reason, f"because {reason.name}", POSITION)
    got = results_from_frames(read_frames(frames_of(sent, cut)))
    assert sorted(got) == sorted(sent)
    assert got[0].result == {"k": "a", "when": T0, "tags": ["x"]}
    assert got[0].execution_info == ("did it",) and got[0].position == POSITION
    assert got[1].is_success and got[1].result is None
    assert [(tuple(k), row) for k, row in got[2].result] == big
    assert list(got[3].result) == [] and got[3].position == Position.empty()
    assert got[4].result.equals(arrow)
    assert got[5].result == 12345
    for i, reason in enumerate(FailureReason):
        failure = got[10 + i]
        assert failure.failure_reason is reason
        assert failure.failure_message == f"because {reason.name}"
        assert failure.position == POSITION and failure.result is None


def test_the_last_partition_streams_lazily_and_closes_the_response() -> None:
    closed = []
    sent = {
        0: QueryResult.for_result(RowIterator(iter(rows(3))), POSITION),
        1: QueryResult.for_result(RowIterator(iter(rows(ROWS_PER_FRAME + 1))), POSITION),
    }
    got = results_from_frames(
        read_frames(frames_of(sent, 100)), partitions=[0, 1], on_close=lambda: closed.append(1)
    )
    assert len(list(got[0].result)) == 3
    assert closed == []  # partition 1 is still being read from the stream
    assert len(list(got[1].result)) == ROWS_PER_FRAME + 1
    assert closed == [1]


def test_a_consumer_stopping_early_closes_every_iterator_result() -> None:
    closed = []
    sent = StateQueryResult(
        {
            p: QueryResult.for_result(
                RowIterator(iter(rows(ROWS_PER_FRAME * 2)), lambda p=p: closed.append(p)),
                POSITION,
            )
            for p in range(3)
        }
    )
    stream = result_frames(sent)
    next(stream)
    stream.close()
    assert sorted(closed) == [0, 1, 2]


# -- malformed requests ------------------------------------------------------------------------


def request_doc(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "v": PROTOCOL_VERSION,
        "store": "sales",
        "query": {"type": "KeyQuery", "fields": {"key": "a"}},
        "partitions": None,
        "bound": None,
        "require_active": False,
        "info": False,
        "local": False,
    }
    return doc | changes


def refused(body: bytes) -> InvalidQueryError:
    with pytest.raises(InvalidQueryError) as caught:
        decode_request(body)
    return caught.value


def test_a_good_hand_written_request_decodes() -> None:
    request, _ = decode_request(pack(request_doc()))
    assert request == StateQueryRequest.in_store("sales").with_query(KeyQuery.with_key("a"))


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "not a sparkiq v1 message"),
        (b"\xc1\xc1", "not a sparkiq v1 message"),
        (pack([1, 2]), "unsupported protocol version None"),
        (pack(request_doc(v=2)), "unsupported protocol version 2"),
    ],
)
def test_bodies_that_are_not_v1_messages_are_refused(body: bytes, message: str) -> None:
    assert message in str(refused(body))


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"query": "KeyQuery"}, "query", "expected a map"),
        ({"query": {"type": "NoSuchQuery"}}, "query.type", "unknown query type 'NoSuchQuery'"),
        ({"query": {"type": ["KeyQuery"]}}, "query.type", "unknown query type"),
        ({"query": {"fields": {}}}, "query.type", "unknown query type None"),
        ({"query": {"type": "KeyQuery", "fields": {}}}, "query.fields", "key"),
        ({"query": {"type": "KeyQuery", "fields": {"kee": 1}}}, "query.fields", "kee"),
        ({"query": {"type": "KeyQuery", "fields": [1]}}, "query.fields", "map of field names"),
        ({"query": {"type": "KeyQuery", "fields": {1: 2}}}, "query.fields", "map of field"),
        ({"store": ""}, "store", "non-empty string"),
        ({"store": 5}, "store", "non-empty string"),
        ({"partitions": ["0"]}, "partitions", "must be ints"),
        ({"partitions": 3}, "partitions", "expected a list of partition numbers, got int"),
        ({"partitions": [1, 0, 1]}, "partitions", "partitions [1] named more than once"),
        ({"partitions": [65536]}, "partitions", "partition numbers are 0 to 65535"),
        ({"partitions": [0] * 65537}, "partitions", "65537 partitions named; a request names"),
        ({"bound": "garbage"}, "bound", "not a sparkiq position token"),
        ({"bound": 17}, "bound", "not a sparkiq position token"),
    ],
)
def test_malformed_requests_name_the_offending_field(
    changes: dict[str, Any], field: str, message: str
) -> None:
    error = refused(pack(request_doc(**changes)))
    assert error.field == field  # type: ignore[attr-defined]
    assert message in str(error), str(error)


def test_unknown_query_types_list_the_known_ones() -> None:
    error = refused(pack(request_doc(query={"type": "tests.NeverRegistered", "fields": {}})))
    for known in ["KeyQuery", "RangeQuery", "WindowKeyQuery", "WindowRangeQuery"]:
        assert known in str(error)
    assert "sparkiq.register()" in str(error)


def test_unregistered_or_stateful_query_types_cannot_be_sent() -> None:
    class Unregistered(Query):
        __slots__ = ()

    with pytest.raises(InvalidQueryError, match=r"register it .* sparkiq\.register\(\)"):
        encode_request(StateQueryRequest.in_store("t").with_query(Unregistered()))

    from sparkiq.query.registry import register_query_type

    class Stateful(Query):
        def __init__(self, n: int) -> None:
            self.n = n

    register_query_type(Stateful, "tests.wire.Stateful")
    with pytest.raises(InvalidQueryError, match="make it a frozen dataclass"):
        encode_request(StateQueryRequest.in_store("t").with_query(Stateful(1)))


def test_query_constructors_that_reject_values_give_a_field_error() -> None:
    from sparkiq.query.registry import register_query_type

    @dataclasses.dataclass(frozen=True)
    class TopN(Query):
        n: int

        def __post_init__(self) -> None:
            if self.n <= 0:
                raise ValueError(f"n must be positive, got {self.n}")

    register_query_type(TopN, "tests.wire.TopN")
    body = pack(request_doc(query={"type": "tests.wire.TopN", "fields": {"n": 0}}))
    error = refused(body)
    assert error.field == "query.fields"  # type: ignore[attr-defined]
    assert "n must be positive, got 0" in str(error)
    ok, _ = decode_request(pack(request_doc(query={"type": "tests.wire.TopN", "fields": {"n": 3}})))
    assert ok.query == TopN(3)


# -- malformed responses -----------------------------------------------------------------------


def framed(*docs: Any) -> list[bytes]:
    out = []
    for doc in docs:
        data = pack(doc)
        out.append(struct.pack(">I", len(data)) + data)
    return out


def header(**changes: Any) -> dict[str, Any]:
    return (
        {"p": 0, "ok": True, "pos": POSITION.to_token(), "info": [], "kind": "value"}
        | {"value": 1}
        | changes
    )


def test_a_refusal_frame_becomes_a_remote_error_with_code_and_field() -> None:
    with pytest.raises(RemoteError) as caught:
        results_from_frames(read_frames([error_frame("bad_request", "store: no", "store")]))
    assert (caught.value.code, caught.value.field, str(caught.value)) == (
        "bad_request",
        "store",
        "store: no",
    )


@pytest.mark.parametrize(
    "frame",
    [
        5,
        [1, 2],
        {"ok": True},
        header(p="zero"),
        header(p=True),
        header(pos="garbage"),
        header(pos=None),
        header(ok=False, reason="NO_SUCH_REASON", message="x"),
        header(ok=False, message="x"),
        header(kind="table"),
        {k: v for k, v in header().items() if k != "value"},
    ],
)
def test_malformed_header_frames_are_remote_errors(frame: Any) -> None:
    with pytest.raises(RemoteError, match="malformed"):
        results_from_frames(read_frames(framed(frame)))


@pytest.mark.parametrize(
    "after_header",
    [
        [{"p": 0, "rows": "abc"}],
        [{"p": 0, "rows": [["only a key"]]}],
        [{"p": 0}],
        ["not a frame"],
    ],
)
def test_malformed_row_frames_are_remote_errors(after_header: list[Any]) -> None:
    frames = framed(header(kind="rows"), *after_header, {"p": 0, "end": True})
    with pytest.raises(RemoteError, match="malformed rows frame"):
        results_from_frames(read_frames(frames))


def test_a_stream_that_stops_early_is_an_error_not_a_short_answer() -> None:
    """A node gone mid-answer is unreachable (callers ask another replica), never a short
    or empty answer."""
    frames = framed(header(kind="rows"), {"p": 0, "rows": [["k", {"n": 1}]]})
    with pytest.raises(NodeUnreachableError, match="ended before the partition's last row"):
        results_from_frames(read_frames(frames))
    whole = b"".join(framed(header()))
    with pytest.raises(NodeUnreachableError, match="middle of a frame"):
        list(read_frames([whole[:-1]]))


@pytest.mark.parametrize("asked", [None, [0], [0, 1], [1, 2]])
def test_a_stream_cut_between_frames_is_unreachable_not_an_empty_answer(
    asked: list[int] | None,
) -> None:
    """A connection cut between frames ends the stream cleanly; the partitions asked for
    that have no frame make it an error (the fault harness saw a key lookup come back with
    no partition at all when a partition dropped the connection after the headers)."""
    with pytest.raises(NodeUnreachableError, match="ended before the results of partitions"):
        results_from_frames(read_frames([]), asked)
    if asked is not None and len(asked) > 1:  # the first partition came, the rest did not
        first = b"".join(framed(header(p=asked[0])))
        with pytest.raises(NodeUnreachableError, match=rf"partitions \[{asked[1]}\]"):
            results_from_frames(read_frames([first]), asked)


def test_undecodable_and_oversized_frames_are_remote_errors() -> None:
    with pytest.raises(RemoteError, match="malformed response frame"):
        list(read_frames([struct.pack(">I", 2) + b"\xc1\xc1"]))
    with pytest.raises(RemoteError, match="exceeds"):
        list(read_frames([struct.pack(">I", 1 << 31)]))
