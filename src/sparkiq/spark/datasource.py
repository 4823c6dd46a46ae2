"""The ``sparkiq`` Spark data source: another Spark job reads a table, whole at one batch or
as its change feed (PySpark's Python Data Source API, Spark 4).

::

    sparkiq.register_data_source(spark)   # once per session; App.start() does it too
    orders = spark.read.format("sparkiq").option("state_dir", "/data/shop").load("orders")
    changes = spark.readStream.format("sparkiq").option("state_dir", "/data/shop").load("orders")

Both read the changelog directly (manifest, commit records, snapshots, segments): no serving
node is involved, and the reading job only needs read access to ``state_dir``.

**Batch reads** (``spark.read``) return the table as of ONE committed batch ``B``: the newest
committed batch when the read is planned, or ``as_of``. There is one Spark input partition per
table partition, each built from the partition's newest snapshot at or before ``B`` plus the
segments of the batches after it, so every partition describes the same batch. A batch
retention has made unreadable is refused at planning with an error naming the oldest
readable batch.

Columns: the table's own, with its types (its manifest's Spark schema), then the three change
columns below, in both kinds of read: Spark asks a Python source for one schema before it
knows whether it plans a batch or a streaming read. In a batch read every row is an
``"upsert"`` of batch ``B``, so :data:`BATCH_COLUMN` says which batch was read.

Filters: ``pushFilters`` looks at equality and ``IN`` filters on the key columns (``k = 'a'``,
``k IN (...)``, ``k <=> ...``; every key column of a composite key must be fixed; keys of
string, integral, boolean and date types) and skips the partitions no such key hashes to.
The filters themselves are all handed back to Spark, which still evaluates them on the rows
read (pruning only decides which partitions are read). Spark hands filters to a Python source
only with ``spark.sql.python.filterPushdown.enabled=true``, which :func:`register_data_source`
sets; with it off a read fails with Spark's
``DATA_SOURCE_PUSHDOWN_DISABLED``, naming that setting.

**Change feeds** (``spark.readStream``) return one row per change: the table's columns (the
value columns null for a deletion), :data:`OP_COLUMN` (``"upsert"`` or ``"delete"``),
:data:`BATCH_COLUMN` (the table batch that made the change) and :data:`COMMITTED_COLUMN` (when
that batch was committed). Offsets are ``{"batch_id": b, "incarnation": ...}``: the last
table batch included, and the table's incarnation (a table created again under its name is
refused rather than read from the middle). So a query with a checkpoint resumes after the
last table batch it processed and, with an exactly-once sink, sees each change once across
restarts. A micro-batch is split into tasks by
table batch; each task's rows are its table batches' changes in order (within a batch:
partitions ascending, keys in byte order; complete-mode tables are diffed against their
previous batch), and re-reading an offset range gives the same rows. Changes of a batch
retention deleted are never skipped: the read fails naming the batch and the oldest one
still there.

Options (case-insensitive): ``state_dir`` (required: an absolute path or a URI, since Spark's
Python workers resolve a relative path in their own working directory), the table as
``load("name")`` or ``table``, ``as_of`` (batch reads), ``starting_batch`` (``earliest``, the
default: from batch 0; ``latest``: only batches committed after the query starts; or a batch
id) and ``max_batches_per_trigger`` (change feeds; Spark's read limits count a table batch as
one "file").

Everything Spark ships to its Python workers here (the source, readers, input partitions) is
plain data and pickles; nothing uses ``sparkContext``, so Spark Connect sessions work too.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)

try:
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow
except ImportError:  # Spark < 4.2: Spark wraps the source for Trigger.AvailableNow itself

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        """Stands in for the mixin Spark 4.2 added."""


from sparkiq.changelog import Changelog, TableManifest, check_table_name
from sparkiq.changelog.feed import ChangeFeed, read_partition_state, require_after
from sparkiq.changelog.snapshot import list_snapshots
from sparkiq.errors import ConfigError, InvalidQueryError, SparkiqError
from sparkiq.schema.codec import KeyCodec, decimal_from_internal
from sparkiq.schema.partitioner import Partitioner
from sparkiq.schema.sparkarrow import stored_to_arrow
from sparkiq.schema.types import DataType

__all__ = [
    "BATCH_COLUMN",
    "COMMITTED_COLUMN",
    "FORMAT",
    "OP_COLUMN",
    "SparkiqDataSource",
    "register_data_source",
]

#: The format name: ``spark.read.format(FORMAT)``.
FORMAT = "sparkiq"
#: The table batch a row was read at: the change feed's column, and the one ``enrich`` adds
#: (null where the key was null).
BATCH_COLUMN = "sparkiq_batch"
#: Change feed columns: what happened (``"upsert"``/``"delete"``) and when it was committed.
OP_COLUMN = "sparkiq_op"
COMMITTED_COLUMN = "sparkiq_committed_at"
UPSERT, DELETE = "upsert", "delete"

#: The Spark setting that lets Spark hand filters to a Python data source.
PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"

_OPTIONS = ("path", "table", "state_dir", "as_of", "starting_batch", "max_batches_per_trigger")
_ROWS_PER_ARROW_BATCH = 8192
# More combinations of key values than this in pushed filters: read every partition.
_MAX_PRUNING_KEYS = 10_000
# Key types whose filter values (Python objects from Spark) have one internal value beyond
# doubt. Timestamps (naive or zoned datetimes) and floats (-0.0, NaN) are left out: a value
# placed in the wrong partition would silently drop rows, so those keys are not pruned.
_PRUNABLE_KEY_TYPES = frozenset({"string", "byte", "short", "integer", "long", "date", "boolean"})
# A change feed micro-batch is split into at most this many Spark tasks (by table batch).
_MAX_STREAM_TASKS = 16


def register_data_source(spark: Any) -> None:
    """Make ``spark.read.format("sparkiq")`` and ``spark.readStream.format("sparkiq")``
    available in ``spark`` (a classic or a Spark Connect session), and turn on
    ``spark.sql.python.filterPushdown.enabled`` so key filters prune partitions.
    Registering again is harmless."""
    spark.dataSource.register(SparkiqDataSource)
    spark.conf.set(PUSHDOWN_CONF, "true")


# -- options ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Options:
    state_dir: str
    table: str
    as_of: int | None
    starting_batch: str
    max_batches: int | None


def _int_option(options: dict[str, str], name: str, low: int) -> int | None:
    raw = options.get(name)
    if raw is None:
        return None
    try:
        value = int(str(raw).strip())
    except ValueError:
        value = low - 1
    if value < low:
        raise ConfigError(f"option {name!r} must be an integer >= {low}, got {raw!r}")
    return value


def _options(given: Any) -> _Options:
    options = {str(k).lower(): str(v) for k, v in dict(given).items()}
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise ConfigError(
            f"unknown option(s) {unknown} for format {FORMAT!r}; it takes {list(_OPTIONS[1:])} "
            "and the table name as load('table')"
        )
    state_dir = options.get("state_dir", "").strip()
    if not state_dir:
        raise ConfigError(
            f"format {FORMAT!r} needs option 'state_dir': the App's state_dir, e.g. "
            ".option('state_dir', '/data/shop')"
        )
    if "://" not in state_dir and not os.path.isabs(os.path.expanduser(state_dir)):
        raise ConfigError(
            f"option 'state_dir' is the relative path {state_dir!r}: pass an absolute path or a "
            "URI, since Spark's Python workers resolve paths in their own working directory"
        )
    path, table = options.get("path"), options.get("table")
    if path and table and path != table:
        raise ConfigError(f"load({path!r}) and option table={table!r} name different tables")
    name = path or table
    if not name:
        raise ConfigError(
            f"name the table to read: spark.read.format({FORMAT!r}).option('state_dir', ...)"
            ".load('table')"
        )
    starting = options.get("starting_batch", "earliest").strip().lower()
    if starting not in ("earliest", "latest"):
        _int_option(options, "starting_batch", 0)
    return _Options(
        state_dir=os.path.expanduser(state_dir),
        table=check_table_name(name),
        as_of=_int_option(options, "as_of", 0),
        starting_batch=starting,
        max_batches=_int_option(options, "max_batches_per_trigger", 1),
    )


# -- the source ---------------------------------------------------------------------------------


class SparkiqDataSource(DataSource):
    """``format("sparkiq")``: see the module docstring."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def _manifest(self) -> tuple[_Options, TableManifest]:
        options = _options(self.options)
        changelog = Changelog(options.state_dir, options.table, read_only=True)
        return options, changelog.manifest()

    def schema(self) -> Any:
        _, manifest = self._manifest()
        return _spark_schema(manifest)

    def reader(self, schema: Any) -> DataSourceReader:
        options, manifest = self._manifest()
        return _TableReader(options, manifest, _batch_to_read(options, manifest))

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        options, manifest = self._manifest()
        return _ChangeReader(options, manifest)


