"""The engine's own promises: the lookup fast path, caching, threads, limits, results."""

from __future__ import annotations

import datetime as dt
import random
import threading
from decimal import Decimal
from typing import Any

import duckdb
import msgspec
import pyarrow as pa
import pytest

from sparkiq import ConfigError, Node, NodeConfig
from sparkiq.schema.arrowrows import KEY_COLUMN, ArrowRows, _flat_columns, _flat_columns_of
from sparkiq.schema.codec import RowCodec
from sparkiq.schema.types import TableSchema
from sparkiq.sql import SqlEngine, SqlLimitError, SqlLimits, SqlResult
from sparkiq.sql.parse import shape_of
from tests.changelog.helpers import WIDE_ARROW, WIDE_SCHEMA_JSON
from tests.sql.compare import assert_same, reference


def test_key_lookups_parse_once_per_shape_and_never_start_duckdb(node: Node) -> None:
    engine = SqlEngine(node)
    for i in range(1, 60):
        result = engine.execute(f"SELECT * FROM t WHERE k = 'k{i:03d}'")
        assert result.rows == ([node.get("t", f"k{i:03d}")] if node.get("t", f"k{i:03d}") else [])
    assert len(engine._by_text) == 1  # only the first statement was planned from its text
    assert getattr(engine._pool._local, "con", None) is None  # DuckDB never ran
    composite = engine.execute("SELECT amount FROM ck WHERE region = 'us' AND id = 7")
    assert composite.rows == [{"amount": Decimal("22.49")}]
    assert getattr(engine._pool._local, "con", None) is None


def test_a_star_that_excludes_or_replaces_is_left_to_duckdb(node: Node) -> None:
    """The key path projects columns itself; * EXCLUDE / REPLACE shape them, so DuckDB
    answers (the key path once returned every column for EXCLUDE)."""
    row = node.get("t", "k001")
    assert row is not None
    excluded = node.sql("SELECT * EXCLUDE (n) FROM t WHERE k = 'k001'")
    assert (excluded.columns, excluded.rows) == (["k"], [{"k": "k001"}])
    replaced = node.sql("SELECT * REPLACE (n + 1 AS n) FROM t WHERE k = 'k001'")
    assert replaced.rows == [{"k": "k001", "n": row["n"] + 1}]


def test_a_literal_the_key_cannot_take_falls_back_to_duckdb(node: Node) -> None:
    engine = SqlEngine(node)
    assert engine.execute("SELECT v FROM ik WHERE key = 1").rows == [{"v": 17}]
    # same shape, but 'x' is no integer: DuckDB decides (and refuses the comparison)
    with pytest.raises(Exception) as caught:
        engine.execute("SELECT v FROM ik WHERE key = 'x'")
    assert "x" in str(caught.value)


def test_shapes_replace_literals_only() -> None:
    assert shape_of("SELECT a1, \"x 1\" FROM t2 WHERE k = 'it''s' AND n > 5 -- 9") == (
        'SELECT a1, "x 1" FROM t2 WHERE k = :sq0 AND n > :sq1 -- 9',
        ("it's", 5),
    )
    assert shape_of("SELECT * FROM t WHERE k = 'a' AND b = 'c'") == (
        "SELECT * FROM t WHERE k = :sq0 AND b = :sq1",
        ("a", "c"),
    )
    assert shape_of("SELECT * FROM t WHERE k = ?") is None
    assert shape_of("SELECT 1.5e3")[1] == (Decimal("1.5E+3"),)  # type: ignore[index]


def test_threads_share_an_engine(node: Node) -> None:
    engine = SqlEngine(node)
    errors: list[BaseException] = []
    expected = engine.execute("SELECT tag, count(*) AS c FROM w GROUP BY tag ORDER BY c, tag").rows

    def work(seed: int) -> None:
        try:
            for i in range(15):
                key = f"k{(seed * 15 + i) % 200:03d}"
                assert engine.execute(f"SELECT n FROM t WHERE k = '{key}'").rows == (
                    [{"n": node.get("t", key)["n"]}] if node.get("t", key) else []
                )
                got = engine.execute(
                    "SELECT tag, count(*) AS c FROM w GROUP BY tag ORDER BY c, tag"
                )
                assert got.rows == expected
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []


