"""``AS OF``: statements and typed requests read a past batch, equal to a model of the table
after exactly that batch; beyond the history, a clear error names the oldest readable batch."""

from __future__ import annotations

import datetime as dt
import random
import time
from pathlib import Path
from typing import Any

import duckdb
import pytest

from sparkiq import Client, Node, RangeQuery, StateQueryRequest
from sparkiq.changelog import Changelog, TableManifest
from sparkiq.sql.errors import SqlError, SqlPartitionError
from sparkiq.stores.history import History
from tests import http_calls
from tests.changelog.helpers import make_table, write_batch

KEYS = [f"k{i:03d}" for i in range(80)]
BATCHES = 12


def history(seed: int = 7) -> list[dict[str, int | None]]:
    rng = random.Random(seed)
    batches: list[dict[str, int | None]] = [{k: rng.randrange(100) for k in KEYS}]
    for _ in range(1, BATCHES):
        changes: dict[str, int | None] = {}
        for key in rng.sample(KEYS, 25):
            changes[key] = None if rng.random() < 0.3 else rng.randrange(100)
        batches.append(changes)
    return batches


def state_after(batches: list[dict[str, int | None]], batch_id: int) -> dict[str, int]:
    state: dict[str, int] = {}
    for changes in batches[: batch_id + 1]:
        for key, n in changes.items():
            if n is None:
                state.pop(key, None)
            else:
                state[key] = n
    return state


def set_history(state_dir: str, history: History) -> None:
    changelog = Changelog(state_dir, "t")
    manifest = changelog.manifest()
    changelog.storage.write_atomic(
        changelog.manifest_path,
        TableManifest(
            manifest.name,
            manifest.schema,
            manifest.partitions,
            incarnation=manifest.incarnation,
            history=history,
        ).encode(),
    )


@pytest.fixture
def served(tmp_path: Path) -> Any:
    """A node that applied every batch one by one (so it kept each in its history), with
    the commit time of every batch."""
    state_dir = str(tmp_path / "state")
    changelog = make_table(state_dir, partitions=4)
    set_history(state_dir, History(batches=8))
    batches = history()
    committed: list[float] = []
    with Node(state_dir, node_id="asof", listen="127.0.0.1:0", token="tok") as node:
        for batch_id, changes in enumerate(batches):
            committed.append(write_batch(changelog, batch_id, changes).committed_at)
            node.poll_once()
            time.sleep(0.002)  # distinct commit times
        yield node, batches, committed


def model_sql(state: dict[str, int], sql: str) -> list[tuple[Any, ...]]:
    con = duckdb.connect()
    con.execute("CREATE TABLE t (k VARCHAR, n BIGINT)")
    if state:
        con.executemany("INSERT INTO t VALUES (?, ?)", list(state.items()))
    return sorted(con.execute(sql).fetchall())


STATEMENTS = [
    "SELECT count(*) AS c, sum(n) AS s FROM t{as_of}",
    "SELECT k, n FROM t{as_of} WHERE n > 50",
    "SELECT k, n FROM t{as_of} ORDER BY n DESC, k LIMIT 5",
    "SELECT n % 7 AS g, count(*) AS c FROM t{as_of} GROUP BY 1",
    "SELECT k, n FROM t{as_of} WHERE k IN ('k001', 'k002', 'k040', 'k077')",
    "SELECT k, n FROM t{as_of} WHERE k = 'k013'",
]


@pytest.mark.parametrize("sql", STATEMENTS)
def test_as_of_a_batch_equals_the_table_after_that_batch(served: Any, sql: str) -> None:
    node, batches, _ = served
    for batch_id in range(BATCHES - 9, BATCHES):  # every batch the history keeps
        got = node.sql(sql.format(as_of=f" AS OF {batch_id}"))
        want = model_sql(state_after(batches, batch_id), sql.format(as_of=""))
        assert sorted(tuple(r.values()) for r in got.rows) == want, batch_id
        if got.position.to_map():
            assert set(got.position.to_map()["t"].values()) == {batch_id}


