"""A Spark checkpoint's state stores as sparkiq tables (zero-change mode).

:class:`CheckpointCatalog` offers one table per state store of one checkpoint, and
:class:`CheckpointSource` is the :class:`~sparkiq.changelog.source.ChangelogSource` of one of
them: replicas, routing, SQL and every other reader use it exactly as they use a sparkiq
changelog. Nothing here ever writes under the checkpoint.

Tables
    Named ``<name>_<operator>[_<store>]`` (a sparkiq table name is an SQL identifier, so the
    parts are joined with ``_``). ``<operator>`` is ``agg`` (a streaming aggregation),
    ``window`` (an aggregation whose key holds a ``window()`` struct), ``dedupe``
    (``dropDuplicates``, ``dropDuplicatesWithinWatermark``), ``tws`` (``transformWithState``,
    ``transformWithStateInPandas``), ``join`` (a stream-stream join), ``fmgws``
    (``[flatMap|apply]GroupsWithState[InPandas]``) or ``op<id>`` for any other operator;
    when two operators get the same part, each gets its operator id appended (``agg0``,
    ``agg3``). ``<store>`` is the store's name (for transformWithState, the state variable),
    left out for Spark's ``default`` store. ``operators={id: "part"}`` attaches only the
    operators named and replaces their part.

Columns
    The key columns are the fields of the state key schema, in order. A struct field
    (``window``: ``struct<start, end>``) becomes one key column per member, named
    ``<field>_<member>`` (``window_start``, ``window_end``): Spark places a key by the hash of
    every grouping column, struct members included in order, so flattening keeps sparkiq's
    partitioner equal to Spark's placement (a sparkiq windowed table places a key by its
    non-window columns only, which Spark does not). The value columns follow: a streaming
    aggregation's state is its aggregation *buffer*, whose names are those of the buffer,
    not the query's aliases (the checkpoint does not record them):

    ==========================  ===========================================================
    aggregate                   value columns
    ==========================  ===========================================================
    ``count``                   ``count`` (the output value)
    ``sum`` (integral, double)  ``sum`` (the output value)
    ``sum`` (decimal)           ``sum`` (the output: null while ``isEmpty``, which is dropped)
    ``min``, ``max``            ``min``, ``max`` (the output value)
    ``first``, ``last``         ``first``, ``last`` (the output: null unless ``valueSet``,
                                which is dropped)
    ``avg``                     ``sum`` and ``count`` (the buffer: ``avg = sum / count``;
                                the checkpoint cannot tell ``avg(v)`` from
                                ``sum(v), count(v)``)
    anything else               its buffer fields as Spark names them
    ==========================  ===========================================================

    A name that repeats gets ``_2``, ``_3``... in order (``sum``, ``sum_2``), and one equal to
    a key column gets ``_value``. Other operators expose their value schema as stored, less
    fields of type ``void`` (``dropDuplicates`` stores a placeholder ``__dummy__``: its
    table has only key columns; ``dropDuplicatesWithinWatermark`` keeps the expiry time).

Positions
    Batch ids are the query's: state version ``N`` is the state after batch ``N - 1``, and a
    batch is visible only once ``commits/<batch>`` exists. A Spark snapshot of version ``N``
    serves as the snapshot of batch ``N - 1``.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from sparkiq.changelog.commit import CommitRecord
from sparkiq.changelog.manifest import TableManifest
from sparkiq.changelog.segment import SegmentInfo
from sparkiq.changelog.snapshot import SnapshotInfo
from sparkiq.checkpoint.convert import StateRowConverter
from sparkiq.checkpoint.layout import Checkpoint
from sparkiq.checkpoint.provider import (
    FileStamp,
    StateFiles,
    StateStoreInfo,
    batch_of_version,
    version_of_batch,
)
from sparkiq.errors import ChangelogError, ConfigError, CorruptSegmentError, SchemaError
from sparkiq.schema.types import Field, TableSchema

__all__ = [
    "CheckpointCatalog",
    "CheckpointSource",
    "StoreTable",
    "plan_tables",
]

log = logging.getLogger("sparkiq.checkpoint")

_READABLE = {
    "stateStoreSave": "agg",
    "dedupe": "dedupe",
    "dedupeWithinWatermark": "dedupe",
    "symmetricHashJoin": "join",
    "flatMapGroupsWithState": "fmgws",
    "applyInPandasWithState": "fmgws",
}
_NOT_IDENTIFIER = re.compile(r"[^A-Za-z0-9_]")
# Buffer fields that only say whether their neighbour holds a value (Spark's Sum of decimals,
# First/Last): folded into that neighbour, which becomes null when there is none.
_PRESENCE_FLAGS = {"isEmpty": ("sum", True), "valueSet": (None, False)}


def _operator_part(info: StateStoreInfo) -> str:
    name = info.operator_name
    if name.startswith("transformWithState"):
        return "tws"
    if name == "stateStoreSave" and any(_is_window(f) for f in info.key_schema.fields):
        return "window"
    return _READABLE.get(name, f"op{info.operator_id}")


def _is_window(field: Field) -> bool:
    members = {f.name for f in field.type.fields} if field.type.name == "struct" else set()
    return {"start", "end"} <= members


def _identifier(text: str) -> str:
    cleaned = _NOT_IDENTIFIER.sub("_", text)
    return cleaned if cleaned[:1].isalpha() or cleaned[:1] == "_" else f"_{cleaned}"


@dataclass(frozen=True)
class StoreTable:
    """How one state store is served: the sparkiq table ``name`` and ``schema`` (key columns
    first), how many buffer fields fold into their neighbour (``folds``: value index of the
    flag -> value index it clears), and the store it reads."""

    name: str
    info: StateStoreInfo
    schema: TableSchema
    key_paths: tuple[tuple[int, ...], ...]  # per key column: where it is in the decoded key
    value_indexes: tuple[int, ...]  # per value column: its index in the decoded value
    folds: tuple[tuple[int, int, bool], ...]  # (flag index, value index, null when flag is)


def plan_tables(
    name: str,
    stores: Sequence[StateStoreInfo],
    operators: Mapping[int, str] | Iterable[int] | None = None,
) -> list[StoreTable]:
    """The tables a checkpoint's stores become (see the module docstring for the rules).

    Raises :class:`~sparkiq.errors.ConfigError` for an operator id the checkpoint does not
    have, and :class:`~sparkiq.errors.SchemaError` for a store sparkiq cannot serve (a key
    column type that cannot be a key), naming the operator and the type.
    """
    chosen: dict[int, str | None]
    ids = sorted({s.operator_id for s in stores})
    if operators is None:
        chosen = dict.fromkeys(ids)
    elif isinstance(operators, Mapping):
        chosen = {int(k): _identifier(str(v)) for k, v in operators.items()}
    else:
        chosen = dict.fromkeys(int(k) for k in operators)
    unknown = sorted(set(chosen) - set(ids))
    if unknown:
        raise ConfigError(
            f"operators {unknown} are not in the checkpoint; its stateful operators are "
            + ", ".join(f"{i} ({_describe_op(stores, i)})" for i in ids)
        )
    parts = {i: chosen[i] or _operator_part(_first(stores, i)) for i in chosen}
    repeated = {p for p in parts.values() if list(parts.values()).count(p) > 1}
    tables = []
    for info in sorted(stores, key=lambda s: (s.operator_id, s.store_name)):
        if info.operator_id not in parts:
            continue
        part = parts[info.operator_id]
        if part in repeated and chosen[info.operator_id] is None:
            part = f"{part}{info.operator_id}"
        table = f"{_identifier(name)}_{part}"
        if info.store_name != "default":
            table = f"{table}_{_identifier(info.store_name)}"
        tables.append(_plan(table, info))
    return tables


def _first(stores: Sequence[StateStoreInfo], operator_id: int) -> StateStoreInfo:
    return next(s for s in stores if s.operator_id == operator_id)


def _describe_op(stores: Sequence[StateStoreInfo], operator_id: int) -> str:
    return _first(stores, operator_id).operator_name or "unknown"


def _plan(table: str, info: StateStoreInfo) -> StoreTable:
    fields: list[Field] = []
    key_paths: list[tuple[int, ...]] = []
    for i, field in enumerate(info.key_schema.fields):
        if field.type.name == "struct":
            for j, member in enumerate(field.type.fields):
                fields.append(Field(f"{field.name}_{member.name}", member.type, member.nullable))
                key_paths.append((i, j))
        else:
            fields.append(field)
            key_paths.append((i,))
    key_names = [f.name for f in fields]
    for f in fields:
        if not f.type.is_key_type:
            raise SchemaError(
                f"state store {info.store_name!r} of operator {info.operator_id} "
                f"({info.operator_name}) has key column {f.name!r} of type "
                f"{f.type.simple_string()}, which sparkiq cannot use as a key; this store "
                "cannot be attached (leave the operator out with operators=)"
            )
    value_fields = list(info.value_schema.fields)
    folds: list[tuple[int, int, bool]] = []
    skipped: set[int] = set()
    if info.operator_name == "stateStoreSave":
        for i, f in enumerate(value_fields):
            rule = _PRESENCE_FLAGS.get(f.name)
            if rule is None or i == 0 or f.type.name != "boolean":
                continue
            wanted, null_when = rule
            if wanted is not None and value_fields[i - 1].name != wanted:
                continue
            folds.append((i, i - 1, null_when))
            skipped.add(i)
    seen: dict[str, int] = {}
    value_indexes = []
    for i, f in enumerate(value_fields):
        if i in skipped or f.type.name == "void":  # dropDuplicates' placeholder holds nothing
            continue
        base = f"{f.name}_value" if f.name in key_names else f.name
        seen[base] = seen.get(base, 0) + 1
        column = base if seen[base] == 1 else f"{base}_{seen[base]}"
        fields.append(Field(column, f.type, True))
        value_indexes.append(i)
    schema = TableSchema(tuple(fields), tuple(key_names))
    return StoreTable(table, info, schema, tuple(key_paths), tuple(value_indexes), tuple(folds))


class CheckpointSource:
    """One state store of a checkpoint as a :class:`~sparkiq.changelog.source.ChangelogSource`.

    Reads only; safe to share between threads for reading (the per-partition file readers
    are created once, under a lock).
    """

    restore_hint = (
        "Spark's maintenance deleted it (spark.sql.streaming.minBatchesToRetain) and no newer "
        "snapshot covers it yet; the partition restores at the next state snapshot"
    )

    def __init__(self, checkpoint: Checkpoint, plan: StoreTable, incarnation: str) -> None:
        self.checkpoint = checkpoint
        self.plan = plan
        info = plan.info
        self._convert = StateRowConverter(
            plan.name,
            info.key_schema,
            info.value_schema,
            plan.schema,
            plan.key_paths,
            plan.value_indexes,
            plan.folds,
            info.describe(),
        )
        self._manifest = TableManifest(
            name=plan.name,
            schema=plan.schema,
            partitions=plan.info.partitions,
            output_mode="update",
            incarnation=incarnation,
        )
        self._segments = {p: SegmentInfo(p, 0, 0, "") for p in range(plan.info.partitions)}
        self._files: dict[int, StateFiles] = {}
        # partitions read_changes was asked for (the ones read ahead), and per partition
        # the changes of one version read ahead: (version, file stamp, changes)
        self._tailed: set[int] = set()
        self._ahead: dict[int, tuple[int, FileStamp, dict[bytes, bytes | None]]] = {}
        self._lock = threading.Lock()  # guards _files, _tailed and _ahead

    @property
    def table(self) -> str:
        return self.plan.name

    def manifest(self) -> TableManifest:
        return self._manifest

    def _where(self, partition: int) -> str:
        info = self.plan.info
        return (
            f"state store {info.store_name!r} of operator {info.operator_id} "
            f"({info.operator_name or 'unknown'}), partition {partition}, in checkpoint "
            f"{str(self.checkpoint.path)!r}"
        )

    def files(self, partition: int) -> StateFiles:
        with self._lock:
            found = self._files.get(partition)
            if found is None:
                found = self._files[partition] = self.checkpoint.files(self.plan.info, partition)
            return found

    # -- commits -----------------------------------------------------------------------------

    def committed_batch_ids(self) -> list[int]:
        return sorted(self.checkpoint.committed_batches())

    def has_commit(self, batch_id: int) -> bool:
        return batch_id >= 0 and batch_id in set(self.checkpoint.committed_batches())

    def read_commit(self, batch_id: int) -> CommitRecord | None:
        if not self.has_commit(batch_id):
            return None
        return self._record(batch_id)

    def _record(self, batch_id: int) -> CommitRecord:
        # Spark writes a change file for every partition in every batch, so each partition
        # is listed (sizes and checksums are the provider's to check, not the record's).
        return CommitRecord(
            table=self.plan.name,
            batch_id=batch_id,
            mode="update",
            segments=self._segments,
            committed_at=self.checkpoint.commit_time(batch_id),
        )

    def has_changes(self, record: CommitRecord, partition: int) -> bool:
        try:
            return version_of_batch(record.batch_id) in self.files(partition).versions()
        except (ChangelogError, OSError):
            return False

    def commits_after(self, batch_id: int) -> Iterator[CommitRecord]:
        """The committed batches after ``batch_id``, in order; once the caller has taken the
        last one, the change files of the batch Spark is running now are read ahead (see
        :meth:`read_ahead`)."""
        committed = set(self.checkpoint.committed_batches())
        next_id = batch_id + 1
        while next_id in committed:
            yield self._record(next_id)
            next_id += 1
        self.read_ahead(next_id)

    def read_ahead(self, batch_id: int) -> int:
        """Convert the change files batch ``batch_id`` has already written, before its commit,
        for the partitions this process reads; return how many were read.

        Spark writes each partition's state file while the batch runs and ``commits/<b>``
        only after the whole batch, so by the commit most of a batch's decoding is done and
        what remains is writing the store: this is what keeps commit -> queryable short.
        Nothing read ahead is served before :meth:`read_changes` asks for it after the
        commit, and only if the file is still the one that was read (same inode, size and
        mtime: a retried batch's file is written anew). A file that cannot be read yet is
        left for :meth:`read_changes`, which reports it.
        """
        version = version_of_batch(batch_id)
        with self._lock:
            wanted = [p for p in self._tailed if self._ahead.get(p, (0, None))[0] != version]
        done = 0
        for partition in wanted:
            files = self.files(partition)
            try:
                stamp = files.stamp(version)
                if stamp is None:
                    continue
                changes = self._convert.convert(files.changes(version))
            except (ChangelogError, OSError, ValueError, IndexError, TypeError):
                continue  # not there yet, or damaged: read_changes says so after the commit
            if files.stamp(version) != stamp:
                continue  # replaced while it was read
            with self._lock:
                self._ahead[partition] = (version, stamp, changes)
            done += 1
        return done

    def _read_before(self, partition: int, version: int) -> dict[bytes, bytes | None] | None:
        """The changes of ``version`` read ahead, if the file is still the one read."""
        with self._lock:
            self._tailed.add(partition)
            found = self._ahead.pop(partition, None)
        if found is None or found[0] != version:
            return None
        return found[2] if self.files(partition).stamp(version) == found[1] else None

    # -- changes and snapshots ---------------------------------------------------------------

    def read_change_columns(self, record: CommitRecord, partition: int) -> None:
        """None: the changes are converted from Spark's files to Python objects (read them
        with :meth:`read_changes`)."""
        return None

    def read_changes(
        self, record: CommitRecord, partition: int
    ) -> tuple[list[bytes], list[bytes | None]]:
        """The state changes batch ``record.batch_id`` made (Spark's version ``batch + 1``),
        the last change of a key winning, as sparkiq keys and rows."""
        version = version_of_batch(record.batch_id)
        try:
            changes = self._read_before(partition, version)
            if changes is None:
                changes = self._convert.convert(self.files(partition).changes(version))
        except ChangelogError:
            raise
        except (OSError, ValueError, IndexError, TypeError) as exc:
            raise CorruptSegmentError(
                f"cannot read the changes of version {version} (batch {record.batch_id}) of "
                f"{self._where(partition)}: {exc!r}",
                store=self.plan.name,
                partition=partition,
            ) from exc
        return list(changes), list(changes.values())

    def snapshots(self, partition: int) -> list[SnapshotInfo]:
        """Spark's snapshots of the partition whose batch is committed (a snapshot of version
        ``N`` is the state after batch ``N - 1``)."""
        try:
            versions = self.files(partition).snapshot_versions()
        except (ChangelogError, OSError) as exc:
            log.error("%s: cannot list snapshots: %s", self._where(partition), exc)
            return []
        committed = set(self.checkpoint.committed_batches())
        return [
            SnapshotInfo(self.plan.name, partition, batch_of_version(v), 0, 0, "")
            for v in sorted(versions)
            if batch_of_version(v) in committed
        ]

    def read_snapshot(self, info: SnapshotInfo) -> tuple[list[bytes], list[bytes]]:
        version = version_of_batch(info.batch_id)
        try:
            rows = self._convert.convert(self.files(info.partition).snapshot(version))
        except CorruptSegmentError:
            raise
        except (ChangelogError, OSError, ValueError, IndexError, TypeError) as exc:
            raise CorruptSegmentError(
                f"cannot read the snapshot of version {version} of "
                f"{self._where(info.partition)}: {exc}",
                store=self.plan.name,
                partition=info.partition,
            ) from exc
        return list(rows), [v for v in rows.values() if v is not None]

    def __repr__(self) -> str:
        return f"CheckpointSource({str(self.checkpoint.path)!r}, {self.plan.name!r})"


class CheckpointCatalog:
    """The state stores of the checkpoint at ``uri`` as tables named after ``name`` (see the
    module docstring). Stores that appear later (a query that has not run its first batch)
    are offered once they exist."""

    def __init__(
        self,
        uri: str,
        name: str,
        operators: Mapping[int, str] | Iterable[int] | None = None,
    ) -> None:
        self.uri = uri
        self.name = name
        self.operators = operators if isinstance(operators, Mapping | None) else list(operators)
        self.checkpoint = Checkpoint(uri)  # ConfigError now for a path that is no checkpoint
        self._lock = threading.Lock()  # guards _plans and _problem
        self._plans: dict[str, StoreTable] = {}
        self._problem: str | None = None

    def _refresh(self) -> dict[str, StoreTable]:
        """The tables as of now. Before the query's first batch (or while its files cannot be
        read) the last known tables, with the reason logged once."""
        try:
            stores = self.checkpoint.stores()
        except ChangelogError as exc:
            with self._lock:
                if exc.message != self._problem:
                    log.warning("checkpoint %s: %s", self.uri, exc.message)
                self._problem = exc.message
                return dict(self._plans)
        plans = {p.name: p for p in plan_tables(self.name, stores, self.operators)}
        with self._lock:
            self._plans, self._problem = plans, None
        return plans

    def names(self) -> list[str]:
        return sorted(self._refresh())

    def plans(self) -> list[StoreTable]:
        return [p for _, p in sorted(self._refresh().items())]

    def open(self, name: str) -> CheckpointSource:
        with self._lock:
            plan = self._plans.get(name)
        if plan is None:
            plan = self._refresh().get(name)
        if plan is None:
            raise ConfigError(f"no table {name!r} in checkpoint {self.uri!r}")
        return CheckpointSource(self.checkpoint, plan, self._incarnation(plan))

    def incarnation(self, name: str) -> str | None:
        with self._lock:
            plan = self._plans.get(name)
        if plan is None:
            return None
        try:
            return self._incarnation(plan)
        except (ChangelogError, OSError):
            return None

    def _incarnation(self, plan: StoreTable) -> str:
        # The query id changes when the checkpoint is deleted and the query started anew;
        # the layout digest when the same name now means another store.
        layout = hashlib.sha256(plan.schema.spark_json().encode()).hexdigest()[:16]
        return f"{self.checkpoint.query_id}:{plan.info.operator_id}:{layout}"

    def __repr__(self) -> str:
        return f"CheckpointCatalog({self.uri!r}, {self.name!r})"
