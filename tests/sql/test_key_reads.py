"""Key lookups inside larger statements: one request per table reference, Arrow from the stores.

A statement that fixes a table's keys but needs DuckDB (a join, an expression, an aggregate)
reads those keys with one :class:`~sparkiq.sql.SqlFragmentQuery` naming the partitions they
map to; each partition reads exactly its keys (never a scan) and answers Arrow. Answers are
checked against DuckDB over the ground truth, on the columnar path (the node hosts every
table) and the general path (a plain source, as a cluster reads partitions elsewhere).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import duckdb
import pytest

from sparkiq import Node, StateQueryRequest
from sparkiq.query.result import StateQueryResult
from sparkiq.schema.codec import KeyCodec
from sparkiq.schema.partitioner import Partitioner
from sparkiq.sql import SqlEngine, SqlError, SqlFragmentQuery, SqlLimitError
from sparkiq.stores.partition import PartitionStore
from sparkiq.stores.versions import Version
from sparkiq.testing import write_table
from tests.sql.compare import assert_same, normalize, reference
from tests.sql.tables import BASE, WIN_ARROW

#: Key lookups that reach DuckDB: keys in several partitions, keys no partition holds.
STATEMENTS = [
    "SELECT k, n + 1 AS m FROM t WHERE k IN ('k001', 'k002', 'k007', 'k150', 'k199', 'nope')",
    "SELECT t.k, t.n, w.tag FROM t JOIN w ON t.n = w.n "
    "WHERE t.k IN ('k003', 'k004', 'k005', 'k010', 'k011', 'missing')",
    "SELECT count(*) AS c, sum(n) AS s, min(k) AS lo FROM t "
    "WHERE k IN ('k001', 'k002', 'k007', 'k150', 'k151', 'zzz')",
    "SELECT region, count(*) AS c, sum(amount) AS total FROM ck "
    "WHERE region IN ('eu', 'us', 'mars') AND id IN (1, 2, 3, 99) GROUP BY region",
    "SELECT a.key, a.v, b.v AS w FROM ik AS a JOIN lk AS b ON a.v = b.v "
    "WHERE a.key IN (-50, 1, 4, 7, 148, 1000)",
    "SELECT key, v * 2 AS d FROM dk WHERE key IN (DATE '2023-12-01', DATE '2024-01-15', "
    "DATE '2030-01-01')",
    "SELECT key, v FROM xk WHERE key IN (-12.5, 1.375, 2.25, 99) ORDER BY key",
    "SELECT k, WINDOWSTART, WINDOWEND, clicks + 0 AS c FROM win WHERE k IN ('a', 'e', 'zz') "
    "AND WINDOWSTART >= '2024-03-01 04:00:00' AND WINDOWSTART < '2024-03-01 14:00:00'",
    "SELECT k, sum(clicks) AS s, count(*) AS c FROM win WHERE k IN ('b', 'e', 'q') "
    "AND WINDOWEND <= '2024-03-01 12:00:00' GROUP BY k",
    "SELECT win.k, count(*) AS c FROM win JOIN t ON t.k = 'k00' || win.k "
    "WHERE win.k IN ('a', 'c') GROUP BY win.k",
    # no key satisfies both: the partial aggregate still has its shape
    "SELECT count(*) AS c, sum(n) AS s FROM t WHERE k = 'k001' AND k IN ('k002', 'k003')",
]


class Counting:
    """The node as a plain source (the general path), recording every request it is sent."""

    def __init__(self, node: Node) -> None:
        self._lookup = node._lookup
        self.requests: list[StateQueryRequest] = []

    @property
    def tables(self) -> list[str]:
        return self._lookup.tables

    def schema(self, store: str) -> Any:
        return self._lookup.schema(store)

    def partition_count(self, store: str) -> int:
        return self._lookup.partition_count(store)

    def query(self, request: StateQueryRequest) -> StateQueryResult[Any]:
        self.requests.append(request)
        return self._lookup.query(request)


class CountingColumnar(Counting):
    """The same as a columnar source (the node hosts every table: the columnar path)."""

    def local_rows(self, store: str, at_batch: int | None, bound: Any) -> Any:
        return self._lookup.local_rows(store, at_batch, bound)

    def batch_at_time(self, store: str, when: dt.datetime) -> int:
        return self._lookup.batch_at_time(store, when)


def _types(rows: list[tuple[Any, ...]]) -> list[tuple[type, ...]]:
    return sorted({tuple(type(v) for v in row) for row in rows}, key=repr)


@pytest.mark.parametrize("sql", STATEMENTS)
@pytest.mark.parametrize("path", ["columnar", "general"])
def test_key_lookups_in_statements_answer_like_duckdb(
    node: Node, ground: duckdb.DuckDBPyConnection, sql: str, path: str
) -> None:
    names, rows = reference(ground, sql)
    source = CountingColumnar(node) if path == "columnar" else Counting(node)
    got = SqlEngine(source).execute(sql)  # type: ignore[arg-type]
    assert_same(got, names, rows, ordered="ORDER BY" in sql)
    values = [tuple(row[c] for c in got.columns) for row in got.rows]
    assert _types(values) == _types(rows)  # dates, decimals, timestamps: not just equal
    # one request per table reference whose keys are fixed, naming only their partitions
    lookups = [r for r in source.requests if isinstance(r.query, SqlFragmentQuery)]
    keyed = [r for r in lookups if r.query.keys is not None]
    assert keyed, "the key lookups should be read as fragments with keys"
    for request in keyed:
        schema = node.schema(request.store)
        codec = KeyCodec(schema)
        partitioner = Partitioner(schema.key_types, node.partition_count(request.store))
        held = {partitioner(codec.decode(key)) for key in request.query.keys}
        assert request.partitions == frozenset(held or {0})  # no key: one partition's shape
    assert len(keyed) == len({r.store for r in keyed})  # each table is referenced once


def test_keys_are_read_key_by_key_never_by_a_scan(
    node: Node, ground: duckdb.DuckDBPyConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plain table's keys are point reads; a windowed table's, bounded ranges of the
    store (one per key prefix): no partition is scanned whole, no version filtered whole,
    and each key is read once, by its own partition only."""
    reads: list[tuple[bytes | None, bytes | None]] = []
    whole: list[int] = []
    scan, raw, get_raw, row = PartitionStore.scan, Version.raw, PartitionStore.get_raw, Version.row

    def counted_scan(self: PartitionStore, lower: Any, upper: Any, **options: Any) -> Any:
        reads.append((lower, upper))
        return scan(self, lower, upper, **options)

    def counted_get_raw(self: PartitionStore, key: bytes) -> Any:
        reads.append((key, key))
        return get_raw(self, key)

    def counted_row(self: Version, key: bytes) -> Any:
        reads.append((key, key))
        return row(self, key)

    def counted_raw(self: Version) -> Any:
        whole.append(1)
        return raw(self)

    monkeypatch.setattr(PartitionStore, "scan", counted_scan)
    monkeypatch.setattr(PartitionStore, "get_raw", counted_get_raw)
    monkeypatch.setattr(Version, "row", counted_row)
    monkeypatch.setattr(Version, "raw", counted_raw)
    for sql in [STATEMENTS[i] for i in (0, 2, 7, 8)]:  # no other table is scanned
        asked = sql.split(" IN (")[1].split(")")[0].count(",") + 1
        for engine in (SqlEngine(Counting(node)), SqlEngine(CountingColumnar(node))):  # type: ignore[arg-type]
            names, rows = reference(ground, sql)
            engine.execute(sql)  # planned: the dry run reads nothing, but count one execution
            reads.clear()
            assert_same(engine.execute(sql), names, rows, ordered=False)
            assert len(reads) == asked, (sql, reads)
            assert all(low is not None and high is not None for low, high in reads)
        assert not whole, sql


