"""Errors locate the problem (line, column, caret) and name what would be valid."""

from __future__ import annotations

import pytest

from sparkiq import InvalidQueryError, Node
from sparkiq.sql import (
    SqlEngine,
    SqlError,
    SqlLimitError,
    SqlLimits,
    SqlSyntaxError,
    SqlUnknownNameError,
    SqlUnsupportedError,
)


def test_syntax_errors_carry_line_column_and_a_caret(node: Node) -> None:
    with pytest.raises(SqlSyntaxError) as caught:
        node.sql("SELECT *\nFROM t\nWHERE k = = 'x'")
    error = caught.value
    assert (error.code, error.line, error.column) == ("syntax", 3, 11)
    assert error.snippet == "WHERE k = = 'x'\n          ^"
    assert "missing" in error.message
    assert isinstance(error, InvalidQueryError)
    assert "line 3, column 11" in str(error)


def test_unknown_tables_name_the_closest_candidates(node: Node) -> None:
    with pytest.raises(SqlUnknownNameError) as caught:
        node.sql("SELECT * FROM wn")
    error = caught.value
    assert error.code == "unknown_table"
    assert error.field == "wn"
    assert error.candidates[0] in ("w", "win")
    assert (error.line, error.column) == (1, 15)
    assert "ck" in error.message  # the list of tables


def test_unknown_columns_name_the_closest_candidates(node: Node) -> None:
    with pytest.raises(SqlUnknownNameError) as caught:
        node.sql("SELECT k, prise FROM w WHERE tag = 'red'")
    error = caught.value
    assert (error.code, error.field, error.candidates[0]) == ("unknown_column", "prise", "price")
    assert (error.line, error.column) == (1, 11)
    assert error.snippet == "SELECT k, prise FROM w WHERE tag = 'red'\n          ^"
    with pytest.raises(SqlUnknownNameError) as caught:
        node.sql("SELECT t.k FROM t JOIN w ON t.k = w.k WHERE w.tagg = 'x'")
    assert caught.value.candidates == ("tag",)


def test_errors_duckdb_finds_are_located_in_the_statement(node: Node) -> None:
    with pytest.raises(SqlUnknownNameError) as caught:
        node.sql("SELECT * FROM (SELECT kx FROM t) AS s")
    assert caught.value.field == "kx"
    assert (caught.value.line, caught.value.column) == (1, 23)
    assert "k" in caught.value.candidates
    with pytest.raises(SqlUnknownNameError) as caught:
        node.sql("SELECT\n  upperr(k) FROM t")
    assert (caught.value.code, caught.value.line, caught.value.column) == ("unknown_function", 2, 3)
    assert caught.value.candidates == ("upper",)


def test_unsupported_constructs_say_what_to_do_instead(node: Node) -> None:
    with pytest.raises(SqlUnsupportedError) as caught:
        node.sql("SELECT * FROM t EMIT CHANGES")
    assert "stream()" in caught.value.message
    with pytest.raises(SqlUnsupportedError) as caught:
        node.sql("SELECT * FROM t WHERE k = ?")
    assert "literals" in caught.value.message
    with pytest.raises(SqlUnsupportedError) as caught:
        node.sql("DELETE FROM t")
    assert "SELECT" in caught.value.message and caught.value.code == "forbidden_statement"
    with pytest.raises(SqlUnsupportedError) as caught:
        node.sql("SELECT 1; SELECT 2")
    assert "one SELECT" in caught.value.message


def test_errors_are_plain_data(node: Node) -> None:
    with pytest.raises(SqlError) as caught:
        node.sql("SELECT nn FROM t")
    assert caught.value.to_dict() == {
        "code": "unknown_column",
        "message": caught.value.message,
        "line": 1,
        "column": 8,
        "snippet": "SELECT nn FROM t\n       ^",
        "field": "nn",
        "candidates": ["n"],
    }


def test_limits_are_enforced_with_clear_errors(node: Node) -> None:
    engine = SqlEngine(
        node,
        SqlLimits(
            max_statement_chars=40, max_result_rows=10, default_page_size=20, max_page_size=50
        ),
    )
    with pytest.raises(SqlLimitError) as caught:
        engine.execute("SELECT * FROM t WHERE n > 1 AND n < 100000 AND k <> 'x'")
    assert (
        caught.value.code == "statement_too_long" and "max_statement_chars" in caught.value.message
    )
    with pytest.raises(SqlLimitError) as caught:
        engine.execute("SELECT * FROM t")
    assert caught.value.code == "too_many_rows" and "page_size" in caught.value.message
    assert len(engine.execute("SELECT * FROM t LIMIT 10").rows) == 10
    with pytest.raises(SqlLimitError) as caught:
        engine.execute("SELECT * FROM t", page_size=51)
    assert caught.value.code == "page_too_large"
    with pytest.raises(SqlError):
        engine.execute("SELECT * FROM t", page_size=0)


def test_a_slow_statement_is_interrupted(node: Node) -> None:
    # 5 s, not less: the same engine must answer a small statement afterwards, and on a busy
    # machine a sub-second limit can cut that one short too. 172**5 combinations never finish.
    engine = SqlEngine(node, SqlLimits(timeout_seconds=5))
    slow = (
        "SELECT count(*) FROM t AS a, t AS b, t AS c, t AS d, t AS e "
        "WHERE a.n + b.n + c.n + d.n + e.n = -1"
    )
    with pytest.raises(SqlLimitError) as caught:
        engine.execute(slow)
    assert caught.value.code == "timeout"
    assert "timeout_seconds" in caught.value.message
    assert engine.execute("SELECT count(*) AS c FROM t").rows == [{"c": 172}]