def _spark_schema(manifest: TableManifest) -> Any:
    """The table's columns, then the three change columns; every field nullable (a deletion
    has only its key, and Spark requires the Arrow batches ``read`` yields to match the
    schema's nullability exactly). Batch and streaming reads share it: Spark asks a Python
    source for its schema before it knows which kind of read it plans."""
    from pyspark.sql.types import StructType

    fields = [
        *(_nullable(f.to_json()) for f in manifest.schema.fields),
        {"name": OP_COLUMN, "type": "string", "nullable": True, "metadata": {}},
        {"name": BATCH_COLUMN, "type": "long", "nullable": True, "metadata": {}},
        {"name": COMMITTED_COLUMN, "type": "timestamp", "nullable": True, "metadata": {}},
    ]
    return StructType.fromJson({"type": "struct", "fields": fields})


def _nullable(doc: Any) -> Any:
    """A Spark JSON type or field with every level nullable."""
    if isinstance(doc, dict):
        doc = {k: _nullable(v) for k, v in doc.items()}
        for flag in ("nullable", "containsNull", "valueContainsNull"):
            if flag in doc:
                doc[flag] = True
    elif isinstance(doc, list):
        doc = [_nullable(v) for v in doc]
    return doc


# -- batch reads --------------------------------------------------------------------------------