def _fragment(node: Node, table: str, keys: list[Any], **options: Any) -> dict[int, Any]:
    """Each answering partition's rows of ``keys`` (rows as tuples of the asked columns)."""
    schema = node.schema(table)
    codec = KeyCodec(schema)
    partitioner = Partitioner(schema.key_types, node.partition_count(table))
    internal = [codec.to_internal(k) for k in keys]
    columns = options.pop("columns", tuple(schema.column_names))
    partitions = tuple(partitioner(i) for i in internal)
    encoded = tuple(codec.encode(i) for i in internal)
    query = SqlFragmentQuery(columns, keys=encoded, key_partitions=partitions, **options)
    request = StateQueryRequest.in_store(table).with_query(query)
    request = request.with_partitions(set(partitions))
    result = node.query(request)
    out = {}
    for partition, answer in result.partition_results.items():
        assert answer.is_success, answer
        out[partition] = sorted(answer.result.to_pylist(), key=repr)
    return out


def test_each_partition_answers_exactly_the_keys_it_holds(node: Node) -> None:
    keys = ["k001", "k002", "k007", "k150", "k199", "nope"]
    answers = _fragment(node, "t", keys)
    assert len(answers) >= 3  # the keys span several partitions
    got = {row["k"]: row["n"] for rows in answers.values() for row in rows}
    expected = {r["k"]: r["n"] for r in node.sql("SELECT * FROM t").rows if r["k"] in keys}
    assert got == expected and "nope" not in got
    for partition, rows in answers.items():  # every row from the partition holding its key
        assert all(node.partition_for_key("t", row["k"]) == partition for row in rows)


