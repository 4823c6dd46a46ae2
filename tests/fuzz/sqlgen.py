"""A grammar-based SQL statement generator and mutator for fuzzing a node's ``/query``.

:func:`statement` builds a random ``SELECT`` over the tables of
:func:`tests.sql.tables.build_world` from a small grammar (typed expressions: columns,
literals with edge values, arithmetic, string and value-building functions, ``CASE``,
comparisons, ``IN``, ``BETWEEN``, ``LIKE``, joins, subqueries, CTEs, grouping, ordering,
limits), parsed and rendered by sqlglot so that it is well formed. :func:`mutate` then
damages some of them at the token level (sqlglot's tokenizer): dropped, repeated, swapped
or foreign tokens, a cut-off end. Everything is drawn from one ``random.Random``: a seed
gives the same cases on every run.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import sqlglot
from sqlglot.tokens import Tokenizer

#: table -> column -> kind (int, str, dec, date, ts); the key column first
TABLES: dict[str, dict[str, str]] = {
    "t": {"k": "str", "n": "int"},
    "ik": {"key": "int", "v": "int"},
    "lk": {"key": "int", "v": "int"},
    "xk": {"key": "dec", "v": "int"},
    "dk": {"key": "date", "v": "int"},
    "ck": {"region": "str", "id": "int", "amount": "dec", "ts": "ts"},
}

_INTS = ["0", "1", "-1", "7", "42", "2147483647", "-2147483648", "9223372036854775807",
         "1e3", "1e300", "1e99999", "0.5", "-0", "99999999999999999999999"]  # fmt: skip
_STRS = ["''", "'k001'", "'k150'", "'new'", "'eu'", "'us'", "'%'", "'_'", "'k%'", "'%1'",
         "'a''b'", "'é漢字'", "'\\'", "'%%%%%%%%%%%%%%%%%%%%%%%%%%%%b'", "'NULL'"]  # fmt: skip
_DATES = ["DATE '2024-01-01'", "DATE '0001-01-01'", "DATE '9999-12-31'", "DATE '2023-12-15'"]
_TSS = ["TIMESTAMP '2024-01-01 00:00:00'", "TIMESTAMP '1970-01-01'", "TIMESTAMP '2024-01-03'"]
_DECS = ["0.125", "-12.5", "1.001", "100.000", "123456789.123"]
_KEYWORDS = ["SELECT", "FROM", "WHERE", "AND", "OR", "NOT", "(", ")", ",", "*", "=", "IN",
             "NULL", "GROUP BY", "ORDER BY", "LIMIT", "UNION", "JOIN", "ON", "AS", "'", '"',
             "--", "/*", ";", "EMIT CHANGES", "EXPLAIN", "WITH", "CASE", "END", "1e999999999",
             "repeat('x', 2e9)", "read_csv('/etc/passwd')", "pg_settings", "::", "->", "$1",
             "?"]  # fmt: skip


@dataclass(frozen=True)
class Case:
    """One statement, and whether it came straight from the grammar (``exact``: DuckDB on
    the ground truth must answer it alike) or was mutated."""

    sql: str
    exact: bool


class _Gen:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def pick(self, items: list[str]) -> str:
        return items[self.rng.randrange(len(items))]

    def literal(self, kind: str) -> str:
        return self.pick(
            {"int": _INTS, "str": _STRS, "dec": _DECS, "date": _DATES, "ts": _TSS}[kind]
        )

    def expr(self, kind: str, cols: dict[str, str], depth: int) -> str:
        """An expression of ``kind`` over ``cols`` (qualified names -> kinds)."""
        same = [c for c, k in cols.items() if k == kind]
        roll = self.rng.random()
        if depth <= 0 or roll < 0.35:
            if same and self.rng.random() < 0.7:
                return self.pick(same)
            return self.literal(kind)
        sub = depth - 1
        if kind == "int":
            choice = self.rng.randrange(6)
            if choice == 0:
                op = self.pick(["+", "-", "*", "/", "%"])
                return f"({self.expr('int', cols, sub)} {op} {self.expr('int', cols, sub)})"
            if choice == 1:
                return f"abs({self.expr('int', cols, sub)})"
            if choice == 2:
                return f"length({self.expr('str', cols, sub)})"
            if choice == 3:
                return f"coalesce({self.expr('int', cols, sub)}, {self.literal('int')})"
            if choice == 4:
                return (
                    f"CASE WHEN {self.cond(cols, sub)} THEN {self.expr('int', cols, sub)} "
                    f"ELSE {self.expr('int', cols, sub)} END"
                )
            return f"greatest({self.expr('int', cols, sub)}, {self.expr('int', cols, sub)})"
        if kind == "str":
            choice = self.rng.randrange(6)
            if choice == 0:
                return f"upper({self.expr('str', cols, sub)})"
            if choice == 1:
                return f"concat({self.expr('str', cols, sub)}, {self.expr('str', cols, sub)})"
            if choice == 2:
                return f"substr({self.expr('str', cols, sub)}, {self.rng.randrange(-3, 5)})"
            if choice == 3:
                times = self.pick(["0", "2", "3", "70000", "2e9"])
                return f"repeat({self.expr('str', cols, sub)}, {times})"
            if choice == 4:
                width = self.pick(["3", "8", "100000000"])
                return f"lpad({self.expr('str', cols, sub)}, {width}, 'x')"
            return f"CAST({self.expr('int', cols, sub)} AS VARCHAR)"
        return self.pick(same) if same else self.literal(kind)

    def cond(self, cols: dict[str, str], depth: int) -> str:
        kind = self.pick(sorted(set(cols.values())))
        roll = self.rng.randrange(8 if depth > 0 else 5)
        left = self.expr(kind, cols, depth - 1)
        if roll == 0:
            op = self.pick(["=", "<>", "<", "<=", ">", ">="])
            return f"{left} {op} {self.expr(kind, cols, depth - 1)}"
        if roll == 1:
            values = ", ".join(self.literal(kind) for _ in range(self.rng.randrange(1, 8)))
            return f"{left} {self.pick(['IN', 'NOT IN'])} ({values})"
        if roll == 2:
            return f"{left} BETWEEN {self.literal(kind)} AND {self.literal(kind)}"
        if roll == 3:
            return f"{left} IS {self.pick(['', 'NOT '])}NULL"
        if roll == 4:
            text = [c for c, k in cols.items() if k == "str"]
            target = self.pick(text) if text else "'x'"
            return f"{target} {self.pick(['LIKE', 'NOT LIKE', 'ILIKE'])} {self.pick(_STRS)}"
        if roll == 5:
            return f"NOT ({self.cond(cols, depth - 1)})"
        op = self.pick(["AND", "OR"])
        return f"({self.cond(cols, depth - 1)} {op} {self.cond(cols, depth - 1)})"

    def select(self, depth: int = 2) -> str:
        table = self.pick(sorted(TABLES))
        cols = {f"a.{c}": k for c, k in TABLES[table].items()}
        source = f"{table} AS a"
        if depth > 0 and self.rng.random() < 0.25:  # a join on the key columns' kind
            other = self.pick([t for t in TABLES if t != table])
            first = next(iter(TABLES[table].items()))
            match = [c for c, k in TABLES[other].items() if k == first[1]]
            if match:
                source += f" JOIN {other} AS b ON a.{first[0]} = b.{match[0]}"
                cols |= {f"b.{c}": k for c, k in TABLES[other].items()}
        elif depth > 0 and self.rng.random() < 0.15:  # a derived table
            inner = ", ".join(f"{c} AS {c}" for c in TABLES[table])
            where = self.cond(dict(TABLES[table]), 1)
            source = f"(SELECT {inner} FROM {table} WHERE {where}) AS a"
        grouped = self.rng.random() < 0.3
        items: list[str] = []
        group: list[str] = []
        for i in range(self.rng.randrange(1, 4)):
            kind = self.pick(sorted(set(cols.values())))
            if grouped and i == 0:
                column = self.pick(sorted(cols))
                group.append(column)
                items.append(f"{column} AS c{i}")
            elif grouped:
                value = self.expr(kind, cols, 1)
                agg = self.pick(
                    [
                        "count(*)",
                        f"count({self.pick(sorted(cols))})",
                        f"min({value})",
                        f"max({value})",
                        f"sum({self.expr('int', cols, 1)})",
                    ]
                )
                items.append(f"{agg} AS c{i}")
            else:
                items.append(f"{self.expr(kind, cols, depth)} AS c{i}")
        distinct = "DISTINCT " if self.rng.random() < 0.1 else ""
        sql = f"SELECT {distinct}{', '.join(items)} FROM {source}"
        if self.rng.random() < 0.7:
            sql += f" WHERE {self.cond(cols, depth)}"
        if group:
            sql += f" GROUP BY {', '.join(group)}"
            if self.rng.random() < 0.3:
                sql += " HAVING count(*) > 1"
        if self.rng.random() < 0.4:
            sql += f" ORDER BY {', '.join(f'c{i}' for i in range(len(items)))}"
        if self.rng.random() < 0.2:
            sql += f" LIMIT {self.pick(['0', '1', '5', '100', '-1', '9223372036854775807'])}"
        if depth > 1 and self.rng.random() < 0.1:
            sql = f"WITH q AS ({sql}) SELECT * FROM q"
        return sql


def statement(rng: random.Random) -> Case:
    """One case: a generated statement rendered by sqlglot, mutated one time in three."""
    text = _Gen(rng).select()
    try:
        text = sqlglot.parse_one(text, read="duckdb").sql(dialect="duckdb")
    except sqlglot.errors.SqlglotError:
        return Case(text, exact=False)  # the grammar's own mistakes are fuzz input too
    if rng.random() < 1 / 3:
        return Case(mutate(text, rng), exact=False)
    return Case(text, exact=True)


def mutate(text: str, rng: random.Random) -> str:
    """``text`` with one to three token-level edits."""
    tokens = [
        t.text if t.token_type.name != "STRING" else f"'{t.text}'"
        for t in Tokenizer().tokenize(text)
    ]
    for _ in range(rng.randint(1, 3)):
        if not tokens:
            break
        at = rng.randrange(len(tokens))
        edit = rng.randrange(5)
        if edit == 0:
            del tokens[at]
        elif edit == 1:
            tokens.insert(at, tokens[at])
        elif edit == 2 and at + 1 < len(tokens):
            tokens[at], tokens[at + 1] = tokens[at + 1], tokens[at]
        elif edit == 3:
            tokens.insert(at, _KEYWORDS[rng.randrange(len(_KEYWORDS))])
        else:
            tokens = tokens[: max(1, at)]
    return " ".join(tokens)