def _batch_to_read(options: _Options, manifest: TableManifest) -> int:
    """The committed batch a batch read reads: ``as_of`` if readable, else the newest."""
    changelog = Changelog(options.state_dir, options.table, read_only=True)
    committed = changelog.committed_batch_ids()
    newest = committed[-1] if committed else -1
    if options.as_of is None:
        return newest
    if options.as_of > newest:
        raise ConfigError(
            f"as_of {options.as_of}: table {options.table!r} has committed batches up to "
            f"{newest} only; pass a committed batch id",
            store=options.table,
        )
    if not _readable(changelog, manifest, options.as_of, set(committed)):
        # a batch whose commit record retention deleted can still be readable from snapshots
        snapshots = (
            s.batch_id for p in range(manifest.partitions) for s in list_snapshots(changelog, p)
        )
        candidates = sorted({*committed, *(b for b in snapshots if b <= newest)})
        oldest = next(
            (b for b in candidates if _readable(changelog, manifest, b, set(committed))), newest
        )
        raise ConfigError(
            f"as_of {options.as_of}: batch {options.as_of} of table {options.table!r} is no "
            f"longer in the changelog (retention deleted what it needs); the oldest readable "
            f"batch is {oldest}. Keep the changelog longer (App(retention=...)) to read "
            "further back.",
            store=options.table,
        )
    return options.as_of


def _readable(
    changelog: Changelog, manifest: TableManifest, batch_id: int, committed: set[int]
) -> bool:
    """Whether every partition can be rebuilt at ``batch_id`` from what is on disk."""
    if manifest.output_mode == "complete":
        return batch_id in committed
    for partition in range(manifest.partitions):
        snapshots = [
            s.batch_id for s in list_snapshots(changelog, partition) if s.batch_id <= batch_id
        ]
        for b in range(max(snapshots) + 1 if snapshots else 0, batch_id + 1):
            record = changelog.read_commit(b) if b in committed else None
            if record is None:
                return False
            if partition in record.segments and not changelog.storage.exists(
                changelog.committed_segment_path(record, partition)
            ):
                return False
    return True


@dataclass
class _PartitionAt(InputPartition):
    """One table partition at one batch: one Spark task of a batch read."""

    partition: int
    batch_id: int