def test_a_windowed_key_prefix_reads_every_window_in_bounds(node: Node) -> None:
    low, high = BASE + dt.timedelta(hours=4), BASE + dt.timedelta(hours=12)
    start = node.schema("win").window_start
    assert start is not None
    answers = _fragment(
        node,
        "win",
        ["a", "e", "zz"],
        columns=("k", "WINDOWSTART", "clicks"),
        window_from=start.to_internal(low),
        window_to=start.to_internal(high),
    )
    got = sorted((r["k"], r["WINDOWSTART"], r["clicks"]) for rows in answers.values() for r in rows)
    want = sorted(
        (r["k"], r["WINDOWSTART"], r["clicks"])
        for r in node.sql("SELECT k, WINDOWSTART, clicks FROM win").rows
        if r["k"] in ("a", "e") and low <= r["WINDOWSTART"] <= high
    )
    assert got == want and len({k for k, _, _ in got}) == 2


@pytest.fixture(scope="module")
def past(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A plain and a windowed table, each changed by three batches a node applied one by
    one (so it keeps every batch), with the rows after each batch."""
    state_dir = str(tmp_path_factory.mktemp("keyreads"))
    plain = [{f"p{i:02d}": i for i in range(30)}]
    plain += [{f"p{i:02d}": i * 100 + b for i in range(b, 30, 3)} for b in (1, 2)]
    windows = [BASE + dt.timedelta(hours=h) for h in range(0, 12, 2)]

    def win_rows(batch: int) -> list[dict[str, Any]]:
        return [
            {
                "k": key,
                "window": {"start": w, "end": w + dt.timedelta(hours=2)},
                "clicks": batch * 1000 + i * 10 + j,
            }
            for i, key in enumerate(["a", "b", "c", "d"])
            for j, w in enumerate(windows)
            if (i + j + batch) % 2 == 0 or batch == 0
        ]

    def rows(batch: int) -> list[dict[str, Any]]:
        return [{"k": k, "n": n} for k, n in plain[batch].items()]

    plain_writer = write_table(state_dir, "p", rows(0), key="k", partitions=4)
    win_writer = write_table(
        state_dir, "pw", win_rows(0), key="k", window="window", schema=WIN_ARROW
    )
    states: list[tuple[dict[str, int], list[dict[str, Any]]]] = []
    table: dict[str, int] = {}
    windowed: dict[tuple[str, dt.datetime], dict[str, Any]] = {}
    with Node(state_dir, node_id="past") as served:
        for batch in range(3):
            if batch:
                plain_writer.write(rows(batch))
                win_writer.write(win_rows(batch))
            served.poll_once()
            table |= plain[batch]
            windowed |= {(r["k"], r["window"]["start"]): r for r in win_rows(batch)}
            states.append((dict(table), list(windowed.values())))
        yield served, states


def _model(states: Any, batch: int, sql: str) -> list[tuple[Any, ...]]:
    table, windowed = states[batch]
    con = duckdb.connect()
    con.execute("CREATE TABLE p (k VARCHAR, n BIGINT)")
    con.executemany("INSERT INTO p VALUES (?, ?)", list(table.items()))
    con.execute("CREATE TABLE pw (k VARCHAR, WINDOWSTART TIMESTAMP, clicks BIGINT)")
    con.executemany(
        "INSERT INTO pw VALUES (?, ?, ?)",
        [(r["k"], r["window"]["start"], r["clicks"]) for r in windowed],
    )
    return sorted(con.execute(sql).fetchall(), key=repr)


PAST = [
    "SELECT k, n * 2 AS d FROM p{as_of} WHERE k IN ('p01', 'p02', 'p04', 'p05', 'p29', 'x')",
    "SELECT count(*) AS c, sum(n) AS s FROM p{as_of} WHERE k IN ('p00', 'p01', 'p02', 'p13')",
    "SELECT k, WINDOWSTART, clicks + 0 AS c FROM pw{as_of} WHERE k IN ('a', 'c', 'zz') "
    "AND WINDOWSTART >= '2024-03-01 02:00:00' AND WINDOWSTART <= '2024-03-01 08:00:00'",
]


@pytest.mark.parametrize("sql", PAST)
@pytest.mark.parametrize("path", ["columnar", "general"])
def test_key_lookups_as_of_a_batch_read_that_batch(past: Any, sql: str, path: str) -> None:
    served, states = past
    source = CountingColumnar(served) if path == "columnar" else Counting(served)
    engine = SqlEngine(source)  # type: ignore[arg-type]
    for batch in range(3):
        got = engine.execute(sql.format(as_of=f" AS OF {batch}"))
        values = sorted((tuple(normalize(r[c]) for c in got.columns) for r in got.rows), key=repr)
        assert values == _model(states, batch, sql.format(as_of="")), (batch, sql)
        table = "pw" if "FROM pw" in sql else "p"
        assert set(got.position.to_map()[table].values()) == {batch}


def test_newest_reads_the_current_state(past: Any) -> None:
    served, states = past
    for sql in PAST:
        got = served.sql(sql.format(as_of=""))
        values = sorted((tuple(normalize(r[c]) for c in got.columns) for r in got.rows), key=repr)
        assert values == _model(states, 2, sql.format(as_of=""))


def test_a_fragment_refuses_keys_a_statement_could_not_ask_for(node: Node) -> None:
    """A node never trusts a fragment: more keys than its SqlLimits.max_key_lookups, or keys
    that are not encoded store keys, are refused before anything is read."""
    too_many = tuple(KeyCodec(node.schema("t")).encode((f"x{i}",)) for i in range(257))
    one = (KeyCodec(node.schema("t")).encode(("k001",)),)
    for keys, partitions, error, message in [
        (too_many, None, SqlLimitError, "max_key_lookups=256"),
        (("k001",), None, SqlError, "encoded store keys"),
        (one, (0, 1), SqlError, "one per key"),
    ]:
        query = SqlFragmentQuery(("k", "n"), keys=keys, key_partitions=partitions)  # type: ignore[arg-type]
        request = StateQueryRequest.in_store("t").with_query(query).with_partitions({0})
        with pytest.raises(error, match=message):
            node.query(request)
