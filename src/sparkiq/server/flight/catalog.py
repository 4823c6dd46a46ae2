"""The Flight SQL metadata answers: catalogs, schemas, tables, table types, keys, SQL info.

Each answer is an Arrow table in the schema the Flight SQL protocol fixes for that command
(column names, types and nullability are what clients read by position), built from the
node's tables as the current principal may see them (:func:`sparkiq.principals.readable`):
a table outside a principal's grants is not listed, as on the Postgres endpoint.

A node is one catalog, ``sparkiq``, with one schema, ``public`` (the names the Postgres
endpoint gives, so a tool sees the same tree on both). Every table is of type ``TABLE``;
its primary key is its key columns, then the window column for a windowed table (the key
a row is stored under). The Arrow schema a table's ``SELECT *`` returns is the one
:func:`sparkiq.sql.result_schema.from_table` gives, with key columns not null.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pyarrow as pa

from sparkiq._version import __version__
from sparkiq.principals import readable
from sparkiq.schema.types import TableSchema
from sparkiq.sql.result_schema import from_table

__all__ = [
    "CATALOG",
    "DB_SCHEMA",
    "catalogs",
    "db_schemas",
    "like",
    "primary_keys",
    "foreign_keys",
    "sql_info",
    "table_arrow_schema",
    "table_types",
    "tables",
]

CATALOG = "sparkiq"
DB_SCHEMA = "public"
TABLE_TYPE = "TABLE"

_TEXT = pa.utf8()
CATALOGS_SCHEMA = pa.schema([pa.field("catalog_name", _TEXT, nullable=False)])
DB_SCHEMAS_SCHEMA = pa.schema(
    [pa.field("catalog_name", _TEXT), pa.field("db_schema_name", _TEXT, nullable=False)]
)
TABLES_SCHEMA = pa.schema(
    [
        pa.field("catalog_name", _TEXT),
        pa.field("db_schema_name", _TEXT),
        pa.field("table_name", _TEXT, nullable=False),
        pa.field("table_type", _TEXT, nullable=False),
    ]
)
TABLES_WITH_SCHEMA = TABLES_SCHEMA.append(pa.field("table_schema", pa.binary(), nullable=False))
TABLE_TYPES_SCHEMA = pa.schema([pa.field("table_type", _TEXT, nullable=False)])
PRIMARY_KEYS_SCHEMA = pa.schema(
    [
        pa.field("catalog_name", _TEXT),
        pa.field("db_schema_name", _TEXT),
        pa.field("table_name", _TEXT, nullable=False),
        pa.field("column_name", _TEXT, nullable=False),
        pa.field("key_name", _TEXT),
        pa.field("key_sequence", pa.int32(), nullable=False),
    ]
)
FOREIGN_KEYS_SCHEMA = pa.schema(
    [
        pa.field("pk_catalog_name", _TEXT),
        pa.field("pk_db_schema_name", _TEXT),
        pa.field("pk_table_name", _TEXT, nullable=False),
        pa.field("pk_column_name", _TEXT, nullable=False),
        pa.field("fk_catalog_name", _TEXT),
        pa.field("fk_db_schema_name", _TEXT),
        pa.field("fk_table_name", _TEXT, nullable=False),
        pa.field("fk_column_name", _TEXT, nullable=False),
        pa.field("key_sequence", pa.int32(), nullable=False),
        pa.field("fk_key_name", _TEXT),
        pa.field("pk_key_name", _TEXT),
        pa.field("update_rule", pa.uint8(), nullable=False),
        pa.field("delete_rule", pa.uint8(), nullable=False),
    ]
)

# The SqlInfo value: a dense union whose type codes are fixed by the protocol.
_INFO_VALUE = pa.dense_union(
    [
        pa.field("string_value", _TEXT),
        pa.field("bool_value", pa.bool_()),
        pa.field("bigint_value", pa.int64()),
        pa.field("int32_bitmask", pa.int32()),
        pa.field("string_list", pa.list_(pa.field("item", _TEXT))),
        pa.field(
            "int32_to_int32_list_map",
            pa.map_(pa.int32(), pa.list_(pa.field("item", pa.int32()))),
        ),
    ],
    type_codes=[0, 1, 2, 3, 4, 5],
)
SQL_INFO_SCHEMA = pa.schema(
    [pa.field("info_name", pa.uint32(), nullable=False), pa.field("value", _INFO_VALUE)]
)

_STRING, _BOOL, _BIGINT, _INT32, _LIST = 0, 1, 2, 3, 4


def sql_info_values(limits_timeout: float, max_statement_chars: int) -> dict[int, tuple[int, Any]]:
    """SqlInfo id -> (union type code, value): what a driver asks at connect (server name
    and version, read-only, transactions, cancel) and what JDBC's ``DatabaseMetaData`` reads
    (identifier case and quote, DDL, null ordering, limits). Ids are the protocol's."""
    return {
        0: (_STRING, "sparkiq"),  # FLIGHT_SQL_SERVER_NAME
        1: (_STRING, __version__),  # FLIGHT_SQL_SERVER_VERSION
        2: (_STRING, pa.__version__),  # FLIGHT_SQL_SERVER_ARROW_VERSION
        3: (_BOOL, True),  # FLIGHT_SQL_SERVER_READ_ONLY
        4: (_BOOL, True),  # FLIGHT_SQL_SERVER_SQL
        5: (_BOOL, False),  # FLIGHT_SQL_SERVER_SUBSTRAIT
        8: (_INT32, 0),  # FLIGHT_SQL_SERVER_TRANSACTION: SQL_SUPPORTED_TRANSACTION_NONE
        9: (_BOOL, False),  # FLIGHT_SQL_SERVER_CANCEL
        10: (_BOOL, False),  # FLIGHT_SQL_SERVER_BULK_INGESTION
        11: (_BOOL, False),  # FLIGHT_SQL_SERVER_INGEST_TRANSACTIONS_SUPPORTED
        100: (_INT32, int(limits_timeout * 1000)),  # STATEMENT_TIMEOUT (milliseconds)
        101: (_INT32, 0),  # TRANSACTION_TIMEOUT: none
        500: (_BOOL, False),  # SQL_DDL_CATALOG
        501: (_BOOL, False),  # SQL_DDL_SCHEMA
        502: (_BOOL, False),  # SQL_DDL_TABLE
        503: (_INT32, 3),  # SQL_IDENTIFIER_CASE: lowercase (as DuckDB folds them)
        504: (_STRING, '"'),  # SQL_IDENTIFIER_QUOTE_CHAR
        505: (_INT32, 1),  # SQL_QUOTED_IDENTIFIER_CASE: case-insensitive
        506: (_BOOL, True),  # SQL_ALL_TABLES_ARE_SELECTABLE (those listed are readable)
        507: (_INT32, 3),  # SQL_NULL_ORDERING: nulls at the end (DuckDB's default)
        557: (_BIGINT, max_statement_chars),  # SQL_MAX_STATEMENT_LENGTH
        563: (_BOOL, False),  # SQL_TRANSACTIONS_SUPPORTED
    }


