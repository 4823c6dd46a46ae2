"""SQL results as Arrow IPC streams over a real HTTP server on 127.0.0.1 (``POST /query`` with
``Accept: application/vnd.apache.arrow.stream``) and through ``Client.sql(format="arrow")``.

The ground truth is ``Node.sql`` on the same node: every column keeps its Spark type's Arrow
type and every value equals the row ``Node.sql`` gives.
"""

from __future__ import annotations

import datetime as dt
import http.server
import math
import re
import socket
import threading
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import orjson
import pyarrow as pa
import pytest

from sparkiq import AuthenticationError, Client, Node, Position, SparkiqError
from sparkiq.schema.arrowtypes import arrow_type
from sparkiq.schema.kinds import KINDS
from sparkiq.sql import SqlResult
from sparkiq.sql.errors import SqlError
from sparkiq.wire import arrowipc
from tests import http_calls
from tests.changelog.helpers import create_changelog, write_rows
from tests.sql.tables import build_world
from tests.sql.test_differential import QUERIES

TOKEN = "arrow-secret"
ARROW = arrowipc.CONTENT_TYPE
JSON = "application/json"
BIG_ROWS = 100_000

# One column of every Spark type the schema knows (KINDS), nested ones holding others.
_FIELD = {"nullable": True, "metadata": {}}
EVERY_COLUMNS: list[tuple[str, Any]] = [
    ("k", "string"),
    ("b", "binary"),
    ("flag", "boolean"),
    ("i8", "byte"),
    ("i16", "short"),
    ("i32", "integer"),
    ("i64", "long"),
    ("f32", "float"),
    ("f64", "double"),
    ("day", "date"),
    ("ts", "timestamp"),
    ("ntz", "timestamp_ntz"),
    ("price", "decimal(12,2)"),
    ("nothing", "void"),
    (
        "st",
        {
            "type": "struct",
            "fields": [
                {"name": "a", "type": "integer", **_FIELD},
                {"name": "t", "type": "timestamp", **_FIELD},
            ],
        },
    ),
    ("arr", {"type": "array", "elementType": "decimal(5,1)", "containsNull": True}),
    ("m", {"type": "map", "keyType": "string", "valueType": "date", "valueContainsNull": True}),
]


def _every_row(i: int) -> dict[str, Any]:
    """Row ``i``; every fifth value of each column (but the key) is null."""
    row: dict[str, Any] = {
        "k": f"e{i:03d}",
        "b": bytes([i % 256, 255 - i % 256]),
        "flag": i % 2 == 0,
        "i8": i % 256 - 128,
        "i16": (i * 911) % 65_536 - 32_768,
        "i32": i * 100_003 - 2**31 + 7,
        "i64": i * 2**40 - 2**62,
        "f32": i * 1.5 - 40.25,
        "f64": i / 7,
        "day": dt.date(1969, 12, 25) + dt.timedelta(days=i * 37),
        "ts": dt.datetime(2024, 3, 1, 12) + dt.timedelta(hours=i * 11, microseconds=i),
        "ntz": dt.datetime(1999, 12, 31, 23, 59) + dt.timedelta(minutes=i * 13),
        "price": Decimal(f"{i * 37 - 500}.{i % 100:02d}"),
        "nothing": None,
        "st": {"a": i, "t": dt.datetime(2020, 1, 1) + dt.timedelta(days=i)},
        "arr": [Decimal(f"{i}.5"), None, Decimal("-0.1")][: i % 4],
        "m": {f"m{j}": dt.date(2024, 1, 1 + j) for j in range(i % 3)},
    }
    for n, name in enumerate(row):
        if name != "k" and (i + n) % 5 == 0:
            row[name] = None
    return row


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    root = str(tmp_path_factory.mktemp("arrow"))
    build_world(root)
    doc = {"type": "struct", "fields": [{"name": n, "type": t, **_FIELD} for n, t in EVERY_COLUMNS]}
    every = create_changelog(root, "every", doc, ["k"], partitions=3)
    write_rows(every, 0, {f"e{i:03d}": _every_row(i) for i in range(120)})
    big_doc = {
        "type": "struct",
        "fields": [
            {"name": "id", "type": "long", **_FIELD},
            {"name": "name", "type": "string", **_FIELD},
            {"name": "score", "type": "double", **_FIELD},
            {"name": "amount", "type": "decimal(10,2)", **_FIELD},
            {"name": "seen", "type": "timestamp", **_FIELD},
        ],
    }
    big = create_changelog(root, "big", big_doc, ["id"], partitions=4)
    start = dt.datetime(2025, 1, 1)
    rows = {
        i: {
            "id": i,
            "name": f"name-{i}",
            "score": i / 3,
            "amount": Decimal(i % 100_000) / 100,
            "seen": start + dt.timedelta(seconds=i),
        }
        for i in range(BIG_ROWS)
    }
    write_rows(big, 0, rows)
    with Node(root, store="memory", node_id="arrow", token=TOKEN, listen="127.0.0.1:0") as n:
        n.poll_once()
        yield n


