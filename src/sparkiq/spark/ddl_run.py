"""Running the DDL statements :mod:`sparkiq.spark.ddl` parses, on the writer: ``CREATE
TABLE ... AS SELECT`` plans its SELECT with Spark and materializes it, ``DROP TABLE`` stops a
table, ``SHOW TABLES`` and ``DESCRIBE`` answer from the App's tables.

It never sees the App itself: :func:`execute` gets a :class:`Writer`, the App's tables and
streams and the two things DDL may do to it (materialize a table, drop one), so imports go
one way (the App imports this module).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa

from sparkiq.changelog.manifest import TableManifest
from sparkiq.errors import ConfigError, SchemaError, UnknownStoreError
from sparkiq.spark.ddl import (
    IDENTIFIER,
    CreateTable,
    DescribeTable,
    DropTable,
    ShowTables,
    Statement,
    stream_references,
)
from sparkiq.sql.result import SqlResult
from sparkiq.sql.result_schema import strings

__all__ = ["Materialize", "TableView", "Writer", "execute"]


class TableView(Protocol):
    """What DDL reads of one of the App's tables (``sparkiq.spark.app.Table`` is one)."""

    manifest: TableManifest
    query: Any  # the running StreamingQuery, or None
    sql: str | None  # the CREATE TABLE statement that defined it; None: materialize()


class Materialize(Protocol):
    """``App.materialize``: declare (and, once started, start) a table."""

    def __call__(
        self,
        name: str,
        df: Any,
        key: str | Sequence[str],
        partitions: int = ...,
        *,
        window: str | None = ...,
        tombstone: str | None = ...,
        output_mode: str = ...,
    ) -> TableView: ...


@dataclass(frozen=True, slots=True)
class Writer:
    """What a DDL statement may read of and do to the App running it (built per statement).

    - ``spark``: the SparkSession that plans a ``CREATE TABLE``'s SELECT.
    - ``tables``, ``streams``: the App's tables and registered streams, by name.
    - ``materialize``: declare a table (its result's ``sql`` is then set to the statement).
    - ``drop(name, delete_changelog)``: stop table ``name`` and forget it (``DROP TABLE``).
    """

    spark: Any
    tables: Mapping[str, TableView]
    streams: Mapping[str, Any]
    materialize: Materialize
    drop: Callable[[str, bool], None]


def execute(writer: Writer, statement: Statement) -> SqlResult:
    """Run a parsed DDL statement on the App that ``writer`` stands for."""
    if isinstance(statement, CreateTable):
        return _create(writer, statement)
    if isinstance(statement, DropTable):
        return _drop(writer, statement)
    if isinstance(statement, ShowTables):
        return _show_tables(writer)
    return _describe(writer, statement)


def _status(table: str, status: str) -> SqlResult:
    columns = ["table", "status"]
    return SqlResult(columns, [{"table": table, "status": status}], schema=strings(columns))


def _create(writer: Writer, create: CreateTable) -> SqlResult:
    name = create.name
    existing = writer.tables.get(name)
    if existing is not None:
        if create.if_not_exists:
            return _status(name, "already exists")
        how = "CREATE TABLE" if existing.sql else "materialize()"
        raise ConfigError(
            f"table {name!r} already exists in this App (defined by {how}): DROP TABLE {name} "
            "first, or use CREATE TABLE IF NOT EXISTS",
            store=name,
        )
    df = _select(writer, create)
    columns = list(df.columns)
    for role, names in (("KEY", create.key), ("WINDOW", (create.window,))):
        for column in names:
            if column is not None and column not in columns:
                raise SchemaError(
                    f"{role} column {column!r} is not in the output of the SELECT of {name!r}; "
                    f"its columns are {columns}: select it, or alias an expression AS {column}",
                    store=name,
                )
    unnamed = [c for c in columns if not IDENTIFIER.match(c)]
    if unnamed:
        raise SchemaError(
            f"column {unnamed[0]!r} of the SELECT of {name!r} is not a plain name, so pull "
            "queries could not name it: give it an alias (count(*) AS views)",
            store=name,
        )
    options: dict[str, Any] = {"window": create.window, "tombstone": create.tombstone}
    options.update(kafka_topic=create.kafka_topic, kafka_key_format=create.key_format)
    if create.partitions is not None:
        options["partitions"] = create.partitions
    if create.output_mode is not None:
        options["output_mode"] = create.output_mode
    table = writer.materialize(name, df, key=list(create.key), **options)
    table.sql = create.text
    return _status(name, "started" if table.query is not None else "created")


