"""The emulated Postgres catalog: ``pg_catalog`` and ``information_schema`` as small tables
that describe the node's tables, built into an in-memory DuckDB of their own.

DuckDB has a ``pg_catalog`` and an ``information_schema`` of its own, but they describe
DuckDB (its databases ``memory``/``system``/``temp``, its settings, its type ids), so the
endpoint never lets a client read them: its catalog lives in two schemas of its own,
:data:`PG_CATALOG` and :data:`INFORMATION_SCHEMA`, which
:mod:`~sparkiq.server.pg.translate` substitutes for the names a client writes. They hold:

- one namespace per schema a client sees (``pg_catalog``, ``public``, ``information_schema``),
  one database (:data:`DATABASE`), one role (:data:`OWNER`);
- one ``pg_class`` row per served table (``relkind 'r'``) with its columns in
  ``pg_attribute`` and ``information_schema.columns``, typed with the Postgres type of
  each column's kind (:data:`~sparkiq.schema.kinds.KINDS`; numeric with its typmod);
- ``pg_type`` rows of every type the endpoint sends (:data:`CATALOG_TYPES`);
- ``pg_settings`` rows of the parameters reported at login;
- empty tables for the objects sparkiq has none of (indexes, constraints, policies,
  descriptions, publications, extensions...), so tools' joins on them find nothing;
- ``public``: one *empty* table per served table (the node's rows are never here);
- macros for the Postgres functions catalog queries call (``format_type``, ``quote_ident``,
  ``parse_ident``, ``pg_get_expr``, ``has_table_privilege``...).

Object ids: namespaces and catalog relations have Postgres' own (``pg_catalog`` 11,
``public`` 2200, ``pg_class`` 1259...); served tables get 16384 and up in name order, so
an id stays the same while the set of tables does.

The catalog's shape (types, relations' columns, function macros) is data of its own:
:mod:`~sparkiq.server.pg.catalog_schema`; this module builds the database and fills the rows.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import duckdb

from sparkiq.schema.kinds import KINDS
from sparkiq.schema.types import TableSchema
from sparkiq.server.pg.catalog_schema import (
    CATALOG_TYPES,
    DATABASE,
    FIRST_TABLE_OID,
    INFO_TABLES,
    INFORMATION_SCHEMA,
    KEY_OID_OFFSET,
    MACROS,
    NAMESPACES,
    OWNER,
    PG_CATALOG,
    PG_TABLES,
    TYPES_BY_NAME,
    CatalogType,
    column_definitions,
    io_function,
)
from sparkiq.server.pg.pgextras import EXTRA_MACROS, EXTRA_PG_TABLES, EXTRA_SETTINGS

__all__ = ["build_catalog", "catalog_cursor", "column_type_name", "relation_oids"]


def relation_oids(tables: Sequence[str]) -> dict[str, int]:
    """The ``pg_class`` OID of each served table (16384 and up, in name order)."""
    return {name: FIRST_TABLE_OID + i for i, name in enumerate(sorted(tables))}


def _column_type(data_type: Any) -> tuple[CatalogType, int]:
    """A served column's ``pg_type`` row and typmod (-1 unless numeric(p,s))."""
    kind = KINDS.get(data_type.name)
    pg_type = TYPES_BY_NAME.get(kind.pg if kind is not None else "text", TYPES_BY_NAME["text"])
    if pg_type.name == "numeric":
        return pg_type, ((data_type.precision << 16) | data_type.scale) + 4
    return pg_type, -1


def column_type_name(data_type: Any) -> str:
    """The Postgres name of a served column's type, as ``information_schema`` shows it."""
    return _column_type(data_type)[0].display


def _quoted_if_needed(name: str) -> str:
    """``name`` as Postgres prints it in a definition: quoted only when it must be."""
    return name if re.fullmatch(r"[a-z_][a-z0-9_$]*", name) else _ident(name)


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _duck_type(pg_type: CatalogType, typmod: int) -> str:
    """The DuckDB type of a served column's empty stand-in table in ``public``."""
    if pg_type.name == "numeric" and typmod >= 4:
        return f"DECIMAL({(typmod - 4) >> 16},{(typmod - 4) & 65535})"
    return {
        "json": "JSON",
        "float4": "REAL",
        "float8": "DOUBLE",
        "timestamptz": "TIMESTAMPTZ",
    }.get(pg_type.name, pg_type.name)