@pytest.fixture(scope="module")
def client(node: Node) -> Iterator[Client]:
    with Client(node.url, token=TOKEN) as c:
        yield c


def _post(node: Node, sql: str, token: str | None = TOKEN, **doc: Any) -> httpx.Response:
    headers = {"accept": ARROW, "content-type": "application/json"}
    if token is not None:
        headers["authorization"] = f"Bearer {token}"
    return http_calls.post(
        f"{node.url}/query",
        content=orjson.dumps({"sql": sql, **doc}),
        headers=headers,
        timeout=60,
    )


def _normal(value: Any) -> Any:
    """Floats to 12 significant digits (DuckDB's parallel aggregates differ in the last bits
    from one run to the next), containers element by element."""
    if isinstance(value, float):
        return value if math.isnan(value) else float(f"{value:.12g}")
    if isinstance(value, dict):
        return {k: _normal(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_normal(v) for v in value]
    return value


def _rows(rows: list[dict[str, Any]], ordered: bool) -> list[Any]:
    out = [_normal(r) for r in rows]
    return out if ordered else sorted(out, key=repr)


# -- every type ------------------------------------------------------------------------------


def test_every_spark_type_arrives_with_its_arrow_type_and_node_sql_values(node: Node) -> None:
    response = _post(node, "SELECT * FROM every ORDER BY k")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == ARROW
    table = arrowipc.read_table(response.content)
    expected = node.sql("SELECT * FROM every ORDER BY k")
    schema = node.schema("every")
    assert table.column_names == expected.columns
    for f in schema.fields:
        assert table.schema.field(f.name).type == arrow_type(f.type, timestamp_tz=None), f.name
    # the names of every kind are exercised, scalar and nested
    assert {KINDS[f.type.name].name for f in schema.fields} == set(KINDS)
    assert table.schema.field("i8").type == pa.int8()
    assert table.schema.field("f32").type == pa.float32()
    assert table.schema.field("price").type == pa.decimal128(12, 2)
    assert table.schema.field("ts").type == pa.timestamp("us")
    assert pa.types.is_map(table.schema.field("m").type)
    assert arrowipc.table_rows(table) == expected.rows
    assert table.num_rows == 120
    assert Position.from_token(response.headers[arrowipc.POSITION_HEADER]) == expected.position


def test_client_to_arrow_and_rows_equal_node_sql(node: Node, client: Client) -> None:
    for sql in (
        "SELECT * FROM every ORDER BY k",
        "SELECT * FROM every WHERE k = 'e007'",  # the key-lookup path, no DuckDB
        "SELECT m, st, arr, b FROM every WHERE k IN ('e001', 'e002', 'e004')",
    ):
        expected = node.sql(sql)
        result = client.sql(sql, format="arrow")
        assert isinstance(result, SqlResult)
        assert result.columns == expected.columns
        assert result.to_arrow().num_rows == len(expected.rows)
        assert _rows(result.rows, False) == _rows(expected.rows, False)
        assert result.position == expected.position
        assert result.tuples() == [tuple(r.get(c) for c in result.columns) for r in result.rows]
    frame = client.sql("SELECT * FROM every ORDER BY k", format="arrow").to_pandas()
    assert list(frame.columns) == [name for name, _ in EVERY_COLUMNS]
    assert str(frame["ts"].dtype) == "datetime64[us]"
    assert str(frame["f32"].dtype) == "float32"
    first = frame.iloc[1]
    assert first["price"] == _every_row(1)["price"]
    assert first["m"] == _every_row(1)["m"]
    # the default stays rows, fetched as before
    rows = client.sql("SELECT * FROM every ORDER BY k")
    assert rows.rows == node.sql("SELECT * FROM every ORDER BY k").rows


@pytest.mark.parametrize(("sql", "ordered"), QUERIES, ids=[q for q, _ in QUERIES])
def test_the_differential_statements_give_node_sql_rows(
    node: Node, client: Client, sql: str, ordered: bool
) -> None:
    expected = node.sql(sql)
    result = client.sql(sql, format="arrow")
    assert result.columns == expected.columns
    assert _rows(result.rows, ordered) == _rows(expected.rows, ordered)


def test_computed_columns_take_the_type_duckdb_computes(node: Node, client: Client) -> None:
    """A column computed into another type under a table column's name has the computed
    type, never the column's: Arrow would otherwise truncate (1.5 into int8) or lose digits
    silently."""
    sql = (
        "SELECT k, i8 * 1000 AS i8, f64 AS f32, CAST(day AS VARCHAR) AS day, "
        "i32 / 2 AS i32, {'zz': i8} AS st, i64 > 0 AS i64 FROM every ORDER BY k"
    )
    expected = node.sql(sql)
    table = client.sql(sql, format="arrow").to_arrow()
    types = {f.name: f.type for f in table.schema}
    assert types["i8"] == pa.int32()  # TINYINT * INTEGER
    assert types["f32"] == pa.float64()
    assert types["day"] == pa.string()
    assert types["i32"] == pa.float64()
    assert pa.types.is_struct(types["st"]) and types["st"].names == ["zz"]
    assert types["i64"] == pa.bool_()
    assert arrowipc.table_rows(table) == expected.rows
    aggregate = client.sql(
        "SELECT count(*) AS n, sum(price) AS total, avg(f32) AS mean FROM every", format="arrow"
    )
    assert (
        aggregate.rows
        == node.sql("SELECT count(*) AS n, sum(price) AS total, avg(f32) AS mean FROM every").rows
    )


def test_explain_and_empty_results(node: Node, client: Client) -> None:
    plan = client.sql("EXPLAIN SELECT * FROM big WHERE score > 3", format="arrow")
    assert plan.columns == ["property", "value"]
    assert plan.rows == node.sql("EXPLAIN SELECT * FROM big WHERE score > 3").rows
    empty = client.sql("SELECT * FROM every WHERE i8 > 1000", format="arrow")
    assert empty.rows == [] and len(empty) == 0
    assert empty.to_arrow().schema.field("price").type == pa.decimal128(12, 2)


# -- large results ---------------------------------------------------------------------------


def test_a_100k_row_result_streams_in_record_batches(node: Node, client: Client) -> None:
    sql = "SELECT * FROM big"
    with http_calls.stream(
        "POST",
        f"{node.url}/query",
        content=orjson.dumps({"sql": sql}),
        headers={"accept": ARROW, "authorization": f"Bearer {TOKEN}", "content-type": JSON},
        timeout=60,
    ) as response:
        assert response.status_code == 200
        assert "content-length" not in response.headers  # written as it is produced
        reader = pa.ipc.open_stream(_ResponseFile(response.iter_raw()))
        batches = list(reader)
    assert len(batches) == math.ceil(BIG_ROWS / arrowipc.ROWS_PER_BATCH) >= 6
    assert all(b.num_rows <= arrowipc.ROWS_PER_BATCH for b in batches)
    table = pa.Table.from_batches(batches)
    assert table.num_rows == BIG_ROWS
    assert table.schema.field("amount").type == pa.decimal128(10, 2)
    ids = table.column("id").to_pylist()
    assert sorted(ids) == list(range(BIG_ROWS))
    # spot-check values against what was written, not only against Node.sql
    by_id = {r["id"]: r for r in table.slice(0, 2000).to_pylist()}
    for i, row in by_id.items():
        assert row["name"] == f"name-{i}" and row["score"] == i / 3
        assert row["amount"] == Decimal(i % 100_000) / 100
        assert row["seen"] == dt.datetime(2025, 1, 1) + dt.timedelta(seconds=i)
    via_client = client.sql(sql, format="arrow").to_arrow()
    assert via_client.sort_by("id").equals(table.sort_by("id"))


def test_the_stream_is_produced_piece_by_piece() -> None:
    """No piece of the response holds the whole result: the schema and each record batch
    are handed to the server as they are written."""
    table = pa.table({"id": pa.array(range(BIG_ROWS), pa.int64())})
    pieces = list(arrowipc.ipc_chunks(table, rows_per_batch=10_000))
    assert len(pieces) == 11  # 10 batches (the first with the schema) + end of stream
    assert max(len(p) for p in pieces) < 100_000 < table.nbytes * 1.1
    assert arrowipc.read_table(b"".join(pieces)).equals(table)
    closed = arrowipc.ipc_chunks(table, rows_per_batch=10_000)
    next(closed)
    closed.close()  # a client that went away: the generator stops, nothing else runs


def test_pages_carry_their_token_in_a_header(node: Node, client: Client) -> None:
    sql = "SELECT id, name FROM big WHERE id < 2500 ORDER BY id"
    seen: list[int] = []
    token: str | None = None
    pages = 0
    while True:
        options: dict[str, Any] = {"page_size": 1000}
        if token is not None:
            options["page_token"] = token
        response = _post(node, sql, **options)
        assert response.status_code == 200, response.text
        seen += arrowipc.read_table(response.content).column("id").to_pylist()
        token = response.headers.get(arrowipc.PAGE_TOKEN_HEADER)
        pages += 1
        if token is None:
            break
    assert pages == 3 and seen == list(range(2500))
    first = client.sql(sql, format="arrow", page_size=1000)
    assert first.next_page_token is not None and len(first) == 1000


# -- errors and authentication ---------------------------------------------------------------


def test_errors_stay_json_with_their_status(node: Node, client: Client) -> None:
    cases = [
        ("SELECT * FROM nope", 400, "unknown_table"),
        ("SELEC * FROM every", 400, "syntax"),
        ("SELECT nope FROM every", 400, "unknown_column"),
    ]
    for sql, status, code in cases:
        response = _post(node, sql)
        assert response.status_code == status, (sql, response.text)
        assert response.headers["content-type"] == "application/json"
        assert response.json()["error"]["code"] == code
        with pytest.raises(SqlError) as raised:
            client.sql(sql, format="arrow")
        assert raised.value.code == code
    response = _post(node, "SELECT * FROM every EMIT CHANGES")
    assert response.status_code == 406
    error = response.json()["error"]
    assert error["code"] == "not_acceptable" and error["field"] == "accept"
    assert "newline-delimited JSON" in error["message"]
    response = http_calls.post(
        f"{node.url}/query",
        content=b"{not json",
        headers={"accept": ARROW, "authorization": f"Bearer {TOKEN}", "content-type": JSON},
    )
    assert response.status_code == 400 and response.json()["error"]["code"] == "malformed_json"
    with pytest.raises(ValueError, match="format must be 'rows' or 'arrow'"):
        client.sql("SELECT 1", format="parquet")


def test_a_result_over_the_row_limit_is_refused_before_any_byte(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = str(tmp_path)
    build_world(root)
    monkeypatch.setenv("SPARKIQ_SQL_MAX_RESULT_ROWS", "50")
    with Node(root, store="memory", node_id="small", listen="127.0.0.1:0") as small:
        small.poll_once()
        response = http_calls.post(
            f"{small.url}/query", json={"sql": "SELECT * FROM t"}, headers={"accept": ARROW}
        )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "too_many_rows"


def test_the_arrow_path_needs_the_token(node: Node) -> None:
    for token in (None, "wrong"):
        response = _post(node, "SELECT * FROM every", token=token)
        assert response.status_code == 401
        assert response.headers["content-type"] == "application/json"
        assert response.json()["error"]["code"] == "unauthorized"
        assert b"e001" not in response.content
    with Client(node.url, token="wrong") as wrong, pytest.raises(AuthenticationError):
        wrong.sql("SELECT * FROM every", format="arrow")


def test_openapi_documents_the_arrow_answer(node: Node) -> None:
    post = http_calls.get(f"{node.url}/openapi.json").json()["paths"]["/query"]["post"]
    answer = post["responses"]["200"]
    assert set(answer["content"]) == {"application/json", ARROW, "application/x-ndjson"}
    assert set(answer["headers"]) == {arrowipc.POSITION_HEADER, arrowipc.PAGE_TOKEN_HEADER}
    assert post["responses"]["406"]["description"].startswith("The Accept header")
    assert [p["name"] for p in post["parameters"]] == ["accept"]


def test_a_node_that_answers_json_gets_a_clear_error() -> None:
    """A node from before Arrow results answers JSON whatever the Accept header says."""

    class OldNode(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["content-length"]))
            body = b'{"columns": ["a"], "rows": [{"a": 1}], "position": "p1.e30"}'
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), OldNode)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with (
            Client(f"http://127.0.0.1:{server.server_address[1]}") as old,
            pytest.raises(SparkiqError, match=r"not an Arrow stream.*format=.rows"),
        ):
            old.sql("SELECT a FROM t", format="arrow")
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