def test_max_result_rows_stops_reading(node: Node) -> None:
    engine = SqlEngine(node, SqlLimits(max_result_rows=5, default_page_size=5, max_page_size=5))
    with pytest.raises(SqlLimitError):
        engine.execute("SELECT * FROM t WHERE n > 3")
    assert len(engine.execute("SELECT * FROM t WHERE n > 3", page_size=5).rows) == 5
    with pytest.raises(SqlLimitError):  # the Python path counts too
        engine.execute("SELECT k FROM t WHERE k IN ('k001','k002','k003','k004','k005','k006')")


def test_limits_validate_and_read_the_environment() -> None:
    with pytest.raises(ConfigError):
        SqlLimits(timeout_seconds=0)
    with pytest.raises(ConfigError):
        SqlLimits(default_page_size=20, max_page_size=10)
    env = {"SPARKIQ_SQL_MAX_RESULT_ROWS": "77", "SPARKIQ_SQL_TIMEOUT_SECONDS": "2.5"}
    limits = NodeConfig.resolve("/s", environ=env, sql_limits={"threads": 1}).sql_limits
    assert (limits.max_result_rows, limits.timeout_seconds, limits.threads) == (77, 2.5, 1)
    with pytest.raises(ConfigError, match="SPARKIQ_SQL_THREADS"):
        NodeConfig.resolve("/s", environ={"SPARKIQ_SQL_THREADS": "many"})


def test_results_are_plain_data(node: Node) -> None:
    result = node.sql("SELECT k, n FROM t WHERE k IN ('k001', 'k002') ORDER BY k")
    assert isinstance(result, SqlResult)
    assert result.tuples() == [("k001", 1), ("k002", 2)]
    doc = result.to_dict()
    assert doc["columns"] == ["k", "n"] and doc["next_page_token"] is None
    assert doc["position"].startswith("p1.")
    assert len(result) == 2


def test_stored_rows_become_arrow_as_pyspark_shows_them() -> None:
    schema = TableSchema.from_spark_json(WIDE_SCHEMA_JSON, ["k"])
    rows = [
        {
            "k": "a",
            "n": 1,
            "tag": None,
            "price": 2.5,
            "day": dt.date(2024, 2, 29),
            "info": {"a": 3, "tags": ["x", None]},
        },
        {"k": "b", "n": None, "tag": "t", "price": None, "day": None, "info": None},
    ]
    encoded = RowCodec(schema).encode_arrow(pa.Table.from_pylist(rows, schema=WIDE_ARROW))
    built = ArrowRows(schema, ["info", "k", "day"]).from_stored(encoded)
    assert built.column_names == ["info", "k", "day"]
    assert built.to_pylist() == [{"info": r["info"], "k": r["k"], "day": r["day"]} for r in rows]
    same = ArrowRows(schema, ["info", "k", "day"]).from_rows(rows)
    assert same.equals(built)


def test_windowed_answers_match_window_queries(node: Node) -> None:
    rows = node.sql(
        "SELECT k, WINDOWSTART, clicks FROM win "
        "WHERE k = 'e' AND WINDOWSTART > '2024-03-01 10:00:00'"
    ).rows
    assert [r["WINDOWSTART"].hour for r in sorted(rows, key=lambda r: r["WINDOWSTART"])] == [
        14,
        18,
        22,
    ]


