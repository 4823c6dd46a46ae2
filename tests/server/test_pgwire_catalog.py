"""The emulated catalog through the catalog queries real tools send, and its walls.

The queries are the ones Grafana's PostgreSQL data source and DBeaver's PostgreSQL driver
send on connect and to list schemas, tables and columns, replayed verbatim through psycopg
(the applications themselves are not run here). Where the tool binds a parameter (DBeaver
through JDBC's ``?``), psycopg binds the same value.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from sparkiq import Node
from tests.server.test_pgwire import TOKEN, _psql, psql_needed
from tests.sql.tables import build_world

TABLES = ["ck", "dk", "ik", "lk", "t", "tk", "w", "win", "xk"]
CK = [
    ("region", "text"),
    ("id", "integer"),
    ("amount", "numeric"),
    ("ts", "timestamp with time zone"),
]

# -- Grafana: grafana-postgresql-datasource, src/postgresMetaQuery.ts ------------------------
# The schema constraint Grafana puts in its table and column lists (the search_path's schemas).
_GRAFANA_SEARCH_PATH = """
          quote_ident(table_schema) IN (
          SELECT
            CASE WHEN trim(s[i]) = '"$user"' THEN user ELSE trim(s[i]) END
          FROM
            generate_series(
              array_lower(string_to_array(current_setting('search_path'),','),1),
              array_upper(string_to_array(current_setting('search_path'),','),1)
            ) as i,
            string_to_array(current_setting('search_path'),',') s
          )"""
GRAFANA_VERSION = "SELECT current_setting('server_version_num')::int/100 as version"
GRAFANA_DATABASES = "SELECT datname FROM pg_database WHERE datistemplate = false ORDER BY datname"
GRAFANA_SCHEMAS = """SELECT schema_name FROM information_schema.schemata
    WHERE schema_name NOT IN ('information_schema', 'pg_catalog', 'pg_toast',
                              '_timescaledb_cache', '_timescaledb_catalog',
                              '_timescaledb_internal', '_timescaledb_config',
                              'timescaledb_information', 'timescaledb_experimental')
    ORDER BY schema_name"""
GRAFANA_TIMESCALEDB = "SELECT extversion FROM pg_extension WHERE extname = 'timescaledb'"
GRAFANA_TABLES = f"""SELECT
    CASE WHEN {_GRAFANA_SEARCH_PATH}
      THEN quote_ident(table_name)
      ELSE quote_ident(table_schema) || '.' || quote_ident(table_name)
    END AS "table"
    FROM information_schema.tables
    WHERE quote_ident(table_schema) NOT IN ('information_schema',
                             'pg_catalog',
                             '_timescaledb_cache',
                             '_timescaledb_catalog',
                             '_timescaledb_internal',
                             '_timescaledb_config',
                             'timescaledb_information',
                             'timescaledb_experimental')
    ORDER BY CASE WHEN {_GRAFANA_SEARCH_PATH} THEN 0 ELSE 1 END, 1"""
GRAFANA_TABLES_IN_SCHEMA = """SELECT quote_ident(table_name) AS "table"
    FROM information_schema.tables
    WHERE quote_ident(table_schema) = quote_ident('public')
    ORDER BY 1"""


def grafana_columns(table: str) -> str:
    part = "'" + table.replace("'", "''") + "'"
    return f"""SELECT quote_ident(column_name) AS "column", data_type AS "type"
    FROM information_schema.columns
    WHERE
      CASE WHEN array_length(parse_ident({part}),1) = 2
        THEN quote_ident(table_schema) = (parse_ident({part}))[1]
          AND quote_ident(table_name) = (parse_ident({part}))[2]
        ELSE quote_ident(table_name) = {part}
          AND {_GRAFANA_SEARCH_PATH}
      END"""


# -- DBeaver: plugins/org.jkiss.dbeaver.ext.postgresql, model/PostgreDataSource.java,
# PostgreDatabase.java, PostgreExecutionContext.java, PostgreSchema.java, PostgreUtils.java
# (with its default settings: no template or unavailable databases, no utility objects).
DBEAVER_DATABASES = (
    "SELECT db.oid,db.* FROM pg_catalog.pg_database db WHERE 1 = 1 AND datallowconn"
    " AND NOT datistemplate OR db.datname =%s\nORDER BY db.datname"
)
DBEAVER_DATABASE = "SELECT db.oid,db.* FROM pg_catalog.pg_database db WHERE datname=%s"
DBEAVER_ENUM_CHECK = "SELECT * FROM pg_catalog.pg_enum WHERE 1<>1 LIMIT 1"
DBEAVER_CONTEXT = "SELECT current_schema(),session_user"
DBEAVER_SCHEMAS = (
    "SELECT n.oid,n.*,d.description FROM pg_catalog.pg_namespace n\n"
    "LEFT OUTER JOIN pg_catalog.pg_description d ON d.objoid=n.oid AND d.objsubid=0"
    " AND d.classoid='pg_namespace'::regclass\n ORDER BY nspname"
)
DBEAVER_TYPCATEGORY_CHECK = "SELECT typcategory FROM pg_catalog.pg_type WHERE 1<>1 LIMIT 1"
DBEAVER_TYPES = (
    "SELECT t.oid,t.*,c.relkind,format_type(nullif(t.typbasetype, 0), t.typtypmod)"
    " as base_type_name, d.description\nFROM pg_catalog.pg_type t\n"
    "LEFT OUTER JOIN pg_catalog.pg_type et ON et.oid=t.typelem \n"
    "LEFT OUTER JOIN pg_catalog.pg_class c ON c.oid=t.typrelid\n"
    "LEFT OUTER JOIN pg_catalog.pg_description d ON t.oid=d.objoid\n"
    "WHERE t.typname IS NOT NULL\nAND (c.relkind IS NULL OR c.relkind = 'c')"
    " AND (et.typcategory IS NULL OR et.typcategory <> 'C')"
)
DBEAVER_SCHEMA_OID = (
    "SELECT s.oid as schema_id\nfrom pg_catalog.pg_namespace s\nWHERE s.nspname =%s"
)
DBEAVER_TABLES = (
    "SELECT c.oid,c.*,d.description,pg_catalog.pg_get_expr(c.relpartbound, c.oid)"
    " as partition_expr,  pg_catalog.pg_get_partkeydef(c.oid) as partition_key \n"
    "FROM pg_catalog.pg_class c\n"
    "LEFT OUTER JOIN pg_catalog.pg_description d ON d.objoid=c.oid AND d.objsubid=0"
    " AND d.classoid='pg_class'::regclass\n"
    "WHERE c.relnamespace=%s AND c.relkind not in ('i','I','c')"
)
DBEAVER_COLUMNS = (
    "SELECT c.relname,a.*,pg_catalog.pg_get_expr(ad.adbin, ad.adrelid, true) as def_value,"
    "dsc.description,dep.objid\nFROM pg_catalog.pg_attribute a\n"
    "INNER JOIN pg_catalog.pg_class c ON (a.attrelid=c.oid)\n"
    "LEFT OUTER JOIN pg_catalog.pg_attrdef ad ON (a.attrelid=ad.adrelid AND a.attnum = ad.adnum)\n"
    "LEFT OUTER JOIN pg_catalog.pg_description dsc"
    " ON (c.oid=dsc.objoid AND a.attnum = dsc.objsubid)\n"
    "LEFT OUTER JOIN pg_depend dep on dep.refobjid = a.attrelid AND dep.deptype = 'i' and"
    " dep.refobjsubid = a.attnum and dep.classid = dep.refclassid\n"
    "WHERE NOT a.attisdropped AND c.relkind not in ('i','I','c') AND c.oid=%s\n"
    "ORDER BY a.attnum"
)
DBEAVER_CONSTRAINTS = (
    "SELECT c.oid,c.*,t.relname as tabrelname,rt.relnamespace as refnamespace,d.description,"
    " case when c.contype='c' then \"substring\"(pg_get_constraintdef(c.oid), 7) else null end"
    " consrc_copy\nFROM pg_catalog.pg_constraint c\n"
    "INNER JOIN pg_catalog.pg_class t ON t.oid=c.conrelid\n"
    "LEFT OUTER JOIN pg_catalog.pg_class rt ON rt.oid=c.confrelid\n"
    "LEFT OUTER JOIN pg_catalog.pg_description d ON d.objoid=c.oid AND d.objsubid=0"
    " AND d.classoid='pg_constraint'::regclass\nWHERE t.relnamespace=%s"
)
DBEAVER_SETTINGS = "select * from pg_catalog.pg_settings"
DBEAVER_ROLES = (
    "SELECT a.oid,a.*,pd.description FROM pg_catalog.pg_roles a \n"
    "left join pg_catalog.pg_shdescription pd on a.oid = pd.objoid\nORDER BY a.rolname"
)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    root = str(tmp_path_factory.mktemp("pgcatalog"))
    build_world(root)
    with Node(root, store="memory", node_id="pg", token=TOKEN, pg_listen="127.0.0.1:0") as n:
        n.poll_once()
        yield n


@pytest.fixture(scope="module")
def conn(node: Node) -> Iterator[psycopg.Connection[Any]]:
    assert node.pg_address is not None
    host, port = node.pg_address
    dsn = f"host={host} port={port} user=grafana password={TOKEN} dbname=sparkiq"
    with psycopg.connect(dsn, autocommit=True) as c:
        yield c


def _dicts(conn: psycopg.Connection[Any], sql: str, *params: Any) -> list[dict[str, Any]]:
    cursor = conn.execute(sql, params or None)
    assert cursor.description is not None
    names = [d.name for d in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def test_grafana_lists_databases_schemas_tables_and_columns(
    conn: psycopg.Connection[Any],
) -> None:
    conn.execute("-- ping")  # pgx's Ping, Grafana's health check
    assert conn.pgconn.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert conn.execute(GRAFANA_VERSION).fetchall() == [(1400,)]
    assert conn.execute(GRAFANA_DATABASES).fetchall() == [("sparkiq",)]
    assert conn.execute(GRAFANA_SCHEMAS).fetchall() == [("public",)]
    assert conn.execute(GRAFANA_TIMESCALEDB).fetchall() == []
    assert [t for (t,) in conn.execute(GRAFANA_TABLES).fetchall()] == TABLES
    assert [t for (t,) in conn.execute(GRAFANA_TABLES_IN_SCHEMA).fetchall()] == TABLES
    assert conn.execute(grafana_columns("ck")).fetchall() == CK
    assert conn.execute(grafana_columns("public.ck")).fetchall() == CK
    assert conn.execute(grafana_columns("nope")).fetchall() == []
    window = dict(conn.execute(grafana_columns("win")).fetchall())
    assert window["window"] == "json"
    assert window["clicks"] == "bigint"


def test_dbeaver_reads_databases_schemas_types_tables_and_columns(
    conn: psycopg.Connection[Any], node: Node
) -> None:
    assert [d["datname"] for d in _dicts(conn, DBEAVER_DATABASES, "sparkiq")] == ["sparkiq"]
    assert [d["datname"] for d in _dicts(conn, DBEAVER_DATABASE, "sparkiq")] == ["sparkiq"]
    assert conn.execute("SELECT current_database()").fetchall() == [("sparkiq",)]
    version = conn.execute("SELECT version()").fetchone()
    assert version is not None and version[0].startswith("PostgreSQL 14.0 (sparkiq")
    assert conn.execute(DBEAVER_ENUM_CHECK).fetchall() == []
    context = conn.execute(DBEAVER_CONTEXT)
    assert context.fetchall() == [("public", "grafana")]
    assert context.description is not None
    assert [d.name for d in context.description] == ["current_schema", "session_user"]
    assert conn.execute("SHOW search_path").fetchall() == [("public",)]
    schemas = _dicts(conn, DBEAVER_SCHEMAS)
    assert [s["nspname"] for s in schemas] == ["information_schema", "pg_catalog", "public"]
    assert conn.execute(DBEAVER_TYPCATEGORY_CHECK).fetchall() == []
    types = {t["typname"]: t["oid"] for t in _dicts(conn, DBEAVER_TYPES)}
    for name, oid in {"text": 25, "int8": 20, "int4": 23, "numeric": 1700, "json": 114}.items():
        assert types[name] == oid
    (public,) = [s["oid"] for s in schemas if s["nspname"] == "public"]
    assert _dicts(conn, DBEAVER_SCHEMA_OID, "public") == [{"schema_id": public}]
    tables = _dicts(conn, DBEAVER_TABLES, public)
    assert sorted(t["relname"] for t in tables) == sorted(node.tables) == TABLES
    assert {t["relkind"] for t in tables} == {"r"}
    ck = next(t for t in tables if t["relname"] == "ck")
    columns = _dicts(conn, DBEAVER_COLUMNS, ck["oid"])
    assert [(c["attname"], c["atttypid"], c["atttypmod"]) for c in columns] == [
        ("region", 25, -1),
        ("id", 23, -1),
        ("amount", 1700, (10 << 16 | 2) + 4),  # numeric(10,2)
        ("ts", 1184, -1),
    ]
    assert [f.name for f in node.schema("ck").fields] == [c["attname"] for c in columns]
    constraints = {c["tabrelname"]: c for c in _dicts(conn, DBEAVER_CONSTRAINTS, public)}
    assert sorted(constraints) == TABLES  # one primary key each: the table's key columns
    assert {(c["conname"], c["contype"]) for c in constraints.values()} == {
        (f"{t}_pkey", "p") for t in TABLES
    }
    names = [f.name for f in node.schema("ck").fields]
    assert [names[n - 1] for n in constraints["ck"]["conkey"]] == list(
        node.schema("ck").key_columns
    )
    settings = {s["name"]: s["setting"] for s in _dicts(conn, DBEAVER_SETTINGS)}
    assert settings["server_encoding"] == "UTF8"
    assert [r["rolname"] for r in _dicts(conn, DBEAVER_ROLES)] == ["sparkiq"]


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM pg_catalog.pg_settings, duckdb_settings()",
        'SELECT * FROM "pg_catalog".pg_settings',
        "SELECT * FROM system.pg_catalog.pg_settings",
        "SELECT * FROM pg_class, duckdb_tables",
        "SELECT * FROM read_csv('/etc/passwd'), pg_class",
        "SELECT * FROM pg_class, query('SELECT 1')",
        "SELECT getvariable('x'), version()",
        "CREATE TABLE pg_catalog.mine (a int)",
        "COPY (SELECT * FROM pg_class) TO '/tmp/x.csv'",
    ],
)
def test_catalog_queries_reach_only_the_emulated_catalog(
    conn: psycopg.Connection[Any], sql: str
) -> None:
    with pytest.raises(psycopg.Error) as caught:
        conn.execute(sql)
    assert caught.value.sqlstate in ("42501", "42601"), caught.value
    assert conn.execute("SELECT n FROM t WHERE k = 'k005'").fetchall() == [(5,)]


def test_duckdb_settings_and_databases_never_show(conn: psycopg.Connection[Any]) -> None:
    # DuckDB's own values would come back here; the emulated catalog knows none of them.
    assert conn.execute("SELECT current_setting('memory_limit')").fetchall() == [(None,)]
    assert conn.execute("SELECT current_setting('TimeZone')").fetchall() == [("UTC",)]
    names = {d["datname"] for d in _dicts(conn, "SELECT * FROM pg_catalog.pg_database")}
    assert names == {"sparkiq"}
    settings = {s["name"] for s in _dicts(conn, "SELECT * FROM pg_settings")}
    assert "memory_limit" not in settings and "threads" not in settings
    tables = _dicts(conn, "SELECT table_schema, table_name FROM information_schema.tables")
    assert {t["table_schema"] for t in tables} == {"public"}
    assert sorted(t["table_name"] for t in tables) == TABLES
    # the stand-in tables are empty: a catalog query never returns the node's rows
    assert conn.execute("SELECT count(*) FROM t, pg_catalog.pg_class").fetchall() == [(0,)]


def test_catalog_names_in_literals_and_comments_leave_a_pull_query_alone(
    conn: psycopg.Connection[Any], node: Node
) -> None:
    sql = (
        "SELECT k, 'pg_catalog.version()' AS note FROM t -- not pg_class\n"
        "WHERE k = 'k005' /* current_user */"
    )
    assert (
        conn.execute(sql).fetchall() == node.sql(sql).tuples() == [("k005", "pg_catalog.version()")]
    )


@psql_needed
def test_psql_lists_schemas_and_databases(node: Node) -> None:
    done = _psql(node, "\\dn")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1:3] == ["Name|Owner", "public|sparkiq"]
    done = _psql(node, "\\l")
    assert done.returncode == 0, done.stderr
    assert [line.split("|")[:3] for line in done.stdout.splitlines()[2:3]] == [
        ["sparkiq", "sparkiq", "UTF8"]
    ]


def test_catalog_queries_get_the_sql_limits(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARKIQ_SQL_TIMEOUT_SECONDS", "1")
    monkeypatch.setenv("SPARKIQ_SQL_MAX_RESULT_ROWS", "10")
    monkeypatch.setenv("SPARKIQ_SQL_MAX_STATEMENT_CHARS", "2000")
    build_world(str(tmp_path))
    with Node(str(tmp_path), store="memory", pg_listen="127.0.0.1:0") as node:
        assert node.pg_address is not None
        host, port = node.pg_address
        with psycopg.connect(f"host={host} port={port} user=u dbname=d", autocommit=True) as c:
            joined = ", ".join(f"pg_catalog.pg_type t{i}" for i in range(12))
            # a filter DuckDB's statistics cannot decide before running the join
            summed = " || ".join(f"t{i}.typname" for i in range(12))
            started = time.monotonic()
            with pytest.raises(psycopg.Error) as caught:
                c.execute(f"SELECT count(*) FROM {joined} WHERE md5({summed}) = 'x'")
            assert caught.value.sqlstate == "57014"
            assert time.monotonic() - started < 30  # interrupted, not run to the end
            with pytest.raises(psycopg.Error) as caught:
                c.execute("SELECT * FROM pg_catalog.pg_type")  # 17 rows
            assert caught.value.sqlstate == "54000"
            with pytest.raises(psycopg.Error) as caught:
                c.execute("SELECT typname FROM pg_type WHERE " + " OR ".join(["oid = 25"] * 300))
            assert caught.value.sqlstate == "54000"
            assert "max_statement_chars" in str(caught.value)
            rows = c.execute("SELECT typname FROM pg_type WHERE oid = 25").fetchall()
            assert rows == [("text",)]