def _select(writer: Writer, create: CreateTable) -> Any:
    """The streaming DataFrame of the statement's SELECT, planned by Spark."""
    streams = writer.streams
    by_lower = {n.lower(): n for n in streams}
    references = stream_references(create.select)
    if references is None:  # Spark parses what sqlglot cannot; it resolves the names itself
        used = list(streams)
    else:
        unknown = sorted(r for r in references if r.lower() not in by_lower)
        if unknown:
            raise ConfigError(
                f"unknown stream {unknown[0]!r} in the SELECT of {create.name!r}: the "
                f"registered streams are {sorted(streams)}; register it first with "
                f"app.register_stream({unknown[0]!r}, df)",
                store=create.name,
            )
        if not references:
            raise ConfigError(
                f"the SELECT of {create.name!r} reads no stream: read one of the registered "
                f"streams {sorted(streams)} in its FROM",
                store=create.name,
            )
        used = [by_lower[r.lower()] for r in references]
    for stream in used:
        streams[stream].createOrReplaceTempView(stream)
    try:
        df = writer.spark.sql(create.select)
    except Exception as exc:  # Spark's AnalysisException/ParseException: the user's SQL
        lines = [line for line in str(exc).splitlines() if line.strip()]
        reason = lines[0] if lines else type(exc).__name__
        raise ConfigError(
            f"Spark cannot run the SELECT of {create.name!r}: {reason}", store=create.name
        ) from exc
    if not df.isStreaming:
        raise ConfigError(
            f"the SELECT of {create.name!r} is not streaming: read one of the registered "
            f"streams {sorted(streams)} in its FROM",
            store=create.name,
        )
    return df


def _drop(writer: Writer, drop: DropTable) -> SqlResult:
    name = drop.name
    if name not in writer.tables:
        if drop.if_exists:
            return _status(name, "does not exist")
        raise UnknownStoreError(
            f"no table {name!r} in this App; its tables are {sorted(writer.tables)} "
            "(DROP TABLE IF EXISTS ignores a missing table)",
            store=name,
        )
    writer.drop(name, drop.delete_changelog)
    return _status(name, "dropped, changelog deleted" if drop.delete_changelog else "dropped")


_SHOW_SCHEMA = pa.schema(
    [
        ("table", pa.string()),
        ("key_columns", pa.list_(pa.string())),
        ("partitions", pa.int32()),
        ("windowed", pa.bool_()),
        ("running", pa.bool_()),
        ("defined_by", pa.string()),
    ]
)


def _show_tables(writer: Writer) -> SqlResult:
    rows = []
    for name, table in sorted(writer.tables.items()):
        query = table.query
        rows.append(
            {
                "table": name,
                "key_columns": list(table.manifest.key_columns),
                "partitions": table.manifest.partitions,
                "windowed": table.manifest.window_column is not None,
                "running": bool(query is not None and query.isActive),
                "defined_by": "sql" if table.sql else "materialize",
            }
        )
    return SqlResult(_SHOW_SCHEMA.names, rows, schema=_SHOW_SCHEMA)


_DESCRIBE_SCHEMA = pa.schema(
    [
        ("column", pa.string()),
        ("type", pa.string()),
        ("nullable", pa.bool_()),
        ("key", pa.bool_()),
        ("window", pa.bool_()),
    ]
)


def _describe(writer: Writer, describe: DescribeTable) -> SqlResult:
    table = writer.tables.get(describe.name)
    if table is None:
        raise UnknownStoreError(
            f"no table {describe.name!r} in this App; its tables are {sorted(writer.tables)}",
            store=describe.name,
        )
    schema = table.manifest.schema
    rows = [
        {
            "column": f.name,
            "type": f.type.simple_string(),
            "nullable": f.nullable,
            "key": f.name in schema.key_columns,
            "window": f.name == schema.window_column,
        }
        for f in schema.fields
    ]
    return SqlResult(_DESCRIBE_SCHEMA.names, rows, schema=_DESCRIBE_SCHEMA)
