"""One judge of "is this a push query" (``sparkiq.sql.statement``): what it decides, that it
decides in linear time on hostile text, and that the pull engine and push subscriptions of a
node agree with it on every spelling (REST and DDL: tests/server/test_push_http.py and
tests/spark/test_sql_ddl.py)."""

from __future__ import annotations

import pytest

from sparkiq import Node
from sparkiq.sql.errors import SqlError, SqlUnsupportedError
from sparkiq.sql.parse import parse, shape_of
from sparkiq.sql.push import PushQueryError
from sparkiq.sql.statement import emit_changes_at, first_word, is_push_query
from tests.sql.push_spellings import PULL, PUSH, spell


@pytest.mark.parametrize(
    ("text", "before"),
    [
        ("SELECT * FROM t EMIT CHANGES", "SELECT * FROM t "),
        ("SELECT * FROM t EMIT  CHANGES;", "SELECT * FROM t "),
        ("SELECT * FROM t\tEMIT\r\n\tCHANGES ; ;\n", "SELECT * FROM t\t"),
        ("SELECT * FROM t emit /* a */ changes -- b", "SELECT * FROM t "),
        ("SELECT 'it''s' AS s FROM t EMIT CHANGES", "SELECT 'it''s' AS s FROM t "),
        ('SELECT "--" FROM t EMIT CHANGES', 'SELECT "--" FROM t '),
        ("EMIT CHANGES", ""),
    ],
)
def test_the_clause_is_found_and_cut_off(text: str, before: str) -> None:
    at = emit_changes_at(text)
    assert at is not None
    assert text[:at] == before
    assert is_push_query(text)


@pytest.mark.parametrize(
    "text",
    [
        "SELECT * FROM t",
        "SELECT * FROM t -- EMIT CHANGES",
        "SELECT * FROM t /* EMIT CHANGES */",
        "SELECT 'EMIT CHANGES' FROM t",
        'SELECT "EMIT CHANGES" FROM t',
        "SELECT `EMIT CHANGES` FROM t",
        "SELECT * FROM t EMITCHANGES",
        "SELECT * FROM t XEMIT CHANGES",
        "SELECT * FROM t EMIT CHANGESX",
        "SELECT * FROM t EMIT CHANGES x",
        "SELECT * FROM t EMIT CHANGE\u017f",  # a long s upper-cases to S: not the keyword
        "SELECT * FROM t WHERE s = 'EMIT CHANGES",  # an open literal runs to the end
        "SELECT * FROM t EMIT CHANGES /* left open",
        "CHANGES",
        "",
        "  ;  ",
    ],
)
def test_other_statements_are_not_push_queries(text: str) -> None:
    assert emit_changes_at(text) is None
    assert not is_push_query(text)


def test_first_word_skips_whitespace_and_comments() -> None:
    assert first_word("  -- note\n /* a\n b */ explain SELECT 1") == ("EXPLAIN", 29)
    assert first_word("create table t") == ("CREATE", 6)
    assert first_word("'create' table") is None
    assert first_word("/* open comment create") is None
    assert first_word("   ") is None


MB = 1_000_000
HOSTILE = [  # (text, is it a push query)
    (" " * 3 * MB, False),
    ("SELECT * FROM t EMIT" + " " * MB + "CHANGES" + " " * MB + "x", False),
    ("emit changes " * (MB // 4), True),
    ("/* " * MB, False),
    ("'" * (MB + 1), False),
    ("-- " * MB, False),
    ("'a" * MB, False),
    ("'a' " * (MB // 4) + "EMIT CHANGES", True),
    ("1" * MB + "x", False),
    ("SELECT * FROM t EMIT" + "\t\n" * MB + "CHANGES", True),
]


@pytest.mark.timeout(5)  # quadratic (or backtracking) scans of these take minutes
def test_hostile_statements_are_judged_in_linear_time() -> None:
    assert [is_push_query(text) for text, _ in HOSTILE] == [push for _, push in HOSTILE]


@pytest.mark.timeout(5)
def test_hostile_statements_are_scanned_in_linear_time() -> None:
    for text, _ in HOSTILE:
        first_word(text[: MB // 4])
        shape_of(text[: MB // 4])  # the plan cache's literal scan runs before any length limit


@pytest.mark.timeout(5)
def test_hostile_statements_under_the_length_limit_fail_fast_in_the_parser() -> None:
    for text in [
        " " * 90_000 + "x",  # once exponential: EXPLAIN detection backtracked over spaces
        "/* c */ " * 10_000 + "EXPLAIN" + " " * 10_000 + "x",
        "SELECT 1 EMIT" + " " * 90_000 + "CHANGES",
    ]:
        with pytest.raises(SqlError):
            parse(text)


@pytest.mark.parametrize("template", PUSH)
def test_the_node_refuses_push_spellings_in_sql_and_runs_them_in_stream(
    node: Node, template: str
) -> None:
    text = spell(template, "k, n", "t")
    with pytest.raises(SqlUnsupportedError, match=r"run it with stream\(\)") as raised:
        node.sql(text)
    assert raised.value.code == "push_query"
    with node.stream(text) as subscription:
        assert subscription.table == "t"
        assert subscription.columns[:2] == ("k", "n")


@pytest.mark.parametrize("template", PULL)
def test_the_node_runs_pull_spellings_in_sql_and_refuses_them_in_stream(
    node: Node, template: str
) -> None:
    text = spell(template, "k, n", "t")
    result = node.sql(text)
    assert result.columns[:2] == ["k", "n"]
    assert len(result.rows) > 0
    with pytest.raises(PushQueryError, match="not a push query"):
        node.stream(text)


def test_a_number_too_long_for_any_type_is_a_sql_error_not_a_crash(node: Node) -> None:
    with pytest.raises(SqlError):
        node.sql("SELECT k FROM t WHERE n = " + "1" * 5000)