def sql_info(values: dict[int, tuple[int, Any]], wanted: Sequence[int]) -> pa.Table:
    """The rows of ``wanted`` ids (all known ones when empty) in ``values``; an id this
    endpoint does not know is left out, as the protocol allows."""
    ids = [i for i in (wanted or sorted(values)) if i in values]
    codes: list[int] = []
    offsets: list[int] = []
    children: list[list[Any]] = [[] for _ in range(6)]
    for info in ids:
        code, value = values[info]
        codes.append(code)
        offsets.append(len(children[code]))
        children[code].append(value)
    arrays = [
        pa.array(values_, type=field.type)
        for values_, field in zip(children, _INFO_VALUE, strict=True)
    ]
    union = pa.UnionArray.from_dense(
        pa.array(codes, pa.int8()),
        pa.array(offsets, pa.int32()),
        arrays,
        [f.name for f in _INFO_VALUE],
        [0, 1, 2, 3, 4, 5],
    )
    return pa.Table.from_arrays([pa.array(ids, pa.uint32()), union], schema=SQL_INFO_SCHEMA)


def like(pattern: str | None) -> Callable[[str], bool]:
    """A test of names against a Flight SQL filter pattern (SQL ``LIKE``: ``%`` any run,
    ``_`` one character; matched case-sensitively); None or absent matches everything."""
    if pattern is None:
        return lambda _: True
    parts = [".*" if c == "%" else "." if c == "_" else re.escape(c) for c in pattern]
    compiled = re.compile("".join(parts), re.DOTALL)
    return lambda name: compiled.fullmatch(name) is not None


