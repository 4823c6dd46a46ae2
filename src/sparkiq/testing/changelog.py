"""Tables written from Python rows, without Spark: the files a table's Spark query would write.

A test of what serves tables (a :class:`~sparkiq.Node`, a cluster, a
:class:`~sparkiq.Client`, SQL, Postgres) needs tables, and a streaming query is the slow way
to get them. :func:`write_table` writes what the sink writes (docs/changelog-format.md): the
manifest when the table is new, then for each batch one segment per partition and the commit
record. Rows are encoded with the table's own codecs and keys are partitioned by
:class:`~sparkiq.schema.partitioner.Partitioner`, which computes Spark's
``pmod(hash(key), partitions)``, so a node reads these tables exactly as it reads a
Spark-written one, and a segment holds the bytes the sink writes for the same rows.

Column types come from ``schema=`` (a ``pyarrow.Schema``, or Spark's JSON schema,
``DataFrame.schema.json()``, the document a manifest holds) or are inferred from the rows
through Arrow's inference (``str`` is ``string``, ``int`` ``long``, ``float`` ``double``,
``datetime`` ``timestamp``, ``Decimal`` ``decimal(p,s)`` of its digits, ``dict`` a struct,
``list`` an array; PySpark would make a ``dict`` a map). As in PySpark, a naive ``datetime``
in a ``timestamp`` column is local time (the process's ``TZ``): it is stored as that instant.

Nothing here imports pyspark or starts a thread.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeAlias

import pyarrow as pa

from sparkiq.changelog import Changelog, CommitRecord, TableManifest, check_table_name
from sparkiq.changelog.manifest import OUTPUT_MODES
from sparkiq.errors import SchemaError
from sparkiq.schema.arrowtypes import arrow_type
from sparkiq.schema.codec import KeyCodec, RowCodec
from sparkiq.schema.kinds import KINDS
from sparkiq.schema.partitioner import Partitioner
from sparkiq.schema.types import DataType, Field, TableSchema, parse_type
from sparkiq.stores.history import DEFAULT_HISTORY

__all__ = ["Changes", "TableWriter", "temporary_state_dir", "write_table"]

#: Encoded changes of one batch: partition -> {encoded key: encoded row, or None to delete}.
Changes = dict[int, dict[bytes, bytes | None]]

#: Rows: dicts of column values, or an Arrow table with the table's columns.
Rows: TypeAlias = "Iterable[Mapping[str, Any]] | pa.Table"

_DEFAULT_PARTITIONS = 4


@contextlib.contextmanager
def temporary_state_dir(prefix: str = "sparkiq-test-") -> Iterator[str]:
    """A new empty directory for an App's or a Node's ``state_dir``, removed with everything
    in it when the block ends (stop the App or Node inside the block)."""
    path = tempfile.mkdtemp(prefix=prefix)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def write_table(
    state_dir: str,
    name: str,
    rows: Rows = (),
    *,
    key: str | Sequence[str] | None = None,
    deletes: Iterable[Any] = (),
    schema: pa.Schema | Mapping[str, Any] | str | None = None,
    window: str | None = None,
    partitions: int | None = None,
    output_mode: str | None = None,
    batch_id: int | None = None,
    commit: bool = True,
    position: Mapping[str, Mapping[int, int]] | None = None,
) -> TableWriter:
    """Write ``rows`` (upserts) and ``deletes`` as one batch of table ``name`` in
    ``state_dir``, creating the table first when it has no manifest; return its
    :class:`TableWriter`, whose :meth:`~TableWriter.write` adds later batches.

    Creating a table needs ``key`` (a column, or a list of columns for a composite key) and
    its columns: ``schema`` or the rows to infer them from. ``window`` names a windowed
    table's ``{"start": datetime, "end": datetime}`` column; ``partitions`` defaults to 4 and
    ``output_mode`` to ``"update"``. For a table that exists these may be left out; given,
    they must equal its layout (else :class:`~sparkiq.errors.LayoutMismatchError`, nothing
    written).

    ``deletes`` are keys in the form :func:`~sparkiq.testing.table_rows` returns them: a
    scalar for one key column, a tuple for several, ``(key, window start)`` in a windowed
    table. A key given twice in a batch keeps its last row; a key both written and deleted is
    deleted. ``batch_id`` defaults to the one after the newest batch written;
    ``commit=False`` writes the segments only (a batch whose driver died before its commit
    record); ``position`` is the commit record's source position (``{"kafka:<topic>":
    {partition: end offset}}``). With no rows and no deletes only the manifest is written.
    """
    rows = rows if isinstance(rows, pa.Table) else list(rows)
    writer = TableWriter(
        Changelog(state_dir, check_table_name(name)),
        key=key,
        schema=schema,
        window=window,
        partitions=partitions,
        output_mode=output_mode,
        rows=rows,
    )
    deletes = list(deletes)
    if len(rows) or deletes:
        writer.write(rows, deletes=deletes, batch_id=batch_id, commit=commit, position=position)
    return writer


class TableWriter:
    """Writes the batches of one table's changelog, as the table's Spark query would.

    Build it with :func:`write_table` (or over a :class:`~sparkiq.changelog.Changelog`, whose
    storage it writes through, with the same keyword arguments). One writer per table at a
    time, as for a Spark query (invariant 1 of the changelog format); its methods are not
    meant for concurrent use.
    """

    def __init__(
        self,
        changelog: Changelog,
        *,
        key: str | Sequence[str] | None = None,
        schema: pa.Schema | Mapping[str, Any] | str | None = None,
        window: str | None = None,
        partitions: int | None = None,
        output_mode: str | None = None,
        rows: Rows = (),
    ) -> None:
        self.changelog = changelog
        name, state_dir = changelog.table, changelog.state_dir
        existing = self.changelog.manifest() if self.changelog.exists() else None
        keys = (key,) if isinstance(key, str) else None if key is None else tuple(key)
        if output_mode is not None and output_mode not in OUTPUT_MODES:
            raise ValueError(f"output_mode {output_mode!r}: use one of {list(OUTPUT_MODES)}")
        if existing is None:
            if not keys:
                raise ValueError(
                    f"table {name!r} does not exist in {state_dir!r}: give key= (its key "
                    "column, or a list of columns) to create it"
                )
            fields = _fields(schema, rows, name)
            table_schema = TableSchema(fields, keys, window)
        else:
            fields = existing.schema.fields if schema is None else _fields(schema, rows, name)
            table_schema = TableSchema(
                fields,
                keys or existing.key_columns,
                window if window is not None else existing.window_column,
            )
        wanted = TableManifest(
            name=name,
            schema=table_schema,
            partitions=partitions
            or (existing.partitions if existing is not None else _DEFAULT_PARTITIONS),
            output_mode=output_mode or (existing.output_mode if existing is not None else "update"),
            tombstone_column=existing.tombstone_column if existing is not None else None,
            history=existing.history if existing is not None else DEFAULT_HISTORY,
        )
        storage = self.changelog.storage
        self.manifest = wanted.ensure_written(storage, self.changelog.manifest_path)
        layout = self.manifest.schema
        self.key_codec = KeyCodec(layout)
        self.row_codec = RowCodec(layout)
        self.partitioner = Partitioner(layout.key_types, self.manifest.partitions)
        #: The Arrow schema rows are built in: Spark's own exchange types (UTC timestamps).
        self.arrow_schema = pa.schema(
            [pa.field(f.name, arrow_type(f.type, timestamp_tz="UTC")) for f in layout.fields]
        )
        self._zoned = {f.name: convert for f in layout.fields if (convert := _local_times(f.type))}
        self._next_batch: int | None = None  # listed from the commits when first needed

    @property
    def name(self) -> str:
        return self.changelog.table

    def write(
        self,
        rows: Rows = (),
        *,
        deletes: Iterable[Any] = (),
        batch_id: int | None = None,
        commit: bool = True,
        position: Mapping[str, Mapping[int, int]] | None = None,
    ) -> CommitRecord:
        """Write one batch of upserts and deletes (see :func:`write_table`); return its
        commit record (also when ``commit=False``, though then it is not written)."""
        return self.write_changes(
            self.changes(rows, deletes), batch_id=batch_id, commit=commit, position=position
        )

    def changes(self, rows: Rows = (), deletes: Iterable[Any] = ()) -> Changes:
        """The encoded changes of a batch, by partition, without writing them (benchmarks
        time what is done with them)."""
        table = self.to_arrow(rows)
        changes: Changes = {}
        if table.num_rows:
            columns = [table.column(c).to_pylist() for c in self.manifest.key_columns]
            single = len(columns) == 1
            encoded = self.key_codec.encode_arrow(table)
            values = self.row_codec.encode_arrow(table)
            for i, (k, v) in enumerate(zip(encoded, values, strict=True)):
                user_key = columns[0][i] if single else tuple(c[i] for c in columns)
                changes.setdefault(self.partition_of(user_key), {})[k] = v
        for gone in deletes:
            internal, encoded_key = self._delete_key(gone)
            changes.setdefault(self.partitioner(internal), {})[encoded_key] = None
        return changes

    def write_changes(
        self,
        changes: Mapping[int, Mapping[bytes, bytes | None]],
        *,
        batch_id: int | None = None,
        commit: bool = True,
        position: Mapping[str, Mapping[int, int]] | None = None,
    ) -> CommitRecord:
        """Write encoded ``changes`` (see :meth:`changes`) as one batch: a segment per
        partition with changes, then, unless ``commit`` is false, the commit record."""
        if batch_id is None:
            if self._next_batch is None:
                committed = self.changelog.committed_batch_ids()
                self._next_batch = committed[-1] + 1 if committed else 0
            batch_id = self._next_batch
        segments = {
            p: self.changelog.write_segment(p, batch_id, dict(c)) for p, c in changes.items()
        }
        record = CommitRecord(
            table=self.name,
            batch_id=batch_id,
            mode=self.manifest.output_mode,
            segments=segments,
            position=position or {},
            committed_at=time.time(),
        )
        if commit:
            self.changelog.write_commit(record)
        if self._next_batch is not None:
            self._next_batch = max(self._next_batch, batch_id + 1)
        return record

    def partition_of(self, key: Any) -> int:
        """The partition of a key (a scalar, or a tuple for a composite key), as Spark's
        ``pmod(hash(key columns), partitions)`` computes it."""
        return self.partitioner(self.key_codec.to_internal(key))

    def to_arrow(self, rows: Rows) -> pa.Table:
        """``rows`` as an Arrow table of the table's columns (an Arrow table is used as is)."""
        if isinstance(rows, pa.Table):
            return rows
        names = self.arrow_schema.names
        full = []
        for row in rows:
            unknown = set(row) - set(names)
            if unknown:
                raise ValueError(
                    f"a row of table {self.name!r} has columns {sorted(unknown)} the table "
                    f"does not have; its columns are {names}"
                )
            values = {c: row.get(c) for c in names}
            for column, convert in self._zoned.items():
                values[column] = convert(values[column])
            full.append(values)
        try:
            return pa.Table.from_pylist(full, schema=self.arrow_schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as exc:
            raise ValueError(
                f"rows of table {self.name!r} do not fit its columns "
                f"{_describe(self.manifest.schema)}: {exc}"
            ) from exc

    def _delete_key(self, key: Any) -> tuple[tuple[Any, ...], bytes]:
        schema = self.manifest.schema
        if schema.window_start is None:
            internal = self.key_codec.to_internal(key)
            return internal, self.key_codec.encode(internal)
        if not isinstance(key, tuple) or len(key) != 2:
            raise ValueError(
                f"table {self.name!r} is windowed: delete (key, window start) pairs, got {key!r}"
            )
        internal = self.key_codec.to_internal(key[0])
        start = schema.window_start.to_internal(key[1])
        return internal, self.key_codec.encode_windowed(internal, start)


# -- column types --------------------------------------------------------------------------


def _fields(schema: Any, rows: Rows, table: str) -> tuple[Field, ...]:
    """The table's columns from ``schema`` (Arrow or Spark JSON) or inferred from ``rows``."""
    if isinstance(schema, pa.Schema):
        return tuple(Field(f.name, _spark_type(f.type, f.name)) for f in schema)
    if schema is not None:
        return _json(schema)
    if isinstance(rows, pa.Table):
        return _fields(rows.schema, (), table)
    rows = list(rows)
    if not rows:
        raise ValueError(f"table {table!r} is new: give schema= or rows to infer its columns from")
    values: dict[str, list[Any]] = {}
    for row in rows:
        for column in row:
            values.setdefault(column, [])
    for row in rows:
        for column, found in values.items():
            found.append(row.get(column))
    fields = []
    for column, found in values.items():
        try:
            inferred = pa.array(found).type
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise ValueError(
                f"cannot infer the type of column {column!r} of table {table!r} from its "
                f"values ({exc}): pass schema="
            ) from exc
        fields.append(Field(column, _spark_type(inferred, column)))
    return tuple(fields)


def _json(schema: Mapping[str, Any] | str) -> tuple[Field, ...]:
    doc = json.loads(schema) if isinstance(schema, str) else schema
    struct = parse_type(doc)
    if struct.name != "struct":
        raise SchemaError(f"a table schema must be a struct, got {struct.simple_string()}")
    return struct.fields


_SCALARS: dict[pa.DataType, str] = {
    pa.string(): "string",
    pa.large_string(): "string",
    pa.binary(): "binary",
    pa.large_binary(): "binary",
    pa.bool_(): "boolean",
    pa.int8(): "byte",
    pa.int16(): "short",
    pa.int32(): "integer",
    pa.int64(): "long",
    pa.float32(): "float",
    pa.float64(): "double",
    pa.date32(): "date",
}


def _spark_type(arrow: pa.DataType, column: str) -> DataType:
    """The Spark type PySpark gives a column of this Arrow type (a timestamp with or without
    a zone is ``timestamp``, as PySpark infers a ``datetime``; say ``timestamp_ntz`` in a
    Spark JSON schema)."""
    if arrow in _SCALARS:
        return DataType(_SCALARS[arrow])
    if pa.types.is_timestamp(arrow):
        return DataType("timestamp")
    if pa.types.is_decimal(arrow):
        return DataType("decimal", precision=arrow.precision, scale=arrow.scale)
    if pa.types.is_struct(arrow):
        return DataType(
            "struct",
            fields=tuple(Field(f.name, _spark_type(f.type, f"{column}.{f.name}")) for f in arrow),
        )
    if pa.types.is_list(arrow) or pa.types.is_large_list(arrow):
        return DataType("array", element=_spark_type(arrow.value_type, f"{column}[]"))
    if pa.types.is_map(arrow):
        return DataType(
            "map",
            key=_spark_type(arrow.key_type, f"{column} keys"),
            value=_spark_type(arrow.item_type, f"{column} values"),
        )
    if pa.types.is_null(arrow):
        raise ValueError(f"column {column!r} is None in every row: pass schema= to type it")
    raise ValueError(f"column {column!r} has Arrow type {arrow}, which no Spark type matches")


def _local_times(dtype: DataType) -> Callable[[Any], Any] | None:
    """A converter making naive datetimes of ``timestamp`` values (nested ones included)
    aware in local time, as PySpark reads them; None when the type holds none."""
    kind = KINDS[dtype.name]
    if kind.zoned:
        return _aware
    if dtype.name == "struct":
        inner = {f.name: c for f in dtype.fields if (c := _local_times(f.type))}
        if not inner:
            return None
        return lambda v: (
            v if not isinstance(v, Mapping) else {**v, **{n: c(v.get(n)) for n, c in inner.items()}}
        )
    if dtype.name == "array" and dtype.element is not None:
        element = _local_times(dtype.element)
        return None if element is None else lambda v: v if v is None else [element(e) for e in v]
    if dtype.name == "map" and dtype.key is not None and dtype.value is not None:
        ks, vs = _local_times(dtype.key), _local_times(dtype.value)
        if ks is None and vs is None:
            return None
        same: Callable[[Any], Any] = lambda x: x  # noqa: E731
        kc, vc = ks or same, vs or same
        return lambda v: v if v is None else {kc(k): vc(x) for k, x in dict(v).items()}
    return None


def _aware(value: Any) -> Any:
    if isinstance(value, dt.datetime) and value.tzinfo is None:
        return value.astimezone()  # local time, as PySpark's TimestampType.toInternal
    return value


def _describe(schema: TableSchema) -> str:
    return "(" + ", ".join(f"{f.name} {f.type.simple_string()}" for f in schema.fields) + ")"
