"""Tables defined in SQL on the writer: CREATE TABLE ... AS SELECT runs as a Spark streaming
query whose table equals the same SELECT run by Spark in batch mode; SHOW TABLES, DESCRIBE and
DROP TABLE report on and act on the App's tables; bad statements are refused with errors that
name the problem, and write nothing."""

from __future__ import annotations

import json
import random
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from sparkiq import (
    App,
    ConfigError,
    LayoutMismatchError,
    Position,
    RangeQuery,
    SchemaError,
    SqlResult,
    StateQueryRequest,
    UnknownStoreError,
)
from sparkiq.spark.ddl import (
    CreateTable,
    DescribeTable,
    DropTable,
    ShowTables,
    parse,
    stream_references,
)
from tests.sql.push_spellings import PULL, PUSH, spell

EVENTS = "user string, page string, n long, ts timestamp"

VIEWS_BY_USER = (
    "CREATE TABLE views_by_user WITH (KEY = 'user', PARTITIONS = 4) AS "
    "SELECT user, count(*) AS views, sum(n) AS total FROM events GROUP BY user"
)
BY_USER_PAGE = """CREATE TABLE by_user_page WITH (KEY = (user, page), PARTITIONS = 3) AS
SELECT user, page, count(*) AS views, max(ts) AS last_seen
FROM events
GROUP BY user, page"""
PER_WINDOW = (
    "CREATE TABLE per_window WITH (KEY = 'user', WINDOW = 'window', PARTITIONS = 2) AS "
    "SELECT user, window(ts, '10 minutes') AS window, count(*) AS views "
    "FROM events GROUP BY user, window(ts, '10 minutes') EMIT CHANGES;"
)


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


def write_events(folder: Path, index: int, count: int, seed: int) -> None:
    rng = random.Random(seed)
    start = datetime(2026, 1, 1)
    rows = [
        {
            "user": f"u{rng.randrange(25)}",
            "page": f"p{rng.randrange(4)}",
            "n": rng.randrange(1, 6),
            "ts": (start + timedelta(seconds=rng.randrange(3600))).isoformat(),
        }
        for _ in range(count)
    ]
    (folder / f"{index:03d}.json").write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def batch_frame(spark: Any, folder: Path, statement: str) -> Any:
    """The statement's SELECT as a batch DataFrame over every file written so far."""
    create = parse(statement)
    assert isinstance(create, CreateTable)
    spark.read.schema(EVENTS).json(str(folder)).createOrReplaceTempView("events_batch")
    return spark.sql(create.select.replace("FROM events", "FROM events_batch"))


def batch_truth(spark: Any, folder: Path, statement: str) -> list[dict[str, Any]]:
    """The statement's SELECT run by Spark in batch mode: the ground truth."""
    return [r.asDict(recursive=True) for r in batch_frame(spark, folder, statement).collect()]


def scan(app: App, table: str) -> list[tuple[Any, dict[str, Any]]]:
    result = app.query(StateQueryRequest.in_store(table).with_query(RangeQuery.with_no_bounds()))
    return [pair for r in result.partition_results.values() for pair in r.result]


@pytest.fixture
def source(tmp_path: Path) -> Path:
    folder = tmp_path / "in"
    folder.mkdir()
    return folder