SHAPES = [
    "SELECT n * 10 + {a} AS m, upper(k) AS up FROM t WHERE k = 'k{b:03d}'",
    "SELECT k, n FROM t WHERE k >= 'k{b:03d}' AND k < 'k{c:03d}' AND n > {a}",
    "SELECT * FROM ck WHERE region = 'eu' AND id BETWEEN {a} AND {c}",
    "SELECT k, tag FROM w WHERE price > {a} AND k LIKE 'w{b:02d}%'",
    "SELECT t.k, ik.v FROM t JOIN ik ON t.n = ik.key WHERE ik.key < {c}",
    "SELECT k, clicks FROM win WHERE k = 'b' AND WINDOWSTART >= '2024-03-01 0{a}:00:00'",
    "SELECT k FROM t WHERE k = 'k{b:03d}' LIMIT {a}",  # LIMIT values push down: no template
]


@pytest.mark.parametrize("shape", SHAPES)
def test_statements_of_one_shape_share_a_plan_and_answer_exactly(
    node: Node, ground: duckdb.DuckDBPyConnection, shape: str
) -> None:
    engine = SqlEngine(node)
    statements = [shape.format(a=a, b=b, c=b + 7) for a, b in [(1, 3), (2, 10), (5, 40), (9, 2)]]
    for sql in statements:
        names, rows = reference(ground, sql)
        assert_same(engine.execute(sql), names, rows, ordered=False)
    planned = len(engine._by_text)  # statements planned from their text
    assert planned == (len(statements) if "LIMIT" in shape else 1)


def test_scans_leave_the_garbage_collector_as_they_found_it(node: Node) -> None:
    import gc

    assert gc.isenabled()
    assert node.sql("SELECT count(*) AS c FROM w").rows == [{"c": 108}]
    assert gc.isenabled()
    gc.disable()
    try:
        node.sql("SELECT count(*) AS c FROM w")
        assert not gc.isenabled()
    finally:
        gc.enable()


_SCALARS = [
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
]


def _scalar_schema(extra: int) -> TableSchema:
    columns = _SCALARS + [(f"s{i}", "string") for i in range(extra)]
    fields = [{"name": n, "type": t, "nullable": True, "metadata": {}} for n, t in columns]
    return TableSchema.from_spark_json({"type": "struct", "fields": fields}, ["k"])


def _scalar_rows(schema: TableSchema, count: int) -> list[list[Any]]:
    """Stored values (as the row codec writes them) reaching every MessagePack width."""
    rng = random.Random(7)
    ints = [0, 1, 127, 128, 255, 256, 65_535, 65_536, 2**32 - 1, 2**32, 2**63 - 1]
    ints += [-1, -32, -33, -128, -129, -32_768, -32_769, -(2**31), -(2**31) - 1, -(2**63)]
    texts = ["", "a", "é" * 20, "x" * 31, "y" * 32, "z" * 255, "w" * 256, "v" * 70_000, "日本"]

    def maybe(value: Any) -> Any:
        return None if rng.random() < 0.2 else value

    rows = []
    for i in range(count):
        row = [
            f"key-{i}",
            maybe(rng.choice(texts).encode()),
            maybe(rng.random() < 0.5),
            maybe(rng.randrange(-128, 128)),
            maybe(rng.randrange(-32_768, 32_768)),
            maybe(rng.choice(ints[:5] + ints[11:15] + [2**31 - 1, -(2**31)])),
            maybe(rng.choice(ints)),
            maybe(float(rng.choice([0.5, -1.25, 3.0e38, 1.0]))),
            maybe(rng.choice([rng.random() * 1e6, -0.0, float("inf"), 1e-300])),
            maybe(rng.randrange(-719_162, 2_932_896)),  # years 1 to 9999
            maybe(rng.randrange(-(2**50), 2**52)),
            maybe(rng.randrange(-(2**50), 2**52)),
            maybe(f"{rng.randrange(-(10**9), 10**9)}.{rng.randrange(100):02d}"),
            None,
        ]
        row += [maybe(rng.choice(texts)) for _ in range(len(schema.fields) - len(row))]
        rows.append(row)
    return rows


