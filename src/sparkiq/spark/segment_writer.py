"""The function that writes a micro-batch's segments: encode rows, write, verify, report.

:func:`segment_writer` builds it for one batch of one table. Write tasks run it on the
executors (through ``mapInArrow``: it takes the tagged rows of one task and yields one fact
row per segment written), and the driver runs the same function over a batch it collected
(:mod:`sparkiq.spark.sink`), so a segment's bytes are the same wherever it is written: a
function of its rows. The tag column (:data:`PARTITION_COLUMN`) is Spark's own
``pmod(hash(key), P)``, computed before the rows get here.

It holds plain data only and imports pyspark only inside a task (for its partition id), so
it pickles into Spark's Python workers and runs without Spark on the driver.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sparkiq.changelog import Changelog, TableManifest
from sparkiq.changelog.segment import verify_landed
from sparkiq.changelog.storage import Storage
from sparkiq.errors import ChangelogError
from sparkiq.schema.codec import KeyCodec, RowCodec

__all__ = [
    "IN_PLACE_REFUSED",
    "META_SCHEMA",
    "PARTITION_COLUMN",
    "SEGMENT_FAULT_ENV",
    "TASK_PHASES",
    "segment_fault",
    "segment_writer",
]

log = logging.getLogger("sparkiq.sink")

#: The tag column: each row's partition of the table.
PARTITION_COLUMN = "__sparkiq_partition"

#: Fault injection for tests of segment verification: ``"<fault>:<table>:<batch_id>"`` damages
#: every segment of that batch on the executor right after writing it: ``truncate`` or
#: ``remove`` before the executor's read-back, ``remove_after_verify`` after it (so only the
#: driver's check can notice). Read on the driver when the batch starts and shipped as data.
SEGMENT_FAULT_ENV = "SPARKIQ_TEST_SEGMENT_FAULT"
_FAULTS = ("truncate", "remove", "remove_after_verify")

#: In the error of a write task that refuses to write a batch in place (:func:`_check_in_place`):
#: the driver recognises the refusal by it in the failed job's error text, as classic PySpark
#: and Spark Connect both wrap it, and writes the batch again after a shuffle.
IN_PLACE_REFUSED = "SPARKIQ_IN_PLACE_REFUSED"

#: The fact row the function yields for each segment it wrote (Spark DDL, for ``mapInArrow``).
META_SCHEMA = (
    "partition int, rows long, size long, sha256 string, path string, "
    "receive_ms double, encode_ms double, write_ms double, verify_ms double"
)
#: A write task's phases (milliseconds), reported with each segment's facts: waiting for its
#: rows (in place, that is the batch's own last stage; else the shuffle), encoding them,
#: writing the segment (sort, Arrow IPC, write, fsync, rename), reading it back.
TASK_PHASES = ("receive_ms", "encode_ms", "write_ms", "verify_ms")


def segment_writer(
    state_dir: str,
    manifest: TableManifest,
    batch_id: int,
    fault: str | None = None,
    in_place: str | None = None,
    attempt: int = 0,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The function each executor task runs: encode its rows, write its segments (as the
    batch's write ``attempt``, their file names), read each back to verify it landed, and
    report it. ``fault`` is :data:`SEGMENT_FAULT_ENV`'s.

    ``in_place`` (the reason the batch was not shuffled) says that the task's partition id
    is the partition of every row it holds: checked on the tag column before anything is
    written, raising :class:`ChangelogError` (with :data:`IN_PLACE_REFUSED`) otherwise."""
    schema_json = manifest.schema.spark_json()
    key_columns = manifest.key_columns
    window_column = manifest.window_column
    tombstone = manifest.tombstone_column
    table = manifest.name

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from sparkiq.schema.types import TableSchema

        clock = time.perf_counter()
        schema = TableSchema.from_spark_json(schema_json, key_columns, window_column)
        received = [b for b in batches if b.num_rows]
        if not received:
            return
        receive_ms, clock = 1e3 * (time.perf_counter() - clock), time.perf_counter()
        data = pa.Table.from_batches(received)
        changelog = Changelog(state_dir, table)
        key_codec, row_codec = KeyCodec(schema), RowCodec(schema)
        found = pc.unique(data.column(PARTITION_COLUMN)).to_pylist()
        if in_place is not None:
            _check_in_place(found, table, batch_id, in_place)
        for partition in found:
            rows = data
            if len(found) > 1:
                rows = data.filter(pc.equal(data.column(PARTITION_COLUMN), partition))
            keys = key_codec.encode_arrow_array(rows)
            values = pa.array(
                row_codec.encode_arrow(rows.select(list(schema.column_names))), pa.binary()
            )
            if tombstone is not None:  # a deleted key's value is null
                deleted = pc.fill_null(rows.column(tombstone), False)
                values = pc.if_else(deleted, pa.scalar(None, pa.binary()), values)
            encoded = time.perf_counter()
            # of several rows for a key the later wins
            info = changelog.write_segment_arrays(int(partition), batch_id, keys, values, attempt)
            written = time.perf_counter()
            path = changelog.segment_path(info.partition, batch_id, attempt)
            if fault in ("truncate", "remove"):
                _damage(changelog.storage, path, fault)
            verify_landed(changelog.storage, path, info, table, batch_id)
            if fault == "remove_after_verify":
                _damage(changelog.storage, path, fault)
            verified = time.perf_counter()
            phases = (
                receive_ms,
                *(
                    1e3 * (b - a)
                    for a, b in itertools.pairwise((clock, encoded, written, verified))
                ),
            )
            receive_ms, clock = 0.0, verified  # the task's wait counts once
            yield pa.record_batch(
                {
                    "partition": pa.array([info.partition], pa.int32()),
                    "rows": pa.array([info.rows], pa.int64()),
                    "size": pa.array([info.size], pa.int64()),
                    "sha256": pa.array([info.sha256], pa.string()),
                    "path": pa.array([path], pa.string()),
                    **{
                        name: pa.array([ms], pa.float64())
                        for name, ms in zip(TASK_PHASES, phases, strict=True)
                    },
                }
            )

    return write


def _check_in_place(found: list[Any], table: str, batch_id: int, reason: str) -> None:
    """In a batch written in place, the rows of the task of partition ``i`` must all be
    tagged ``i`` (``found``: the distinct tags of its rows); raise before anything is
    written otherwise, with :data:`IN_PLACE_REFUSED` in the message for the driver to
    recognise (it writes the batch again after a shuffle)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    task = context.partitionId() if context is not None else None
    if found == [task]:
        return
    raise ChangelogError(
        f"{IN_PLACE_REFUSED}: batch {batch_id} of {table!r} was to be written without a "
        f"shuffle ({reason}), but the write task of partition {task} holds rows of "
        f"partitions {sorted(found)}: the query does not leave its rows in the partitions "
        "of the table's key (does it change a key column after the aggregation?). This "
        "task wrote nothing; the sink writes the batch again after a shuffle.",
        store=table,
    )


def segment_fault(table: str, batch_id: int) -> str | None:
    spec = os.environ.get(SEGMENT_FAULT_ENV)
    if not spec:
        return None
    fault, _, target = spec.partition(":")
    if fault not in _FAULTS or target != f"{table}:{batch_id}":
        return None
    log.error("%s set: damaging the segments of %s batch %d", SEGMENT_FAULT_ENV, table, batch_id)
    return fault


def _damage(storage: Storage, path: str, fault: str) -> None:
    if fault == "truncate":
        data = storage.read_bytes(path)
        storage.write_atomic(path, data[: len(data) // 2])
    else:
        storage.delete(path)