class _TableReader(DataSourceReader):
    """Reads every (pruned) partition of a table at batch ``batch_id``."""

    def __init__(self, options: _Options, manifest: TableManifest, batch_id: int) -> None:
        self.options = options
        self.manifest = manifest
        self.batch_id = batch_id
        record = None
        if batch_id >= 0:
            changelog = Changelog(options.state_dir, options.table, read_only=True)
            record = changelog.read_commit(batch_id)
        self.committed_at = record.committed_at if record is not None else 0.0
        # key column -> the values pushed filters allow (None: any)
        self.allowed: dict[str, list[Any]] = {}

    def pushFilters(self, filters: list[Any]) -> Iterator[Any]:
        from pyspark.sql.datasource import EqualNullSafe, EqualTo, In

        keys = set(self.manifest.key_columns)
        for f in filters:
            column = f.attribute[0] if len(getattr(f, "attribute", ())) == 1 else None
            if column in keys and isinstance(f, EqualTo | EqualNullSafe | In):
                values = list(f.value) if isinstance(f, In) else [f.value]
                if column in self.allowed:  # AND of two filters on one column
                    values = [v for v in self.allowed[column] if v in values]
                self.allowed[column] = values
            yield f  # Spark still evaluates every filter: pushing only prunes partitions

    def partitions(self) -> Sequence[InputPartition]:
        wanted = self._partitions_of_allowed_keys()
        return [
            _PartitionAt(p, self.batch_id)
            for p in range(self.manifest.partitions)
            if wanted is None or p in wanted
        ]

    def _partitions_of_allowed_keys(self) -> set[int] | None:
        """The partitions the pushed key filters leave (None: all of them)."""
        columns = self.manifest.key_columns
        if not all(c in self.allowed for c in columns):
            return None
        if any(t.name not in _PRUNABLE_KEY_TYPES for t in self.manifest.schema.key_types):
            return None
        combos = 1
        for c in columns:
            combos *= len(self.allowed[c])
        if combos > _MAX_PRUNING_KEYS:
            return None
        codec = KeyCodec(self.manifest.schema)
        partitioner = Partitioner(self.manifest.schema.key_types, self.manifest.partitions)
        found = set()
        for values in itertools.product(*(self.allowed[c] for c in columns)):
            try:
                internal = codec.to_internal(values[0] if len(values) == 1 else values)
                found.add(partitioner(internal))
            except (InvalidQueryError, SparkiqError, TypeError, ValueError):
                return None  # a value we cannot place: read everything, Spark filters
        return found

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, _PartitionAt)
        changelog = Changelog(self.options.state_dir, self.options.table, read_only=True)
        _check_incarnation(changelog, self.manifest)
        state = read_partition_state(changelog, partition.partition, partition.batch_id)
        decode = msgspec.msgpack.Decoder().decode
        keys = sorted(state)
        for start in range(0, len(keys), _ROWS_PER_ARROW_BATCH):
            rows = [decode(state[k]) for k in keys[start : start + _ROWS_PER_ARROW_BATCH]]
            yield _arrow_batch(
                self.manifest, rows, [UPSERT] * len(rows), self.batch_id, self.committed_at
            )


def _check_incarnation(changelog: Changelog, planned: TableManifest) -> None:
    if changelog.manifest().incarnation != planned.incarnation:
        raise ConfigError(
            f"table {planned.name!r} was dropped and created again since this read was "
            "planned; run the read again",
            store=planned.name,
        )


# -- change feeds -------------------------------------------------------------------------------


@dataclass
class _BatchRange(InputPartition):
    """Table batches ``first..last`` (inclusive): one Spark task of a change feed batch."""

    first: int
    last: int


