"""The WHERE and projection of push queries, on a table with a column of most kinds:
SQL's three-valued logic, coercion of literals, struct fields; and ``Node.stream``."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from sparkiq.sql.push import SubscriptionHub
from tests.changelog.helpers import make_table, make_wide_table, write_batch, write_rows

ROWS: dict[str, dict[str, Any]] = {
    "a": {
        "k": "a",
        "n": 1,
        "tag": "red",
        "price": 1.5,
        "day": dt.date(2024, 1, 1),
        "info": {"a": 3, "tags": ["x"]},
    },
    "b": {"k": "b", "n": None, "tag": None, "price": None, "day": None, "info": None},
    "c": {
        "k": "c",
        "n": 10,
        "tag": "Blue",
        "price": 9.0,
        "day": dt.date(2024, 6, 1),
        "info": {"a": None, "tags": []},
    },
    "d": {
        "k": "d",
        "n": -7,
        "tag": "red_x",
        "price": 0.0,
        "day": dt.date(2023, 12, 31),
        "info": {"a": 5, "tags": None},
    },
}


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> Any:
    state_dir = str(tmp_path_factory.mktemp("wide"))
    write_rows(make_wide_table(state_dir), 0, ROWS)
    hub = SubscriptionHub(state_dir, poll_interval=0.005)
    yield hub
    hub.close()


def snapshot_of(hub: SubscriptionHub, statement: str) -> dict[Any, Any]:
    with hub.subscribe(statement, snapshot=True) as sub:
        out = {}
        while not sub.caught_up:  # not "until a poll times out": a loaded machine is slow
            change = sub.poll(0.05)
            if change is not None:
                assert change.snapshot
                out[change.key] = change.row
        return out


@pytest.mark.parametrize(
    ("where", "keys"),
    [
        ("n > 0", "ac"),
        ("NOT n > 0", "d"),  # NULL > 0 is unknown, and so is its negation
        ("n IS NULL", "b"),
        ("tag IS NOT NULL AND price BETWEEN 1 AND 9", "ac"),
        ("day >= '2024-01-01'", "ac"),
        ("day < DATE '2024-01-01'", "d"),
        ("info.a = 3", "a"),
        ("w.info.a >= 3", "ad"),
        ("tag ILIKE 'b%'", "c"),
        ("tag LIKE 'red%'", "ad"),
        ("tag LIKE 're_'", "a"),
        ("n IN (1, 10, NULL)", "ac"),
        ("n NOT IN (1, NULL)", ""),  # never true when the list holds a NULL
        ("n = 1 OR n IS NULL", "ab"),
        ("COALESCE(n, 0) = 0", "b"),
        ("UPPER(tag) = 'BLUE'", "c"),
        ("LENGTH(k) = 1 AND n % 2 = 0", "c"),  # -7 % 2 is -1, as in Spark
        ("n / 0 IS NULL", "abcd"),
        ("k || tag = 'ared'", "a"),
        ("-n > 5 AND ABS(n) = 7", "d"),
        ("price * 2 > n", "acd"),
    ],
)
def test_where_follows_sql_semantics(wide: SubscriptionHub, where: str, keys: str) -> None:
    got = snapshot_of(wide, f"SELECT * FROM w WHERE {where} EMIT CHANGES")
    assert sorted(got) == list(keys)
    assert all(got[k] == ROWS[k] for k in got)


def test_projection_names_and_values(wide: SubscriptionHub) -> None:
    statement = "SELECT info.a AS ia, n + 1 AS m, price, info.tags FROM w AS x WHERE x.k = 'a'"
    with wide.subscribe(statement + " EMIT CHANGES", snapshot=True) as sub:
        assert sub.columns == ("ia", "m", "price", "tags")
        change = sub.poll(1)
        assert change is not None and change.key == "a"
        assert change.row == {"ia": 3, "m": 2, "price": 1.5, "tags": ["x"]}


def test_star_gives_rows_as_pyspark_does(wide: SubscriptionHub) -> None:
    assert snapshot_of(wide, "SELECT * FROM W EMIT CHANGES") == ROWS


def test_node_stream_shares_one_hub(tmp_path: Any) -> None:
    from sparkiq import Node

    changelog = make_table(str(tmp_path))
    write_batch(changelog, 0, {"a": 1, "b": 2})
    node = Node(str(tmp_path), store="memory").start()
    try:
        first = node.stream("SELECT * FROM t WHERE n > 1 EMIT CHANGES", snapshot=True)
        second = node.stream("SELECT k FROM t EMIT CHANGES")
        hub = node._hub
        assert isinstance(hub, SubscriptionHub)
        change = first.poll(2)
        assert change is not None and (change.key, change.row) == ("b", {"k": "b", "n": 2})
        write_batch(changelog, 1, {"a": 5})
        change = second.poll(2)
        assert change is not None and (change.key, change.row, change.batch_id) == (
            "a",
            {"k": "a"},
            1,
        )
        assert hub.subscriptions() == {"t": 2}
    finally:
        node._hub.close()
        node.stop()


def test_composite_keys_are_tuples(tmp_path: Any) -> None:
    import pyarrow as pa

    from sparkiq.testing import write_table

    arrow = pa.schema([("k", pa.string()), ("j", pa.int32()), ("v", pa.float64())])
    pairs = write_table(str(tmp_path), "pairs", key=["k", "j"], schema=arrow, partitions=3)
    hub = SubscriptionHub(str(tmp_path), poll_interval=0.005)
    try:
        with hub.subscribe("SELECT v FROM pairs WHERE j > 1 EMIT CHANGES") as sub:
            pairs.write([{"k": "a", "j": 1, "v": 0.5}, {"k": "a", "j": 2, "v": 1.5}])
            change = sub.poll(2)
            assert change is not None and (change.key, change.row) == (("a", 2), {"v": 1.5})
            pairs.write(deletes=[("a", 2)])
            change = sub.poll(2)
            assert change is not None and (change.key, change.row) == (("a", 2), None)
    finally:
        hub.close()


def test_windowed_keys_carry_the_window_start(tmp_path: Any) -> None:
    import time

    import pyarrow as pa

    from sparkiq.changelog import Changelog, CommitRecord, TableManifest
    from sparkiq.schema.codec import KeyCodec, RowCodec
    from sparkiq.schema.partitioner import Partitioner
    from sparkiq.schema.types import TableSchema

    window = {
        "type": "struct",
        "fields": [
            {"name": "start", "type": "timestamp", "nullable": True, "metadata": {}},
            {"name": "end", "type": "timestamp", "nullable": True, "metadata": {}},
        ],
    }
    fields = [
        {"name": "k", "type": "string", "nullable": True, "metadata": {}},
        {"name": "window", "type": window, "nullable": True, "metadata": {}},
        {"name": "n", "type": "long", "nullable": True, "metadata": {}},
    ]
    schema = TableSchema.from_spark_json({"type": "struct", "fields": fields}, ["k"], "window")
    changelog = Changelog(str(tmp_path), "win")
    TableManifest(name="win", schema=schema, partitions=2).ensure_written(
        changelog.storage, changelog.manifest_path
    )
    start, end = dt.datetime(2024, 5, 1, 10, 0), dt.datetime(2024, 5, 1, 10, 5)
    ts = pa.timestamp("us", tz="UTC")
    arrow = pa.table(
        {
            "k": ["a"],
            "window": pa.array(
                [
                    {
                        "start": start.astimezone(dt.UTC),
                        "end": end.astimezone(dt.UTC),
                    }
                ],
                pa.struct([("start", ts), ("end", ts)]),
            ),
            "n": pa.array([3], pa.int64()),
        }
    )
    key = KeyCodec(schema).encode_arrow(arrow)[0]
    partition = Partitioner(schema.key_types, 2)(("a",))
    segment = changelog.write_segment(partition, 0, {key: RowCodec(schema).encode_arrow(arrow)[0]})
    hub = SubscriptionHub(str(tmp_path), poll_interval=0.005)
    try:
        with hub.subscribe("SELECT n FROM win EMIT CHANGES") as sub:
            changelog.write_commit(
                CommitRecord("win", 0, "update", {partition: segment}, committed_at=time.time())
            )
            change = sub.poll(2)
            assert change is not None
            assert (change.key, change.row) == (("a", start), {"n": 3})
    finally:
        hub.close()