def test_tables_created_in_sql_equal_the_select_run_in_batch(
    spark: Any, source: Path, tmp_path: Path
) -> None:
    app = App(spark, state_dir=str(tmp_path / "state"))
    app.register_stream("events", spark.readStream.schema(EVENTS).json(str(source)))
    write_events(source, 0, 300, seed=1)
    created = app.sql(VIEWS_BY_USER)
    assert created.columns == ["table", "status"]
    assert created.rows == [{"table": "views_by_user", "status": "created"}]
    assert created.position == Position.empty()
    assert app.sql(BY_USER_PAGE).rows == [{"table": "by_user_page", "status": "created"}]
    app.start()
    try:
        app.process_all_available()
        write_events(source, 1, 200, seed=2)
        # Created after start(): its query starts at once, and reads both files.
        assert app.sql(PER_WINDOW).rows == [{"table": "per_window", "status": "started"}]
        app.process_all_available()

        truth = batch_truth(spark, source, VIEWS_BY_USER)
        assert len(truth) == 25
        assert {row["user"]: app.get("views_by_user", row["user"]) for row in truth} == {
            row["user"]: row for row in truth
        }
        assert len(scan(app, "views_by_user")) == len(truth)
        assert app.get("views_by_user", "nobody") is None

        truth = batch_truth(spark, source, BY_USER_PAGE)
        assert len(truth) > 50
        for row in truth:
            assert app.get("by_user_page", (row["user"], row["page"])) == row
        assert len(scan(app, "by_user_page")) == len(truth)

        truth = batch_truth(spark, source, PER_WINDOW)
        assert len(truth) > 100
        stored = {key: row for key, row in scan(app, "per_window")}
        assert stored == {(r["user"], r["window"]["start"]): r for r in truth}

        shown = app.sql("SHOW TABLES")
        assert shown.columns == [
            "table",
            "key_columns",
            "partitions",
            "windowed",
            "running",
            "defined_by",
        ]
        assert shown.rows == [
            {
                "table": "by_user_page",
                "key_columns": ["user", "page"],
                "partitions": 3,
                "windowed": False,
                "running": True,
                "defined_by": "sql",
            },
            {
                "table": "per_window",
                "key_columns": ["user"],
                "partitions": 2,
                "windowed": True,
                "running": True,
                "defined_by": "sql",
            },
            {
                "table": "views_by_user",
                "key_columns": ["user"],
                "partitions": 4,
                "windowed": False,
                "running": True,
                "defined_by": "sql",
            },
        ]
        described = app.sql("describe table `per_window`;")
        assert described.columns == ["column", "type", "nullable", "key", "window"]
        spark_types = dict(batch_frame(spark, source, PER_WINDOW).dtypes)
        assert [(r["column"], r["type"], r["key"], r["window"]) for r in described.rows] == [
            ("user", spark_types["user"], True, False),
            ("window", spark_types["window"], False, True),
            ("views", spark_types["views"], False, False),
        ]
        assert spark_types["window"] == "struct<start:timestamp,end:timestamp>"
        assert [r["type"] for r in app.sql("DESC by_user_page").rows] == [
            "string",
            "string",
            "bigint",
            "timestamp",
        ]
        assert app.tables["views_by_user"].sql == VIEWS_BY_USER
    finally:
        app.stop()