def test_as_of_timestamp_reads_the_batch_current_then(served: Any) -> None:
    node, batches, committed = served
    batch_id = 6
    between = (committed[batch_id] + committed[batch_id + 1]) / 2
    stamp = dt.datetime.fromtimestamp(between).isoformat(sep=" ")
    got = node.sql(f"SELECT count(*) AS c, sum(n) AS s FROM t AS OF TIMESTAMP '{stamp}'")
    state = state_after(batches, batch_id)
    assert tuple(got.rows[0].values()) == (len(state), sum(state.values()))
    request = StateQueryRequest.in_store("t").with_query(RangeQuery.with_no_bounds())
    result = node.query(request.as_of_time(dt.datetime.fromtimestamp(between)))
    rows = {k: r["n"] for answer in result.partition_results.values() for k, r in answer.result}
    assert rows == state


def test_typed_requests_as_of_a_batch(served: Any) -> None:
    node, batches, _ = served
    request = StateQueryRequest.in_store("t").with_query(RangeQuery.with_no_bounds())
    for batch_id in (4, 7, 11):
        result = node.query(request.as_of(batch_id))
        rows = {}
        for answer in result.partition_results.values():
            assert answer.is_success, answer
            rows.update({k: r["n"] for k, r in answer.result})
        assert rows == state_after(batches, batch_id)
        assert set(result.position.to_map()["t"].values()) == {batch_id}


def test_a_self_join_across_batches(served: Any) -> None:
    node, batches, _ = served
    got = node.sql(
        "SELECT count(*) AS c FROM t AS OF 5 a JOIN t AS OF 9 b ON a.k = b.k WHERE a.n <> b.n"
    )
    old, new = state_after(batches, 5), state_after(batches, 9)
    assert got.rows[0]["c"] == sum(1 for k in old if k in new and old[k] != new[k])


def test_beyond_the_history_names_the_oldest_readable_batch(served: Any) -> None:
    node, _, _ = served
    with pytest.raises(SqlPartitionError, match="oldest batch still readable is 3"):
        node.sql("SELECT count(*) FROM t AS OF 2")
    result = node.query(
        StateQueryRequest.in_store("t").with_query(RangeQuery.with_no_bounds()).as_of(1)
    )
    failure = next(iter(result.partition_results.values()))
    assert failure.is_failure and "oldest batch still readable is 3" in failure.failure_message


@pytest.mark.parametrize(
    ("clause", "message"),
    [
        ("AS OF TIMESTAMP 'yesterday'", "is not a time"),
        ("AS OF 1.5", "is not a batch id"),
        ("AS OF TIMESTAMP '1990-01-01 00:00:00'", "no batch of 't' was committed"),
    ],
)
def test_bad_as_of_gets_a_clear_error(served: Any, clause: str, message: str) -> None:
    node, _, _ = served
    with pytest.raises(SqlError, match=message):
        node.sql(f"SELECT count(*) FROM t {clause}")


def test_as_of_is_not_an_alias_named_of(served: Any) -> None:
    node, batches, _ = served
    got = node.sql("SELECT count(*) AS of FROM t")
    assert got.rows == [{"of": len(state_after(batches, BATCHES - 1))}]


def test_as_of_over_rest_and_the_client(served: Any) -> None:
    node, batches, committed = served
    state = state_after(batches, 8)
    with Client(node.url, token="tok") as client:
        got = client.sql("SELECT count(*) AS c, sum(n) AS s FROM t AS OF 8")
        assert tuple(got.rows[0].values()) == (len(state), sum(state.values()))
        request = StateQueryRequest.in_store("t").with_query(RangeQuery.with_no_bounds())
        for asked in (
            request.as_of(8),
            request.as_of_time(dt.datetime.fromtimestamp((committed[8] + committed[9]) / 2)),
        ):
            result = client.query(asked)
            rows = {k: r["n"] for a in result.partition_results.values() for k, r in a.result}
            assert rows == state
    headers = {"Authorization": "Bearer tok"}
    body = {"query": {"type": "range"}, "as_of": 8}
    reply = http_calls.post(f"{node.url}/stores/t/query", json=body, headers=headers, timeout=30)
    assert reply.status_code == 200, reply.text
    rows = {
        row["key"]: row["row"]["n"]
        for partition in reply.json()["partitions"].values()
        for row in partition["rows"]
    }
    assert rows == state
    bad = http_calls.post(
        f"{node.url}/stores/t/query",
        json={"query": {"type": "range"}, "as_of": "soon"},
        headers=headers,
        timeout=30,
    )
    assert bad.status_code == 400 and "as_of" in bad.text