class _ChangeReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The table's change feed; offsets are ``{"batch_id": last table batch included,
    "incarnation": the table's}``."""

    def __init__(self, options: _Options, manifest: TableManifest) -> None:
        self.options = options
        self.manifest = manifest
        self.target: int | None = None  # Trigger.AvailableNow: the newest batch at its start

    def _changelog(self) -> Changelog:
        return Changelog(self.options.state_dir, self.options.table, read_only=True)

    def _newest(self) -> int:
        committed = self._changelog().committed_batch_ids()
        return committed[-1] if committed else -1

    def initialOffset(self) -> dict[str, Any]:
        start = self.options.starting_batch
        if start == "latest":
            return self._offset(self._newest())
        first = 0 if start == "earliest" else int(start)
        committed = self._changelog().committed_batch_ids()
        if committed and committed[0] > first:
            raise ConfigError(
                f"starting_batch {start}: table {self.options.table!r} keeps batches "
                f"{committed[0]}..{committed[-1]} only (retention deleted the older ones). "
                f"Read the table at batch {committed[0]} with spark.read.format({FORMAT!r})"
                f".option('as_of', {committed[0]}) and stream with .option('starting_batch', "
                f"{committed[0] + 1}), or keep the changelog longer (App(retention=...)).",
                store=self.options.table,
            )
        return self._offset(first - 1)

    def _offset(self, batch_id: int) -> dict[str, Any]:
        """An offset: the last table batch included, and which incarnation of the table it
        counts in (a table dropped and created again starts its batch ids over)."""
        return {"batch_id": batch_id, "incarnation": self.manifest.incarnation}

    def _check(self, offset: dict[str, Any]) -> int:
        """The batch id of an offset of this table's incarnation (offsets without one, as a
        checkpoint might hold, are taken as they are)."""
        if offset.get("incarnation", self.manifest.incarnation) != self.manifest.incarnation:
            raise ConfigError(
                f"table {self.options.table!r} was dropped and created again since this "
                "stream's checkpoint was written: its batch ids start over. Start the stream "
                "with a new checkpoint location.",
                store=self.options.table,
            )
        return int(offset["batch_id"])

    def getDefaultReadLimit(self) -> Any:
        from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxFiles

        if self.options.max_batches is None:
            return ReadAllAvailable()
        return ReadMaxFiles(self.options.max_batches)

    def latestOffset(
        self, start: dict[str, Any] | None = None, limit: Any = None
    ) -> dict[str, Any]:
        newest = self._newest() if self.target is None else self.target
        if start is None:  # Spark < 4.2 calls latestOffset() without arguments
            return self._offset(newest)
        after = self._check(start)
        most = getattr(limit, "max_files", None)
        if most is None and limit is None and self.options.max_batches is not None:
            most = self.options.max_batches
        if most is not None:
            newest = min(newest, after + int(most))
        return self._offset(max(after, newest))

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self._newest()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        first, last = self._check(start) + 1, self._check(end)
        if last < first:
            return []
        count = last - first + 1
        per_task = -(-count // _MAX_STREAM_TASKS)
        return [
            _BatchRange(b, min(last, b + per_task - 1)) for b in range(first, last + 1, per_task)
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, _BatchRange)
        changelog = self._changelog()
        _check_incarnation(changelog, self.manifest)
        feed = ChangeFeed(changelog, after=partition.first - 1)
        done = partition.first - 1
        while done < partition.last:
            batches = feed.poll(max_batches=partition.last - done, until=partition.last)
            if not batches:
                require_after(changelog, done)  # raises when retention deleted the next one
                raise ConfigError(
                    f"batch {done + 1} of table {self.options.table!r} is not committed, but "
                    f"the stream's offsets include it: was the table's changelog replaced?",
                    store=self.options.table,
                )
            for changes in batches:
                yield from _change_batches(self.manifest, changes)
            done = batches[-1].batch_id

    def commit(self, end: dict[str, Any]) -> None:
        pass  # the changelog is the owner's: readers never delete anything


def _change_batches(manifest: TableManifest, changes: Any) -> Iterator[pa.RecordBatch]:
    """The rows of one table batch's changes, as Arrow batches of the change feed schema."""
    schema = manifest.schema
    fields = schema.fields
    names = [f.name for f in fields]
    key_index = [names.index(c) for c in schema.key_columns]
    key_types = schema.key_types
    window_index = names.index(schema.window_column) if schema.window_column else None
    codec = KeyCodec(schema)
    decode = msgspec.msgpack.Decoder().decode
    for start in range(0, len(changes), _ROWS_PER_ARROW_BATCH):
        stop = min(len(changes), start + _ROWS_PER_ARROW_BATCH)
        rows: list[list[Any]] = []
        ops: list[str] = []
        for key, value in zip(changes.keys[start:stop], changes.values[start:stop], strict=True):
            if value is not None:
                rows.append(decode(value))
                ops.append(UPSERT)
                continue
            row: list[Any] = [None] * len(fields)
            if window_index is not None:
                internal, window_start = codec.decode_windowed(key)
                row[window_index] = _window_stored(fields[window_index].type, window_start)
            else:
                internal = codec.decode(key)
            for index, dtype, v in zip(key_index, key_types, internal, strict=True):
                row[index] = _key_stored(v, dtype)
            rows.append(row)
            ops.append(DELETE)
        yield _arrow_batch(manifest, rows, ops, changes.batch_id, changes.committed_at)


def _arrow_batch(
    manifest: TableManifest,
    rows: list[list[Any]],
    ops: list[str],
    batch_id: int,
    committed_at: float,
) -> pa.RecordBatch:
    """Stored rows (values in schema order) plus the change columns, as one Arrow batch."""
    fields = manifest.schema.fields
    columns = list(zip(*rows, strict=True)) if rows else [() for _ in fields]
    committed_us = round(committed_at * 1_000_000)
    arrays = [stored_to_arrow(list(c), f.type) for c, f in zip(columns, fields, strict=True)]
    arrays += [
        pa.array(ops, pa.string()),
        pa.array([batch_id] * len(ops), pa.int64()),
        pa.array([committed_us] * len(ops), pa.int64()).cast(pa.timestamp("us", tz="UTC")),
    ]
    names = [*(f.name for f in fields), OP_COLUMN, BATCH_COLUMN, COMMITTED_COLUMN]
    return pa.RecordBatch.from_arrays(arrays, names=names)


def _key_stored(value: Any, dtype: DataType) -> Any:
    """A key column's internal value in its stored form (they differ for decimals only)."""
    if value is not None and dtype.name == "decimal":
        return str(decimal_from_internal(value, dtype.scale))
    return value


def _window_stored(dtype: DataType, start_us: int | None) -> list[Any]:
    """A deleted window's struct, stored form: its start (the key knows no end)."""
    return [start_us if f.name == "start" else None for f in dtype.fields]
