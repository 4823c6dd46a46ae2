"""The Arrow Flight SQL endpoint through ADBC's Flight SQL driver (Go, as pandas, polars and
DuckDB's ``adbc`` readers load it) and pyarrow's own Flight client, against a live node.

Answers are compared with ``Node.sql`` (types with its Arrow schema, values with its rows)
and the catalog calls with the node's own table schemas. One node with a principals file:
``analyst`` reads every table, ``narrow`` only ``t``.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import adbc_driver_flightsql.dbapi as flightsql
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from adbc_driver_manager import Error as AdbcError
from google.protobuf import any_pb2

from sparkiq import Node
from sparkiq.server.flight.protocol import message, pack
from tests.changelog.helpers import make_table, write_batch
from tests.sql.tables import build_world

ANALYST = "analyst-token-0123456789"
NARROW = "narrow-token-0123456789"
PRINCIPALS = f"""
[principals.analyst]
tokens = ["{ANALYST}"]
tables = ["*"]

[principals.narrow]
tokens = ["{NARROW}"]
tables = ["t"]
"""


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    root = tmp_path_factory.mktemp("flight")
    build_world(str(root / "state"))
    principals = root / "principals.toml"
    principals.write_text(PRINCIPALS)
    with Node(
        str(root / "state"),
        store="memory",
        node_id="fl",
        principals=str(principals),
        flight_listen="127.0.0.1:0",
        auth_policy={"free_failures": 50},  # the wrong tokens below are not slowed
        sql_limits={"max_result_rows": 1000},
        audit_log=str(root / "audit.log"),
    ) as n:
        n.poll_once()
        yield n


def uri(node: Node) -> str:
    assert node.flight_address is not None
    return "grpc://{}:{}".format(*node.flight_address)


def connect(node: Node, user: str = "analyst", password: str = ANALYST) -> Any:
    return flightsql.connect(
        uri(node), db_kwargs={"username": user, "password": password}, autocommit=True
    )


@pytest.fixture(scope="module")
def conn(node: Node) -> Iterator[Any]:
    with connect(node) as c:
        yield c


def query(conn: Any, sql: str, parameters: Any = None) -> pa.Table:
    with conn.cursor() as cur:
        cur.execute(sql, parameters)
        table: pa.Table = cur.fetch_arrow_table()
        return table


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM ck ORDER BY region, id",
        "SELECT * FROM w ORDER BY 1",
        "SELECT region, count(*) AS n, sum(amount) AS total FROM ck GROUP BY region ORDER BY 1",
        "SELECT k, n FROM t WHERE n > 100 ORDER BY k",
    ],
)
def test_query_types_and_values_equal_node_sql(node: Node, conn: Any, sql: str) -> None:
    expected = node.sql(sql).to_arrow()
    got = query(conn, sql)
    assert got.num_rows == expected.num_rows > 0
    assert [(f.name, f.type) for f in got.schema] == [(f.name, f.type) for f in expected.schema]
    assert got.to_pylist() == expected.to_pylist()


def test_large_result_streams_in_batches(node: Node, conn: Any) -> None:
    sql = "SELECT k, n FROM t ORDER BY k"
    with conn.cursor() as cur:
        cur.execute(sql)
        reader = cur.fetch_record_batch()
        batches = list(reader)
    assert pa.Table.from_batches(batches).to_pylist() == node.sql(sql).to_arrow().to_pylist()


def test_prepared_statement_with_and_without_parameters(node: Node, conn: Any) -> None:
    expected = node.sql("SELECT * FROM ck WHERE region = 'eu' ORDER BY id").to_arrow()
    assert expected.num_rows > 1
    got = query(conn, "SELECT * FROM ck WHERE region = ? ORDER BY id", ("eu",))
    assert got.to_pylist() == expected.to_pylist()
    # one cursor, the same statement twice with other values: bound anew each time
    with conn.cursor() as cur:
        for region in ("eu", "us"):
            cur.execute("SELECT id FROM ck WHERE region = ? AND id >= ? ORDER BY id", (region, 2))
            rows = cur.fetchall()
            truth = node.sql(f"SELECT id FROM ck WHERE region = '{region}' AND id >= 2 ORDER BY id")
            assert rows == [(r["id"],) for r in truth.rows]
    # a parameter quoting a quote is a value, not SQL
    assert query(
        conn, "SELECT count(*) AS n FROM ck WHERE region = ?", ("x' OR '1'='1",)
    ).to_pylist() == [{"n": 0}]
    # parameters are bounded like statement text, before they are bound
    with pytest.raises(AdbcError, match="bytes of parameters"):
        query(conn, "SELECT count(*) AS n FROM ck WHERE region = ?", ("x" * 200_000,))
    # parameterless, prepared explicitly and run twice
    with conn.cursor() as cur:
        cur.adbc_prepare("SELECT count(*) AS n FROM t")
        for _ in range(2):
            cur.execute("SELECT count(*) AS n FROM t")
            assert cur.fetchall() == [(node.sql("SELECT count(*) AS n FROM t").rows[0]["n"],)]


def test_a_prepared_statement_reads_when_executed_not_when_prepared(tmp_path: Path) -> None:
    """Rows read at prepare time (for the schema) are never answered later: a batch
    committed in between shows in the execution."""
    changelog = make_table(str(tmp_path), "live")
    write_batch(changelog, 0, {"a": 1, "b": 2})
    with Node(str(tmp_path), store="memory", flight_listen="127.0.0.1:0") as live:
        live.poll_once()
        with connect(live, "", "") as c, c.cursor() as cur:
            cur.adbc_prepare("SELECT sum(n) AS s FROM live")
            write_batch(changelog, 1, {"c": 4})
            live.poll_once()
            cur.execute("SELECT sum(n) AS s FROM live")
            assert cur.fetchall() == [(7,)]


def test_get_objects_and_table_schema(node: Node, conn: Any) -> None:
    objects = conn.adbc_get_objects(depth="all").read_all().to_pylist()
    assert [c["catalog_name"] for c in objects] == ["sparkiq"]
    [schema] = objects[0]["catalog_db_schemas"]
    assert schema["db_schema_name"] == "public"
    tables = {t["table_name"]: t for t in schema["db_schema_tables"]}
    assert sorted(tables) == sorted(node.tables)
    for name, entry in tables.items():
        assert entry["table_type"] == "TABLE"
        columns = [c["column_name"] for c in entry["table_columns"]]
        assert columns == [f.name for f in node.schema(name).fields]
    ck = conn.adbc_get_table_schema("ck")
    truth = node.sql("SELECT * FROM ck LIMIT 1").to_arrow().schema
    assert [(f.name, f.type) for f in ck] == [(f.name, f.type) for f in truth]
    assert [f.nullable for f in ck] == [False, False, True, True]  # the key is not null
    assert conn.adbc_get_table_types() == ["TABLE"]
    info = conn.adbc_get_info()
    assert info["vendor_name"] == "sparkiq" and info["vendor_arrow_version"] == pa.__version__


def flight_client(node: Node, token: str | None = ANALYST) -> tuple[Any, Any]:
    client = flight.connect(uri(node))
    headers = [] if token is None else [(b"authorization", f"Bearer {token}".encode())]
    return client, flight.FlightCallOptions(headers=headers)


def test_catalog_commands_answer_the_protocol_schemas(node: Node) -> None:
    client, options = flight_client(node)
    command = message("CommandGetPrimaryKeys", table="ck")
    info = client.get_flight_info(flight.FlightDescriptor.for_command(pack(command)), options)
    keys = client.do_get(info.endpoints[0].ticket, options).read_all()
    assert keys.column_names == [
        "catalog_name",
        "db_schema_name",
        "table_name",
        "column_name",
        "key_name",
        "key_sequence",
    ]
    assert [(r["column_name"], r["key_sequence"]) for r in keys.to_pylist()] == [
        (c, i) for i, c in enumerate(node.schema("ck").key_columns, start=1)
    ]
    tables = message("CommandGetTables", table_name_filter_pattern="c_", include_schema=True)
    info = client.get_flight_info(flight.FlightDescriptor.for_command(pack(tables)), options)
    rows = client.do_get(info.endpoints[0].ticket, options).read_all().to_pylist()
    assert [r["table_name"] for r in rows] == ["ck"]
    schema = pa.ipc.read_schema(pa.py_buffer(rows[0]["table_schema"]))
    assert schema.names == [f.name for f in node.schema("ck").fields]


def test_prepared_statement_describes_its_result_and_parameters(node: Node) -> None:
    client, options = flight_client(node)
    sql = "SELECT id, amount FROM ck WHERE region = ? AND id >= ? AND upper(region) <> ? LIMIT ?"
    request = message("ActionCreatePreparedStatementRequest", query=sql)
    [answer] = client.do_action(flight.Action("CreatePreparedStatement", pack(request)), options)
    any_ = any_pb2.Any()
    any_.ParseFromString(answer.body.to_pybytes())
    result = message("ActionCreatePreparedStatementResult")
    any_.Unpack(result)
    dataset = pa.ipc.read_schema(pa.py_buffer(result.dataset_schema))
    truth = node.sql("SELECT id, amount FROM ck LIMIT 1").to_arrow().schema
    assert [(f.name, f.type) for f in dataset] == [(f.name, f.type) for f in truth]
    parameters = pa.ipc.read_schema(pa.py_buffer(result.parameter_schema))
    # region's type, id's type, a string where no column says, LIMIT's int64
    assert parameters.types == [pa.string(), pa.int32(), pa.string(), pa.int64()]
    close = message(
        "ActionClosePreparedStatementRequest",
        prepared_statement_handle=result.prepared_statement_handle,
    )
    assert (
        list(client.do_action(flight.Action("ClosePreparedStatement", pack(close)), options)) == []
    )
    run = message(
        "CommandPreparedStatementQuery", prepared_statement_handle=result.prepared_statement_handle
    )
    with pytest.raises(flight.FlightServerError, match="unknown prepared statement handle"):
        client.get_flight_info(flight.FlightDescriptor.for_command(pack(run)), options)


def test_sql_limits_apply(conn: Any) -> None:
    with pytest.raises(AdbcError, match=r"\[too_many_rows\].*max_result_rows=1000"):
        query(conn, "SELECT a.k, b.k AS k2 FROM t a, t b")  # 40,000 rows
    assert query(conn, "SELECT a.k, b.k AS k2 FROM t a, t b LIMIT 1000").num_rows == 1000


def test_writes_are_refused(conn: Any) -> None:
    with conn.cursor() as cur:
        with pytest.raises(AdbcError, match="read-only"):
            cur.adbc_statement.set_sql_query("DELETE FROM ck")
            cur.adbc_statement.execute_update()
        with pytest.raises(AdbcError, match="INSERT statements are not allowed"):
            cur.execute("INSERT INTO ck VALUES ('x', 1, 1.0, NULL)")
        with pytest.raises(AdbcError, match="read-only"):
            cur.adbc_ingest("ck", pa.table({"region": ["x"]}), mode="append")


def test_wrong_and_missing_credentials_are_unauthenticated(node: Node) -> None:
    with pytest.raises(AdbcError, match="UNAUTHENTICATED"), connect(node, password="x") as bad:
        query(bad, "SELECT 1 AS one")
    # another principal's token
    with pytest.raises(AdbcError, match="UNAUTHENTICATED"), connect(node, password=NARROW) as bad:
        query(bad, "SELECT 1 AS one")
    client, options = flight_client(node, token="wrong")
    descriptor = flight.FlightDescriptor.for_command(pack(message("CommandGetCatalogs")))
    with pytest.raises(flight.FlightUnauthenticatedError, match="wrong credentials"):
        client.get_flight_info(descriptor, options)
    client, options = flight_client(node, token=None)
    with pytest.raises(flight.FlightUnauthenticatedError, match="needs credentials"):
        client.get_flight_info(descriptor, options)
    # basic auth on the call itself, as some clients send it
    basic = base64.b64encode(f"analyst:{ANALYST}".encode())
    options = flight.FlightCallOptions(headers=[(b"authorization", b"Basic " + basic)])
    info = client.get_flight_info(descriptor, options)
    assert client.do_get(info.endpoints[0].ticket, options).read_all().to_pylist() == [
        {"catalog_name": "sparkiq"}
    ]


def test_grants_apply(node: Node) -> None:
    with connect(node, user="narrow", password=NARROW) as narrow:
        assert query(narrow, "SELECT count(*) AS n FROM t").to_pylist() == [
            {"n": node.sql("SELECT count(*) AS n FROM t").rows[0]["n"]}
        ]
        with pytest.raises(AdbcError, match="may not read 'ck'"):
            query(narrow, "SELECT * FROM ck")
        objects = narrow.adbc_get_objects(depth="tables").read_all().to_pylist()
        tables = objects[0]["catalog_db_schemas"][0]["db_schema_tables"]
        assert [t["table_name"] for t in tables] == ["t"]


def test_malformed_requests_get_clear_errors(node: Node) -> None:
    client, options = flight_client(node)
    cases = [
        (flight.FlightDescriptor.for_command(b"\xff\xfe not protobuf"), "not a protobuf Any"),
        (flight.FlightDescriptor.for_path("ck"), "send a command descriptor"),
        (
            flight.FlightDescriptor.for_command(
                pack(message("CommandStatementQuery", query="SELCT * FROM ck"))
            ),
            "syntax",
        ),
        (
            flight.FlightDescriptor.for_command(
                pack(message("CommandPreparedStatementQuery", prepared_statement_handle=b"x"))
            ),
            "unknown prepared statement handle",
        ),
    ]
    for descriptor, text in cases:
        with pytest.raises(flight.FlightServerError, match=text) as caught:
            client.get_flight_info(descriptor, options)
        assert "Traceback" not in str(caught.value)
    forged = pack(message("TicketStatementQuery", statement_handle=b"0" * 16))
    with pytest.raises(flight.FlightServerError, match="run the statement again"):
        client.do_get(flight.Ticket(forged), options).read_all()
    # a ticket is good once, and only for the principal that ran the statement
    sql = pack(message("CommandStatementQuery", query="SELECT count(*) AS n FROM t"))
    info = client.get_flight_info(flight.FlightDescriptor.for_command(sql), options)
    narrow, narrow_options = flight_client(node, NARROW)
    with pytest.raises(flight.FlightServerError, match="run the statement again"):
        narrow.do_get(info.endpoints[0].ticket, narrow_options).read_all()
    assert client.do_get(info.endpoints[0].ticket, options).read_all().num_rows == 1
    with pytest.raises(flight.FlightServerError, match="fetched already"):
        client.do_get(info.endpoints[0].ticket, options).read_all()


def test_audit_log_names_the_principal_and_tables(node: Node, conn: Any) -> None:
    query(conn, "SELECT count(*) AS n FROM xk")
    assert node.audit is not None and node.audit.path
    lines = [json.loads(line) for line in Path(node.audit.path).read_text().splitlines()]
    flight_lines = [line for line in lines if line["listener"] == "flight"]
    assert any(
        line["principal"] == "analyst" and line["tables"] == ["xk"] and line["status"] == "ok"
        for line in flight_lines
    ), flight_lines[-5:]
    assert any(line["status"] == "forbidden" for line in flight_lines)  # narrow's ck


def test_address_and_option(node: Node, tmp_path: Path) -> None:
    assert node.flight_address is not None and node.flight_address[1] > 0
    from sparkiq.serving.config import NodeConfig

    config = NodeConfig.resolve(str(tmp_path), environ={"SPARKIQ_FLIGHT_LISTEN": "0.0.0.0:0"})
    assert config.flight_listen == "0.0.0.0:0"