def test_drop_table_stops_its_query_and_keeps_or_deletes_its_changelog(
    spark: Any, source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyspark.sql import functions as F

    state = tmp_path / "state"
    stream = spark.readStream.schema(EVENTS).json(str(source))
    app = App(spark, state_dir=str(state))
    app.register_stream("events", stream)
    app.materialize("pages", stream.groupBy("page").agg(F.count("*").alias("views")), key="page")

    def page_truth() -> dict[str, dict[str, Any]]:
        batch = spark.read.schema(EVENTS).json(str(source))
        rows = batch.groupBy("page").agg(F.count("*").alias("views")).collect()
        return {r["page"]: r.asDict() for r in rows}

    app.sql(VIEWS_BY_USER)
    write_events(source, 0, 100, seed=3)
    app.start()
    try:
        app.process_all_available()
        assert [(r["table"], r["defined_by"]) for r in app.sql("SHOW TABLES").rows] == [
            ("pages", "materialize"),
            ("views_by_user", "sql"),
        ]
        # Pull queries go to the local node, text and options unchanged.
        assert app.node is not None
        calls: list[tuple[str, dict[str, Any]]] = []
        monkeypatch.setattr(app.node, "sql", lambda text, **kw: calls.append((text, kw)) or "ok")
        assert app.sql("SELECT * FROM pages", bound="x") == "ok"
        assert app.sql("-- why\nexplain select 1") == "ok"
        assert calls == [("SELECT * FROM pages", {"bound": "x"}), ("-- why\nexplain select 1", {})]
        monkeypatch.undo()

        before = {r["user"]: r for r in batch_truth(spark, source, VIEWS_BY_USER)}
        query = app.tables["views_by_user"].query
        dropped = app.sql("DROP TABLE views_by_user")
        assert dropped.rows == [{"table": "views_by_user", "status": "dropped"}]
        assert not query.isActive
        assert [r["table"] for r in app.sql("SHOW TABLES").rows] == ["pages"]
        assert (state / "tables" / "views_by_user" / "table.json").exists()

        write_events(source, 1, 100, seed=4)
        app.process_all_available()
        # The changelog stays: nodes keep serving the last batch the query wrote.
        assert {u: app.get("views_by_user", u) for u in before} == before
        assert {p: app.get("pages", p) for p in page_truth()} == page_truth()

        # Created again, the table resumes from its checkpoint and catches up.
        assert app.sql(VIEWS_BY_USER).rows == [{"table": "views_by_user", "status": "started"}]
        app.process_all_available()
        after = {r["user"]: r for r in batch_truth(spark, source, VIEWS_BY_USER)}
        assert {u: app.get("views_by_user", u) for u in after} == after
        assert len(list((state / "tables" / "views_by_user" / "commits").iterdir())) == 2

        query = app.tables["views_by_user"].query
        deleted = app.sql("DROP TABLE IF EXISTS views_by_user DELETE CHANGELOG")
        assert deleted.rows == [{"table": "views_by_user", "status": "dropped, changelog deleted"}]
        assert not query.isActive
        assert not (state / "tables" / "views_by_user").exists()
        assert not (state / "checkpoints" / "views_by_user").exists()
        assert not (state / "replicas" / "local" / "views_by_user").exists()
        assert (state / "replicas" / "local" / "pages").exists()
        with pytest.raises(UnknownStoreError, match="views_by_user"):
            app.get("views_by_user", "u1")
        assert app.node is not None and "views_by_user" not in app.node.tables

        # The other table is still written and served.
        write_events(source, 2, 50, seed=5)
        app.process_all_available()
        assert {p: app.get("pages", p) for p in page_truth()} == page_truth()

        assert app.sql("DROP TABLE IF EXISTS views_by_user").rows == [
            {"table": "views_by_user", "status": "does not exist"}
        ]
        with pytest.raises(
            UnknownStoreError,
            match=r"no table 'views_by_user' in this App; its tables are \['pages'\]",
        ):
            app.sql("DROP TABLE views_by_user")
        assert app.sql("DROP TABLE pages DELETE CHANGELOG").rows[0]["status"] == (
            "dropped, changelog deleted"
        )
        assert app.sql("SHOW TABLES").rows == []
        assert tree(state / "tables") == []
    finally:
        app.stop()


BAD_STATEMENTS = [
    # names
    (
        "CREATE TABLE t WITH (KEY = 'user') AS SELECT user, count(*) AS c FROM clicks "
        "GROUP BY user",
        ConfigError,
        r"unknown stream 'clicks' in the SELECT of 't': the registered streams are \['events'\]; "
        r"register it first with app.register_stream\('clicks', df\)",
    ),
    (
        "CREATE TABLE t WITH (KEY = 'user') AS "
        "SELECT e.user FROM events e JOIN db.users u ON e.user = u.id",
        ConfigError,
        r"unknown stream 'db.users'",
    ),
    (
        "CREATE TABLE t WITH (KEY = 'k') AS SELECT 1 AS k",
        ConfigError,
        r"the SELECT of 't' reads no stream: read one of the registered streams \['events'\]",
    ),
    (
        "CREATE TABLE t WITH (KEY = 'user') AS SELECT nope, count(*) AS c FROM events "
        "GROUP BY nope",
        ConfigError,
        r"Spark cannot run the SELECT of 't': \[UNRESOLVED_COLUMN",
    ),
    (
        "CREATE TABLE `1x` WITH (KEY = 'user') AS SELECT user FROM events",
        ConfigError,
        "invalid table name '1x'",
    ),
    # keys and options
    (
        "CREATE TABLE t AS SELECT user, count(*) AS c FROM events GROUP BY user",
        ConfigError,
        r"CREATE TABLE t needs a KEY naming the column\(s\) that identify a row",
    ),
    (
        "CREATE TABLE t WITH (PARTITIONS = 2) AS SELECT user FROM events",
        ConfigError,
        "needs a KEY",
    ),
    (
        "CREATE TABLE t WITH (KEY = 'page') AS SELECT user, count(*) AS c FROM events "
        "GROUP BY user",
        SchemaError,
        r"KEY column 'page' is not in the output of the SELECT of 't'; its columns are "
        r"\['user', 'c'\]: select it, or alias an expression AS page",
    ),
    (
        "CREATE TABLE t WITH (KEY = 'user, page') AS SELECT user, count(*) AS c FROM events "
        "GROUP BY user",
        SchemaError,
        "KEY column 'page' is not in the output",
    ),
    (
        "CREATE TABLE t WITH (KEY = 'user', WINDOW = 'w') AS "
        "SELECT user, count(*) AS c FROM events GROUP BY user",
        SchemaError,
        "WINDOW column 'w' is not in the output",
    ),
    (
        "CREATE TABLE t WITH (KEY = 'tags') AS SELECT user, array(page) AS tags FROM events",
        SchemaError,
        "key column 'tags' has type array<string>, which cannot be a key",
    ),
    (
        "CREATE TABLE t WITH (KEY = 'user') AS SELECT user, count(*) FROM events GROUP BY user",
        SchemaError,
        r"column 'count\(1\)' of the SELECT of 't' is not a plain name.*count\(\*\) AS views",
    ),
    ("CREATE TABLE t WITH (KEY = '') AS SELECT user FROM events", ConfigError, "KEY must name"),
    ("CREATE TABLE t WITH (KEY = 'a,,b') AS SELECT user FROM events", ConfigError, "KEY must name"),
    ("CREATE TABLE t WITH (KEY = (a, a)) AS SELECT user FROM events", ConfigError, "twice"),
    *[
        (
            f"CREATE TABLE t WITH (KEY = 'user', PARTITIONS = {bad}) AS SELECT user FROM events",
            ConfigError,
            rf"PARTITIONS must be a positive integer \(PARTITIONS = 8\), got {shown}",
        )
        for bad, shown in [("0", "0"), ("-3", "-3"), ("2.5", "2.5"), ("'8'", "'8'"), ("x", "x")]
    ],
    (
        "CREATE TABLE t WITH (KEY = 'user', PARTITIONS = 100000) AS SELECT user FROM events",
        ConfigError,
        "partitions=100000 exceeds the maximum of 4096",
    ),
    (
        "CREATE TABLE t WITH (KEY = 'user', OUTPUT_MODE = 'upsert') AS SELECT user FROM events",
        ConfigError,
        r"OUTPUT_MODE must be one of \['update', 'append', 'complete'\], got 'upsert'",
    ),
    (
        "CREATE TABLE t WITH (KEY = 'user', SHARDS = 3) AS SELECT user FROM events",
        ConfigError,
        "unknown option SHARDS; the options are KEY, PARTITIONS, WINDOW, OUTPUT_MODE, TOMBSTONE, "
        "KAFKA_TOPIC, KEY_FORMAT at line 1, column 36",
    ),
    (
        "CREATE TABLE t WITH (KEY = 'user', key = 'page') AS SELECT user FROM events",
        ConfigError,
        "option KEY is given twice",
    ),
    # syntax
    (
        "CREATE TABLE t WITH (KEY = 'user' AS SELECT user FROM events",
        ConfigError,
        r"expected , or \) in WITH \(...\) at line 1, column 35, found 'AS'. Expected CREATE "
        r"TABLE \[IF NOT EXISTS\] name WITH",
    ),
    ("CREATE TABLE t WITH (KEY = 'user') AS", ConfigError, "expected a SELECT after AS"),
    ("CREATE TABLE t WITH (KEY = 'user) AS SELECT 1", ConfigError, "unterminated"),
    ("DROP TABLE", ConfigError, "expected a table name after DROP TABLE, but the statement ended"),
    ("DROP TABLE t\n  now", ConfigError, "unexpected text.* at line 2, column 3, found 'now'"),
    ('DROP TABLE "t"', ConfigError, r"backticks.*found the string 't'"),
    ("DESCRIBE", ConfigError, r"Expected DESCRIBE \[TABLE\] name"),
    # not supported
    (
        "INSERT INTO t VALUES (1)",
        ConfigError,
        r"INSERT is not supported: a sparkiq table is written only by its Spark query. "
        r"App.sql\(\) runs CREATE TABLE",
    ),
    ("update t set n = 1", ConfigError, "UPDATE is not supported"),
    ("ALTER TABLE t ADD COLUMN x int", ConfigError, "ALTER is not supported"),
    (
        "CREATE STREAM s AS SELECT * FROM events",
        ConfigError,
        "CREATE STREAM is not supported. App.sql",
    ),
    (
        "CREATE OR REPLACE TABLE t AS SELECT 1",
        ConfigError,
        "DROP TABLE the table, then CREATE it again",
    ),
    ("CREATE TABLE t (user string)", ConfigError, "column definitions are not supported"),
    ("DROP VIEW v", ConfigError, "DROP VIEW is not supported"),
    ("SHOW STREAMS", ConfigError, "SHOW STREAMS is not supported"),
    (
        "CREATE TABLE t WITH (KEY = 'user') AS INSERT INTO x SELECT 1",
        ConfigError,
        "CREATE TABLE ... AS needs a SELECT, got INSERT",
    ),
    # unknown tables
    ("DESCRIBE nope", UnknownStoreError, r"no table 'nope' in this App; its tables are \[\]"),
    ("DROP TABLE nope DELETE CHANGELOG", UnknownStoreError, r"no table 'nope' in this App"),
]


@pytest.mark.parametrize(("statement", "error", "message"), BAD_STATEMENTS)
def test_bad_statements_are_refused_and_write_nothing(
    spark: Any, source: Path, tmp_path: Path, statement: str, error: type, message: str
) -> None:
    state = tmp_path / "state"
    app = App(spark, state_dir=str(state))
    app.register_stream("events", spark.readStream.schema(EVENTS).json(str(source)))
    with pytest.raises(error, match=message):
        app.sql(statement)
    assert app.tables == {}
    assert tree(state) == []


def test_existing_tables_streams_and_pull_queries_without_a_node(
    spark: Any, source: Path, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    app = App(spark, state_dir=str(state))
    stream = spark.readStream.schema(EVENTS).json(str(source))
    app.register_stream("events", stream)
    app.sql(VIEWS_BY_USER)
    with pytest.raises(
        ConfigError,
        match=r"table 'views_by_user' already exists in this App \(defined by CREATE TABLE\): "
        r"DROP TABLE views_by_user first, or use CREATE TABLE IF NOT EXISTS",
    ):
        app.sql(VIEWS_BY_USER)
    exists = app.sql(VIEWS_BY_USER.replace("TABLE", "TABLE IF NOT EXISTS", 1))
    assert exists.rows == [{"table": "views_by_user", "status": "already exists"}]
    app.materialize("raw", stream, key="user")
    with pytest.raises(ConfigError, match=r"defined by materialize\(\)"):
        app.sql("CREATE TABLE raw WITH (KEY = 'user') AS SELECT * FROM events")
    # Dropping a table that never started only forgets it.
    assert app.sql("DROP TABLE raw").rows == [{"table": "raw", "status": "dropped"}]
    assert list(app.tables) == ["views_by_user"]

    with pytest.raises(
        ConfigError,
        match="this App has none: start\\(\\) it with local_node=True, or query a Node or a Client",
    ):
        app.sql("SELECT * FROM views_by_user")
    with pytest.raises(ConfigError, match=r"options \['bound'\] apply to pull queries"):
        app.sql("SHOW TABLES", bound=1)
    with pytest.raises(ConfigError, match="needs a SQL string"):
        app.sql(42)  # type: ignore[arg-type]

    with pytest.raises(ConfigError, match="invalid stream name 'a-b'"):
        app.register_stream("a-b", stream)
    with pytest.raises(ConfigError, match=r"not streaming: build it from spark\.readStream"):
        app.register_stream("static", spark.range(3))
    with pytest.raises(ConfigError, match="needs a DataFrame, got list"):
        app.register_stream("rows", [1, 2])
    assert list(app.registered_streams) == ["events"]

    # A table created again under a new layout is refused by materialize, as always.
    other = App(spark, state_dir=str(state))
    other.register_stream("events", stream)
    app.start(local_node=False)
    app.stop()
    with pytest.raises(LayoutMismatchError, match="partitions 8 != 4"):
        other.sql(VIEWS_BY_USER.replace("PARTITIONS = 4", "PARTITIONS = 8"))


@pytest.mark.parametrize(
    ("statement", "expected"),
    [
        (
            "create table if not exists `v` with (key = (user, 'day'), window = 'w', "
            "output_mode = 'Complete', tombstone = gone, partitions = 2) as\n"
            "  SELECT user, day FROM e  EMIT CHANGES ;",
            CreateTable(
                name="v",
                select="SELECT user, day FROM e",
                key=("user", "day"),
                partitions=2,
                window="w",
                output_mode="complete",
                tombstone="gone",
                if_not_exists=True,
                text="create table if not exists `v` with (key = (user, 'day'), window = 'w', "
                "output_mode = 'Complete', tombstone = gone, partitions = 2) as\n"
                "  SELECT user, day FROM e  EMIT CHANGES ;",
            ),
        ),
        (
            "/* c */ CREATE TABLE v WITH (KEY = 'a , b') AS SELECT `a`, b -- x\nFROM e;",
            CreateTable(
                name="v",
                select="SELECT `a`, b -- x\nFROM e",
                key=("a", "b"),
                text="/* c */ CREATE TABLE v WITH (KEY = 'a , b') AS SELECT `a`, b -- x\nFROM e;",
            ),
        ),
        ("DROP TABLE IF EXISTS t DELETE CHANGELOG;", DropTable("t", True, True)),
        ("drop table `t`", DropTable("t")),
        ("show tables; -- all", ShowTables()),
        ("DESC TABLE t", DescribeTable("t")),
        ("describe window", DescribeTable("window")),
        ("SELECT * FROM t", None),
        ("-- c\nEXPLAIN SELECT 1", None),
        ("WITH a AS (SELECT 1) SELECT * FROM a", None),
    ],
)
def test_parse(statement: str, expected: object) -> None:
    assert parse(statement) == expected


def test_stream_references() -> None:
    assert stream_references(
        "WITH a AS (SELECT * FROM events) SELECT * FROM a JOIN Clicks c ON a.id = c.id "
        "WHERE a.id IN (SELECT id FROM db.ids)"
    ) == {"events", "Clicks", "db.ids"}
    assert stream_references("SELECT * FROM range(10)") == set()
    assert stream_references("SELECT * FROM events WHERE x = ANY FANCY SYNTAX (") is None


@pytest.mark.parametrize("template", PUSH + PULL)
def test_create_table_cuts_off_exactly_a_trailing_emit_changes(template: str) -> None:
    select = spell(template, "user", "events")
    create = parse(f"CREATE TABLE v WITH (KEY = 'user') AS {select}")
    assert isinstance(create, CreateTable)
    if template in PUSH:  # the clause is the last EMIT of each push spelling
        expected = select[: select.lower().rfind("emit")].strip()
    else:
        expected = select.strip().removesuffix(";")
    assert create.select == expected


def test_tables_are_created_from_every_spelling_of_emit_changes(
    spark: Any, source: Path, tmp_path: Path
) -> None:
    app = App(spark, state_dir=str(tmp_path / "state"))
    app.register_stream("events", spark.readStream.schema(EVENTS).json(str(source)))
    for i, template in enumerate(PUSH + PULL):
        select = spell(template, "user, count(*) AS views", "events GROUP BY user")
        created = app.sql(f"CREATE TABLE v{i} WITH (KEY = 'user') AS {select}")
        assert type(created) is SqlResult
        assert created.rows == [{"table": f"v{i}", "status": "created"}], template
        assert app.tables[f"v{i}"].dataframe.columns[:2] == ["user", "views"]