@pytest.mark.parametrize("extra", [0, 3])  # 14 columns (fixarray), 17 (array 16)
def test_scalar_columns_are_read_in_bulk_exactly_as_decoded_rows(extra: int) -> None:
    schema = _scalar_schema(extra)
    encoded = [msgspec.msgpack.encode(row) for row in _scalar_rows(schema, 600)]
    columns = [*schema.column_names[::-1], KEY_COLUMN]
    keys = [i.to_bytes(4, "big") for i in range(len(encoded))]
    builder = ArrowRows(schema, columns)
    assert _flat_columns(encoded, [f.type for f in schema.fields], {0}) is not None  # bulk
    built = builder.from_stored(encoded, keys)
    decoded = [RowCodec(schema).decode(e) for e in encoded]
    want = ArrowRows(schema, schema.column_names).from_rows(decoded)
    assert built.column_names == columns
    assert built.select(schema.column_names).equals(want)
    assert built.column(KEY_COLUMN).to_pylist() == keys
    assert built.schema.field("f32").type == pa.float32()


@pytest.mark.parametrize("rows", [600, 10])  # read from the buffers, and decoded row by row
def test_rows_held_in_an_arrow_array_build_the_table_their_list_builds(rows: int) -> None:
    schema = _scalar_schema(0)
    encoded = [msgspec.msgpack.encode(row) for row in _scalar_rows(schema, rows + 7)]
    builder = ArrowRows(schema, schema.column_names[::-1])
    # a slice: its offsets start past the array's first row, as a filtered segment's may
    held = pa.array(encoded, pa.binary()).slice(3, rows)
    assert held.offset == 3
    if rows >= 256:
        assert _flat_columns_of(held, [f.type for f in schema.fields], {0}) is not None
    assert builder.from_stored_array(held).equals(builder.from_stored(encoded[3 : 3 + rows]))
    bad_utf8 = encoded[4].replace(b"key-4", b"key-\xff", 1)
    assert bad_utf8 != encoded[4]
    with pytest.raises(UnicodeDecodeError):  # the general path's error, as from a list
        builder.from_stored_array(pa.array([*encoded[:3], bad_utf8, *encoded[4:]], pa.binary()))
    with pytest.raises(ValueError, match="cannot be null"):
        builder.from_stored_array(pa.array([encoded[0], None], pa.binary()))


@pytest.mark.parametrize("copies", [1, 100])  # a few rows, and enough for the bulk read
def test_rows_in_other_messagepack_forms_still_decode(copies: int) -> None:
    """Rows written by another MessagePack encoder (an int in a double column, a float32,
    a short array) go through the general path, with the same values."""
    schema = _scalar_schema(0)
    plain = _scalar_rows(schema, 3)
    builder = ArrowRows(schema, ["k", "f64", "i64"])
    other = [*plain[:2], [*plain[2][:8], 7, *plain[2][9:]]]  # int 7 where a double is
    assert builder.from_stored([msgspec.msgpack.encode(r) for r in other] * copies).column(
        "f64"
    ).to_pylist()[2] == pytest.approx(7.0)
    float32 = msgspec.msgpack.encode(plain[0])  # f64 written as MessagePack float 32
    at = float32.index(b"\xcb")
    patched = [float32.replace(b"\xcb", b"\xca", 1)[: at + 1] + b"?\x80\x00\x00"]
    patched[0] += msgspec.msgpack.encode(plain[0])[at + 9 :]
    if plain[0][7] is None:  # the first float is f64 only when f32 is null
        assert builder.from_stored(patched * copies).column("f64").to_pylist()[0] == 1.0
    short = [*plain[0][:-1]]
    with pytest.raises(IndexError):
        ArrowRows(schema, ["nothing"]).from_stored([msgspec.msgpack.encode(short)] * copies)
    bad_utf8 = msgspec.msgpack.encode(plain[1]).replace(b"key-1", b"key-\xff", 1)
    with pytest.raises(UnicodeDecodeError):  # as msgspec reports it
        builder.from_stored([bad_utf8] * copies)