def build_catalog(
    tables: Mapping[str, TableSchema], parameters: Mapping[str, str]
) -> duckdb.DuckDBPyConnection:
    """A locked in-memory DuckDB holding the emulated catalog of ``tables``."""
    db = duckdb.connect(
        ":memory:",
        config={
            "enable_external_access": False,
            "autoload_known_extensions": False,
            "autoinstall_known_extensions": False,
            "threads": 1,
            "memory_limit": "64MB",
        },
    )
    db.execute(f"CREATE SCHEMA {PG_CATALOG}")
    db.execute(f"CREATE SCHEMA {INFORMATION_SCHEMA}")
    db.execute("CREATE SCHEMA public")
    for name, spec in PG_TABLES.items():
        db.execute(f"CREATE TABLE {PG_CATALOG}.{name} ({', '.join(column_definitions(spec))})")
    for name, spec in INFO_TABLES.items():
        db.execute(
            f"CREATE TABLE {INFORMATION_SCHEMA}.{name} ({', '.join(column_definitions(spec))})"
        )
    for name, spec in EXTRA_PG_TABLES.items():
        db.execute(f"CREATE TABLE {PG_CATALOG}.{name} ({', '.join(column_definitions(spec))})")
    for macro in MACROS + EXTRA_MACROS:
        db.execute(macro.replace("CREATE MACRO ", "CREATE MACRO public.", 1))
    _fill(db, tables, parameters)
    # GLOBAL: every cursor (catalog_cursor) inherits it, and none may change it once locked
    db.execute("SET GLOBAL integer_division = true")  # Postgres' int / int is an int
    db.execute(_SEARCH_PATH)
    db.execute("SET lock_configuration = true")
    return db


# A session setting in DuckDB (it cannot be global): each cursor sets it.
_SEARCH_PATH = f"SET search_path = '{PG_CATALOG},public'"