def _in_catalog(catalog: str | None) -> bool:
    return catalog is None or catalog == CATALOG


def catalogs() -> pa.Table:
    return pa.Table.from_pylist([{"catalog_name": CATALOG}], schema=CATALOGS_SCHEMA)


def db_schemas(catalog: str | None, pattern: str | None) -> pa.Table:
    rows = []
    if _in_catalog(catalog) and like(pattern)(DB_SCHEMA):
        rows.append({"catalog_name": CATALOG, "db_schema_name": DB_SCHEMA})
    return pa.Table.from_pylist(rows, schema=DB_SCHEMAS_SCHEMA)


def table_types() -> pa.Table:
    return pa.Table.from_pylist([{"table_type": TABLE_TYPE}], schema=TABLE_TYPES_SCHEMA)


def table_arrow_schema(name: str, schema: TableSchema) -> pa.Schema:
    """The Arrow schema of ``SELECT * FROM name``, key columns not null, each field naming
    its table as the protocol's column metadata does."""
    keys = set(_key_of(schema))
    typed = from_table(schema, [(f.name, f.name) for f in schema.fields])
    fields = []
    for field in typed:
        meta = dict(field.metadata or {})
        meta.update(
            {
                b"ARROW:FLIGHT:SQL:CATALOG_NAME": CATALOG.encode(),
                b"ARROW:FLIGHT:SQL:DB_SCHEMA_NAME": DB_SCHEMA.encode(),
                b"ARROW:FLIGHT:SQL:TABLE_NAME": name.encode(),
                b"ARROW:FLIGHT:SQL:IS_READ_ONLY": b"1",
            }
        )
        fields.append(field.with_nullable(field.name not in keys).with_metadata(meta))
    return pa.schema(fields)


def tables(
    names: Iterable[str],
    schema_of: Callable[[str], TableSchema],
    *,
    catalog: str | None,
    schema_pattern: str | None,
    table_pattern: str | None,
    types: Sequence[str],
    include_schema: bool,
) -> pa.Table:
    """The tables the current principal may read, filtered as the command asks."""
    wanted = (
        _in_catalog(catalog)
        and like(schema_pattern)(DB_SCHEMA)
        and (not types or TABLE_TYPE in types)
    )
    matches = like(table_pattern)
    rows: list[dict[str, Any]] = []
    for name in sorted(readable(names)) if wanted else []:
        if not matches(name):
            continue
        row: dict[str, Any] = {
            "catalog_name": CATALOG,
            "db_schema_name": DB_SCHEMA,
            "table_name": name,
            "table_type": TABLE_TYPE,
        }
        if include_schema:
            row["table_schema"] = table_arrow_schema(name, schema_of(name)).serialize().to_pybytes()
        rows.append(row)
    return pa.Table.from_pylist(
        rows, schema=TABLES_WITH_SCHEMA if include_schema else TABLES_SCHEMA
    )


def _key_of(schema: TableSchema) -> tuple[str, ...]:
    window = (schema.window_column,) if schema.window_column else ()
    return (*schema.key_columns, *window)


def primary_keys(
    names: Iterable[str],
    schema_of: Callable[[str], TableSchema],
    *,
    catalog: str | None,
    db_schema: str | None,
    table: str,
) -> pa.Table:
    """The key columns of ``table`` (none for a table not served or not readable)."""
    rows = []
    here = _in_catalog(catalog) and db_schema in (None, DB_SCHEMA)
    if here and table in readable(names):
        for sequence, column in enumerate(_key_of(schema_of(table)), start=1):
            rows.append(
                {
                    "catalog_name": CATALOG,
                    "db_schema_name": DB_SCHEMA,
                    "table_name": table,
                    "column_name": column,
                    "key_name": f"{table}_pkey",
                    "key_sequence": sequence,
                }
            )
    return pa.Table.from_pylist(rows, schema=PRIMARY_KEYS_SCHEMA)


def foreign_keys() -> pa.Table:
    """Imported and exported keys: tables of a node reference none."""
    return FOREIGN_KEYS_SCHEMA.empty_table()
