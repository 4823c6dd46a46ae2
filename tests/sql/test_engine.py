"""The engine's own promises: the lookup fast path, caching, threads, limits, results."""

from __future__ import annotations

import datetime as dt
import threading
from decimal import Decimal

import duckdb
import pyarrow as pa
import pytest

from sparkiq import ConfigError, Node
from sparkiq.schema.codec import RowCodec
from sparkiq.schema.types import TableSchema
from sparkiq.sql import SqlEngine, SqlLimitError, SqlLimits, SqlResult
from sparkiq.sql.arrow import ArrowRows
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


def test_limits_validate_and_read_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError):
        SqlLimits(timeout_seconds=0)
    with pytest.raises(ConfigError):
        SqlLimits(default_page_size=20, max_page_size=10)
    monkeypatch.setenv("SPARKIQ_SQL_MAX_RESULT_ROWS", "77")
    monkeypatch.setenv("SPARKIQ_SQL_TIMEOUT_SECONDS", "2.5")
    limits = SqlLimits.from_env(threads=1)
    assert (limits.max_result_rows, limits.timeout_seconds, limits.threads) == (77, 2.5, 1)
    monkeypatch.setenv("SPARKIQ_SQL_THREADS", "many")
    with pytest.raises(ConfigError):
        SqlLimits.from_env()


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