def catalog_cursor(db: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """A connection of its own to ``db`` (made by :func:`build_catalog`), set up as ``db``
    is, for one query in one thread. Close it after the query."""
    cursor = db.cursor()
    try:
        cursor.execute(_SEARCH_PATH)
    except BaseException:
        cursor.close()
        raise
    return cursor


def _insert(db: duckdb.DuckDBPyConnection, table: str, rows: Sequence[Mapping[str, Any]]) -> None:
    if not rows:
        return
    names = list(rows[0])
    columns = ", ".join(_ident(n) for n in names)
    marks = ", ".join("?" for _ in names)
    db.executemany(
        f"INSERT INTO {table} ({columns}) VALUES ({marks})",
        [[row[n] for n in names] for row in rows],
    )


def _primary_key(schema: TableSchema) -> tuple[str, ...]:
    """The columns that identify a row: the key columns, and a windowed table's window."""
    window = (schema.window_column,) if schema.window_column else ()
    return (*schema.key_columns, *window)


def _primary_key_rows(
    table: str, oid: int, table_class: Mapping[str, Any], names: Sequence[str], attnums: list[int]
) -> list[tuple[str, list[dict[str, Any]]]]:
    r"""The catalog rows of ``table``'s primary key (its key columns), as tools read it:
    ``pg_constraint`` and ``pg_index`` (SQLAlchemy's ``inspect``, pgJDBC's
    ``getPrimaryKeys``), the index's ``pg_class`` and ``pg_indexes`` rows (psql's ``\d``),
    and ``information_schema``'s
    ``table_constraints`` and ``key_column_usage``. Keys are ``NOT NULL`` in ``pg_attribute``
    and ``columns`` (see :func:`_fill`): Spark's grouping keys may hold a null, but a served
    key column never does (a row's key is what finds it)."""
    index_oid, constraint_oid = oid + KEY_OID_OFFSET, oid + 2 * KEY_OID_OFFSET
    name = f"{table}_pkey"
    public = dict(NAMESPACES)["public"]
    index_class = {
        **table_class,
        "oid": index_oid,
        "relname": name,
        "relfilenode": index_oid,
        "relam": 403,  # btree
        "relkind": "i",
        "relnatts": len(attnums),
        "relhasindex": False,
    }
    index = {
        "indexrelid": index_oid,
        "indrelid": oid,
        "indnatts": len(attnums),
        "indnkeyatts": len(attnums),
        "indisunique": True,
        "indisprimary": True,
        "indisexclusion": False,
        "indimmediate": True,
        "indisclustered": False,
        "indisvalid": True,
        "indcheckxmin": False,
        "indisready": True,
        "indislive": True,
        "indisreplident": False,
        "indkey": attnums,
        "indcollation": [0] * len(attnums),
        "indclass": [0] * len(attnums),
        "indoption": [0] * len(attnums),
    }
    constraint = {
        "oid": constraint_oid,
        "conname": name,
        "connamespace": public,
        "contype": "p",
        "condeferrable": False,
        "condeferred": False,
        "convalidated": True,
        "conrelid": oid,
        "contypid": 0,
        "conindid": index_oid,
        "conparentid": 0,
        "confrelid": 0,
        "conislocal": True,
        "coninhcount": 0,
        "connoinherit": True,
        "conkey": attnums,
    }
    where = {"table_catalog": DATABASE, "table_schema": "public", "table_name": table}
    named = {"constraint_catalog": DATABASE, "constraint_schema": "public", "constraint_name": name}
    usage = [
        {**named, **where, "column_name": column, "ordinal_position": position}
        for position, column in enumerate(names, start=1)
    ]
    listed = ", ".join(_quoted_if_needed(n) for n in names)
    on = _quoted_if_needed(table)
    definition = f"CREATE UNIQUE INDEX {name} ON public.{on} USING btree ({listed})"
    return [
        (f"{PG_CATALOG}.pg_class", [index_class]),
        (
            f"{PG_CATALOG}.pg_indexes",
            [
                {
                    "schemaname": "public",
                    "tablename": table,
                    "indexname": name,
                    "tablespace": None,
                    "indexdef": definition,
                }
            ],
        ),
        (f"{PG_CATALOG}.pg_index", [index]),
        (f"{PG_CATALOG}.pg_constraint", [constraint]),
        (
            f"{INFORMATION_SCHEMA}.table_constraints",
            [
                {
                    **named,
                    **where,
                    "constraint_type": "PRIMARY KEY",
                    "is_deferrable": "NO",
                    "initially_deferred": "NO",
                    "enforced": "YES",
                }
            ],
        ),
        (f"{INFORMATION_SCHEMA}.key_column_usage", usage),
    ]


def _fill(
    db: duckdb.DuckDBPyConnection,
    tables: Mapping[str, TableSchema],
    parameters: Mapping[str, str],
) -> None:
    public = dict(NAMESPACES)["public"]
    pg_catalog = dict(NAMESPACES)["pg_catalog"]
    _insert(
        db,
        f"{PG_CATALOG}.pg_namespace",
        [{"oid": oid, "nspname": name, "nspowner": 10} for name, oid in NAMESPACES],
    )
    _insert(
        db,
        f"{INFORMATION_SCHEMA}.schemata",
        [
            {"catalog_name": DATABASE, "schema_name": name, "schema_owner": OWNER}
            for name, _ in NAMESPACES
        ],
    )
    _insert(
        db,
        f"{PG_CATALOG}.pg_database",
        [
            {
                "oid": 16_383,
                "datname": DATABASE,
                "datdba": 10,
                "encoding": 6,
                "datlocprovider": "c",
                "datistemplate": False,
                "datallowconn": True,
                "datconnlimit": -1,
                "dattablespace": 1663,
                "datcollate": "C.UTF-8",
                "datctype": "C.UTF-8",
            }
        ],
    )
    _insert(
        db,
        f"{PG_CATALOG}.pg_roles",
        [
            {
                "oid": 10,
                "rolname": OWNER,
                "rolsuper": False,
                "rolinherit": True,
                "rolcreaterole": False,
                "rolcreatedb": False,
                "rolcanlogin": True,
                "rolreplication": False,
                "rolconnlimit": -1,
                "rolbypassrls": False,
            }
        ],
    )
    _insert(
        db,
        f"{PG_CATALOG}.pg_am",
        [
            {"oid": 2, "amname": "heap", "amhandler": "heap_tableam_handler", "amtype": "t"},
            # the primary key indexes' access method (pg_class.relam 403)
            {"oid": 403, "amname": "btree", "amhandler": "bthandler", "amtype": "i"},
        ],
    )
    _insert(
        db,
        f"{PG_CATALOG}.pg_tablespace",
        [{"oid": 1663, "spcname": "pg_default", "spcowner": 10}],
    )
    _insert(
        db,
        f"{PG_CATALOG}.pg_type",
        [
            {
                "oid": t.oid,
                "typname": t.name,
                "typnamespace": pg_catalog,
                "typowner": 10,
                "typlen": t.length,
                "typbyval": 0 < t.length <= 8,
                "typtype": "b",
                "typcategory": t.category,
                "typispreferred": t.name in ("bool", "text", "float8", "oid", "timestamptz"),
                "typisdefined": True,
                "typdelim": ",",
                "typrelid": 0,
                "typelem": 0,
                "typarray": 0,
                "typinput": io_function(t.name, "in"),
                "typoutput": io_function(t.name, "out"),
                "typreceive": io_function(t.name, "recv"),
                "typsend": io_function(t.name, "send"),
                "typalign": "d" if t.length == 8 else "i",
                "typstorage": "x" if t.length < 0 else "p",
                "typnotnull": False,
                "typbasetype": 0,
                "typtypmod": -1,
                "typndims": 0,
                "typcollation": 100 if t.category == "S" else 0,
            }
            for t in CATALOG_TYPES
        ],
    )
    _insert(
        db,
        f"{PG_CATALOG}.pg_settings",
        [
            {"name": name, "setting": value, "context": "user", "vartype": "string"}
            for name, value in sorted({**EXTRA_SETTINGS, **parameters}.items())
        ],
    )
    oids = relation_oids(list(tables))
    classes, attributes, info_tables, info_columns, pg_tables = [], [], [], [], []
    keys: dict[str, list[dict[str, Any]]] = {}
    for table, oid in oids.items():
        schema = tables[table]
        key_names = _primary_key(schema)
        classes.append(
            {
                "oid": oid,
                "relname": table,
                "relnamespace": public,
                "reltype": 0,
                "reloftype": 0,
                "relowner": 10,
                "relam": 2,
                "relfilenode": oid,
                "reltablespace": 0,
                "relpages": 0,
                "reltuples": -1.0,
                "relallvisible": 0,
                "reltoastrelid": 0,
                "relhasindex": True,
                "relisshared": False,
                "relpersistence": "p",
                "relkind": "r",
                "relnatts": len(schema.fields),
                "relchecks": 0,
                "relhasrules": False,
                "relhastriggers": False,
                "relhassubclass": False,
                "relrowsecurity": False,
                "relforcerowsecurity": False,
                "relispopulated": True,
                "relreplident": "d",
                "relispartition": False,
                "relrewrite": 0,
            }
        )
        info_tables.append(
            {
                "table_catalog": DATABASE,
                "table_schema": "public",
                "table_name": table,
                "table_type": "BASE TABLE",
                "is_insertable_into": "NO",
                "is_typed": "NO",
            }
        )
        pg_tables.append(
            {
                "schemaname": "public",
                "tablename": table,
                "tableowner": OWNER,
                "hasindexes": False,
                "hasrules": False,
                "hastriggers": False,
                "rowsecurity": False,
            }
        )
        columns = []
        for number, f in enumerate(schema.fields, start=1):
            pg_type, typmod = _column_type(f.type)
            columns.append(f"{_ident(f.name)} {_duck_type(pg_type, typmod)}")
            attributes.append(
                {
                    "attrelid": oid,
                    "attname": f.name,
                    "atttypid": pg_type.oid,
                    "attstattarget": -1,
                    "attlen": pg_type.length,
                    "attnum": number,
                    "attndims": 0,
                    "attcacheoff": -1,
                    "atttypmod": typmod,
                    "attbyval": 0 < pg_type.length <= 8,
                    "attalign": "d" if pg_type.length == 8 else "i",
                    "attstorage": "x" if pg_type.length < 0 else "p",
                    "attcompression": "",
                    "attnotnull": f.name in key_names,
                    "atthasdef": False,
                    "atthasmissing": False,
                    "attidentity": "",
                    "attgenerated": "",
                    "attisdropped": False,
                    "attislocal": True,
                    "attinhcount": 0,
                    "attcollation": 100 if pg_type.category == "S" else 0,
                }
            )
            numeric = pg_type.name == "numeric" and typmod >= 4
            info_columns.append(
                {
                    "table_catalog": DATABASE,
                    "table_schema": "public",
                    "table_name": table,
                    "column_name": f.name,
                    "ordinal_position": number,
                    "is_nullable": "NO" if f.name in key_names else "YES",
                    "data_type": pg_type.display,
                    "numeric_precision": (typmod - 4) >> 16 if numeric else None,
                    "numeric_precision_radix": 10 if numeric else None,
                    "numeric_scale": (typmod - 4) & 65535 if numeric else None,
                    "udt_catalog": DATABASE,
                    "udt_schema": "pg_catalog",
                    "udt_name": pg_type.name,
                    "dtd_identifier": str(number),
                    "is_self_referencing": "NO",
                    "is_identity": "NO",
                    "is_generated": "NEVER",
                    "is_updatable": "NO",
                }
            )
        db.execute(f"CREATE TABLE public.{_ident(table)} ({', '.join(columns)})")
        attnums = [n for n, f in enumerate(schema.fields, start=1) if f.name in key_names]
        for relation, rows in _primary_key_rows(table, oid, classes[-1], key_names, attnums):
            keys.setdefault(relation, []).extend(rows)
    _insert(db, f"{PG_CATALOG}.pg_class", classes)
    _insert(db, f"{PG_CATALOG}.pg_attribute", attributes)
    _insert(db, f"{PG_CATALOG}.pg_tables", pg_tables)
    _insert(db, f"{INFORMATION_SCHEMA}.tables", info_tables)
    _insert(db, f"{INFORMATION_SCHEMA}.columns", info_columns)
    for relation, rows in keys.items():
        _insert(db, relation, rows)