# -- clients that go away --------------------------------------------------------------------


def _completed_queries(node: Node) -> float:
    text = http_calls.get(f"{node.url}/metrics", headers={"authorization": f"Bearer {TOKEN}"}).text
    found = re.findall(r'sparkiq_http_requests_total\{route="/query",status="200"\} (\S+)', text)
    return float(found[0]) if found else 0.0


def test_a_client_that_disconnects_mid_stream_does_not_break_the_node(
    node: Node, client: Client
) -> None:
    body = orjson.dumps({"sql": "SELECT * FROM big"})
    host, port = node.url.removeprefix("http://").split(":")
    before = _completed_queries(node)
    for _ in range(3):
        with socket.create_connection((host, int(port)), timeout=120) as conn:
            conn.sendall(
                b"POST /query HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n"
                + f"accept: {ARROW}\r\nauthorization: Bearer {TOKEN}\r\n".encode()
                + f"content-length: {len(body)}\r\n\r\n".encode()
                + body
            )
            received = conn.recv(65536)
            assert received.startswith(b"HTTP/1.1 200")
        # closed after the first bytes: the node finishes (or drops) the rest on its own
    deadline = time.monotonic() + 60
    while _completed_queries(node) < before + 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _completed_queries(node) >= before + 3  # every abandoned request ended
    result = client.sql("SELECT * FROM every WHERE k = 'e003'", format="arrow")
    assert result.rows == node.sql("SELECT * FROM every WHERE k = 'e003'").rows
    assert client.sql("SELECT count(*) AS n FROM big").rows == [{"n": BIG_ROWS}]


# -- in-process results ----------------------------------------------------------------------


def test_in_process_results_keep_their_types(node: Node, client: Client) -> None:
    sql = "SELECT k, i8, price, st FROM every ORDER BY k LIMIT 3"
    result = node.sql(sql)
    table = result.to_arrow()
    assert table.column_names == ["k", "i8", "price", "st"]
    assert table.schema.field("i8").type == pa.int8()  # the column's, not inferred
    assert table.schema.equals(client.sql(sql, format="arrow").to_arrow().schema)
    assert arrowipc.table_rows(table) == result.rows
    frame = result.to_pandas()
    assert frame["k"].tolist() == [r["k"] for r in result.rows]


class _ResponseFile:
    """A read-only file over an iterator of bytes, for ``pyarrow.ipc.open_stream``."""

    closed = False

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buffer = bytearray()

    def read(self, size: int = -1) -> bytes:
        while size < 0 or len(self._buffer) < size:
            chunk = next(self._chunks, None)
            if chunk is None:
                break
            self._buffer += chunk
        if size < 0:
            size = len(self._buffer)
        out = bytes(self._buffer[:size])
        del self._buffer[:size]
        return out

    def readable(self) -> bool:
        return True
