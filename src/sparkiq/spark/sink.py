"""The table sink: Spark's ``foreachBatch`` function that writes a table's changelog.

For every micro-batch ``b`` of the table's streaming query:

1. if the commit record of ``b`` exists, only evaluate the batch (Spark's state stores must
   commit it) and return: Spark re-runs a batch after a failure (at-least-once
   ``foreachBatch``), and a committed batch must not be written twice;
2. tag each row with its partition ``pmod(hash(key columns), P)`` using Spark's own
   ``hash``, shuffle so each partition's rows meet in one task, and let that task (on an
   executor) encode the rows, write one checksummed segment per partition and read it back
   to verify that it landed whole (:func:`~sparkiq.changelog.segment.verify_landed`).
   When the batch already sits in the table's partitions (a streaming aggregation by the
   key into ``P`` state partitions: :mod:`sparkiq.spark.batch_layout`), there is no
   shuffle: task ``i`` writes partition ``i``'s segment where the rows are, after checking
   that every row's tag is ``i``. A task holding a row that is not writes nothing and fails
   the job with :data:`IN_PLACE_REFUSED` in its error (the plan is not what the checkpoint
   suggested: the query changes a key column after the aggregation, say); the driver then
   writes the same batch again after a shuffle, as write attempt 1, whose segments have
   other file names than the refused attempt's (the commit record says which, so a late
   write of the refused attempt is never read), and shuffles the query's later batches
   (logged once, as a WARNING). ``SPARKIQ_SINK_SHUFFLE=always`` (where the App is created)
   always shuffles;
3. collect only the segments' facts (partition, rows, size, sha256, path) to the driver,
   which checks that each is at the path readers use and has its size there
   (:func:`~sparkiq.changelog.segment.check_visible`);
4. write the commit record with the batch's source end offsets, read from Spark's offset log
   of the same batch in the query's checkpoint.

A segment that fails either check fails the batch (the query stops with an error naming the
file) and no commit record is written: a committed batch never names a segment that is not
where readers look.

A crash before step 4 leaves segments no commit record lists: readers ignore them and the
re-run rewrites identical files (a segment's bytes are a function of its rows). A crash after
step 4 makes the re-run a no-op. Either way each batch is applied exactly once.

Paths: ``state_dir`` and the checkpoint location are made absolute once, on the driver, when
the sink is created (:func:`absolute_location`): executors run in their own working
directories, where a relative path would name another place.

The sink holds plain data only (table name, manifest, ``state_dir`` and checkpoint URIs):
with Spark Connect the function is pickled and runs in a Python process the Connect server
starts, not in the application's process, so nothing it does can reach the :class:`App`.
The driver learns of commits by reading the changelog (see :mod:`sparkiq.spark.app`).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

import sparkiq.spark.worker_python as worker_python
from sparkiq.changelog import Changelog, CommitRecord, SegmentInfo, TableManifest
from sparkiq.changelog.segment import check_visible, verify_landed
from sparkiq.changelog.storage import Storage, open_storage
from sparkiq.errors import ChangelogError, ConfigError
from sparkiq.schema.codec import KeyCodec, RowCodec
from sparkiq.spark.batch_layout import BatchLayout, batch_layout

__all__ = [
    "ASSUME_IN_PLACE_ENV",
    "CRASH_ENV",
    "IN_PLACE_REFUSED",
    "SEGMENT_FAULT_ENV",
    "SHUFFLE_ENV",
    "TASK_PHASES",
    "TableSink",
    "absolute_location",
    "pyarrow_uri",
    "spark_uri",
    "use_this_python_for_local_workers",
    "write_task_count",
]

log = logging.getLogger("sparkiq.sink")

PARTITION_COLUMN = "__sparkiq_partition"

#: Fault injection for tests of exactly-once: ``"<point>:<table>:<batch_id>"`` makes the
#: driver process exit abruptly at that point (``before_commit`` or ``after_commit``).
CRASH_ENV = "SPARKIQ_TEST_CRASH_AT"

#: Fault injection for tests of segment verification: ``"<fault>:<table>:<batch_id>"`` damages
#: every segment of that batch on the executor right after writing it: ``truncate`` or
#: ``remove`` before the executor's read-back, ``remove_after_verify`` after it (so only the
#: driver's check can notice). Read on the driver when the batch starts and shipped as data.
SEGMENT_FAULT_ENV = "SPARKIQ_TEST_SEGMENT_FAULT"
_FAULTS = ("truncate", "remove", "remove_after_verify")

#: Fault injection for tests of the in-place check: ``"<table>:<batch_id>"`` makes the driver
#: write that batch without a shuffle whatever :func:`batch_layout` decided, as if it had
#: guessed Spark's plan wrong.
ASSUME_IN_PLACE_ENV = "SPARKIQ_TEST_ASSUME_IN_PLACE"

#: In the error of a write task that refuses to write a batch in place (:func:`_check_in_place`):
#: the driver recognises the refusal by it in the failed job's error text, as classic PySpark
#: and Spark Connect both wrap it, and writes the batch again after a shuffle.
IN_PLACE_REFUSED = "SPARKIQ_IN_PLACE_REFUSED"

#: ``always``: every batch is shuffled into the table's partitions, even one that already
#: sits in them (``auto``, the default, writes such a batch in place). Read where the sink is
#: created (the App's process).
SHUFFLE_ENV = "SPARKIQ_SINK_SHUFFLE"

_META_SCHEMA = (
    "partition int, rows long, size long, sha256 string, path string, "
    "receive_ms double, encode_ms double, write_ms double, verify_ms double"
)
#: A write task's phases (milliseconds), reported with each segment's facts: waiting for its
#: rows (in place, that is the batch's own last stage; else the shuffle), encoding them,
#: writing the segment (sort, Arrow IPC, write, fsync, rename), reading it back.
TASK_PHASES = ("receive_ms", "encode_ms", "write_ms", "verify_ms")


class TableSink:
    """``foreachBatch`` target writing one table's changelog.

    Every attribute is plain, picklable data, and the object keeps no state between batches
    but its decision to write them in place or not (:meth:`layout`: read from the checkpoint,
    which cannot change for the query's life, or learned from a batch whose in-place write
    was refused): under Spark Connect it runs as a pickled copy in the server's Python
    process. Nothing correct depends on that state: a copy without it decides again. The
    changelog is the only thing it changes; readers learn of a batch from its commit record.
    ``write_tasks`` caps how many tasks write segments (see :func:`write_task_count`).
    """

    def __init__(
        self,
        state_dir: str,
        manifest: TableManifest,
        checkpoint_location: str,
        write_tasks: int,
    ) -> None:
        self.state_dir = absolute_location(state_dir)
        self.checkpoint_location = absolute_location(checkpoint_location)
        self.manifest = manifest
        self.write_tasks = max(1, min(manifest.partitions, write_tasks))
        self.always_shuffle = _always_shuffle()
        self._layout: BatchLayout | None = None  # kept once settled (see batch_layout)

    def __call__(self, df: Any, batch_id: int) -> None:
        from pyspark.sql import functions as F

        table = self.manifest.name
        started = time.perf_counter()
        changelog = Changelog(self.state_dir, table)
        if changelog.has_commit(batch_id):
            # Spark still needs the batch evaluated on every partition so that its state
            # stores commit (Spark 4 validates this); the changelog must not change.
            log.info("%s: batch %d already committed; evaluating its re-run only", table, batch_id)
            df.write.format("noop").mode("overwrite").save()
            return
        offsets = read_source_offsets(self.checkpoint_location, batch_id)
        keys = [F.col(f"`{c}`") for c in self.manifest.key_columns]
        tagged = df.withColumn(
            PARTITION_COLUMN, F.pmod(F.hash(*keys), F.lit(self.manifest.partitions))
        )
        layout = self.layout()
        if _assume_in_place(table, batch_id):
            layout = BatchLayout(True, f"{ASSUME_IN_PLACE_ENV} is set")
        fault = _segment_fault(table, batch_id)
        planned = time.perf_counter()
        attempt = 0
        try:
            facts = self._write(tagged, batch_id, layout, fault, attempt)
        except Exception as error:
            if not layout.in_place or IN_PLACE_REFUSED not in str(error):
                raise
            layout = self._refused_in_place(batch_id, layout, error)
            attempt = 1  # other file names: a late write of the refused attempt is not read
            facts = self._write(tagged, batch_id, layout, fault, attempt)
        ran = time.perf_counter()
        segments = _landed_segments(changelog, batch_id, facts, attempt)
        checked = time.perf_counter()
        record = CommitRecord(
            table=table,
            batch_id=batch_id,
            mode="complete" if self.manifest.output_mode == "complete" else "update",
            segments=segments,
            source_offsets=tuple(offsets),
            position=position_components(offsets),
            schema_version=self.manifest.schema_version,
            committed_at=time.time(),
        )
        _maybe_crash("before_commit", table, batch_id)
        changelog.write_commit(record)
        _maybe_crash("after_commit", table, batch_id)
        done = time.perf_counter()
        phases = {
            "prepare_ms": 1e3 * (planned - started),  # commit check, offsets, layout, plan
            "job_ms": 1e3 * (ran - planned),  # the Spark job: batch, shuffle?, write tasks
            "check_ms": 1e3 * (checked - ran),
            "commit_ms": 1e3 * (done - checked),
        }
        for name in TASK_PHASES:  # summed over the write tasks
            phases[f"tasks_{name}"] = sum(float(f[name]) for f in facts)
        log.debug(
            "%s: batch %d written %s: %s",
            table,
            batch_id,
            "in place" if layout.in_place else "after a shuffle",
            ", ".join(f"{k} {v:.1f}" for k, v in phases.items()),
            extra={"sparkiq_sink_phases": phases, "sparkiq_in_place": layout.in_place},
        )

    def _write(
        self, tagged: Any, batch_id: int, layout: BatchLayout, fault: str | None, attempt: int
    ) -> list[Any]:
        """Run the Spark job writing the batch's segments (in place or after a shuffle, as
        ``layout`` says) as write ``attempt``; the segments' facts."""
        writer = _segment_writer(
            self.state_dir,
            self.manifest,
            batch_id,
            fault,
            in_place=layout.reason if layout.in_place else None,
            attempt=attempt,
        )
        if not layout.in_place:
            tagged = tagged.repartition(self.write_tasks, PARTITION_COLUMN)
        return list(tagged.mapInArrow(writer, _META_SCHEMA).collect())

    def _refused_in_place(
        self, batch_id: int, layout: BatchLayout, error: Exception
    ) -> BatchLayout:
        """A write task refused to write the batch in place (:func:`_check_in_place`): the
        query's plan is not what its checkpoint suggested (for example it rewrites a key
        column after the aggregation). Keep shuffling this query's batches (in this process:
        a copy of the sink elsewhere, as under Spark Connect, learns the same from its own
        first batch) and say so once; the shuffled layout to write the batch again with."""
        table = self.manifest.name
        detail = next(
            (line.strip() for line in str(error).splitlines() if IN_PLACE_REFUSED in line), ""
        )
        log.warning(
            "%s: batch %d could not be written without a shuffle (%s), so it is written "
            "again after one, and so is every later batch of this query: %s. Set %s=always "
            "where the App runs to skip the attempt.",
            table,
            batch_id,
            layout.reason,
            detail[:500] or "a write task held rows of another partition than its own",
            SHUFFLE_ENV,
        )
        self._layout = BatchLayout(
            False,
            f"batch {batch_id} held rows outside their partitions' tasks; {layout.reason}",
            True,
        )
        return self._layout

    def layout(self) -> BatchLayout:
        """Whether this query's batches are written in place or shuffled (see
        :mod:`sparkiq.spark.batch_layout`), from its checkpoint; kept once settled."""
        if self.always_shuffle:
            return BatchLayout(False, f"{SHUFFLE_ENV}=always")
        if self._layout is not None:
            return self._layout
        checkpoint = open_storage(pyarrow_uri(self.checkpoint_location))
        layout = batch_layout(checkpoint, self.manifest.key_columns, self.manifest.partitions)
        if layout.settled:
            log.info(
                "%s: writing batches %s: %s",
                self.manifest.name,
                "in place, without a shuffle" if layout.in_place else "after a shuffle",
                layout.reason,
            )
            self._layout = layout
        return layout


def _always_shuffle() -> bool:
    value = os.environ.get(SHUFFLE_ENV, "auto").strip().lower()
    if value not in ("auto", "always"):
        raise ConfigError(f"{SHUFFLE_ENV} must be 'auto' or 'always', got {value!r}")
    return value == "always"


def _assume_in_place(table: str, batch_id: int) -> bool:
    if os.environ.get(ASSUME_IN_PLACE_ENV) != f"{table}:{batch_id}":
        return False
    log.error("%s set: writing %s batch %d in place", ASSUME_IN_PLACE_ENV, table, batch_id)
    return True


def write_task_count(spark: Any, partitions: int) -> int:
    """How many tasks write a batch's segments: one per partition, but no more than the
    session's shuffle partitions (``spark.sql.shuffle.partitions``, read on the driver, the
    same with a classic and a Spark Connect session), since each Python task costs far more
    to start than its share of the writing. A task writes one segment for each partition it
    receives; all rows of a partition go to one task, so there is still exactly one segment
    per partition."""
    try:
        shuffle = int(spark.conf.get("spark.sql.shuffle.partitions"))
    except (TypeError, ValueError):  # an unset or odd value: one task per partition
        shuffle = partitions
    return max(1, min(partitions, shuffle))


def _landed_segments(
    changelog: Changelog, batch_id: int, facts: list[Any], attempt: int = 0
) -> dict[int, SegmentInfo]:
    """The segments the executors reported (each verified where its executor looks), checked
    on the driver: reported at the path readers use, and there with the reported size.
    Raises :class:`ChangelogError` naming the segment otherwise."""
    segments: dict[int, SegmentInfo] = {}
    paths: dict[str, SegmentInfo] = {}
    for fact in facts:
        info = SegmentInfo(
            int(fact["partition"]),
            int(fact["rows"]),
            int(fact["size"]),
            str(fact["sha256"]),
            attempt,
        )
        expected = changelog.segment_path(info.partition, batch_id, attempt)
        if fact["path"] != expected:
            raise ChangelogError(
                f"an executor wrote the segment of partition {info.partition}, batch {batch_id} "
                f"at {fact['path']!r}, but readers look at {expected!r}; the batch is not "
                "committed. Do the executors run the same sparkiq version as the driver?",
                store=changelog.table,
                partition=info.partition,
            )
        segments[info.partition] = info
        paths[expected] = info
    check_visible(changelog.storage, paths, changelog.table, batch_id)
    return segments


def _segment_writer(
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


def _segment_fault(table: str, batch_id: int) -> str | None:
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


def absolute_location(location: str) -> str:
    """``location`` as every process means the same by it: a URI (``s3://...``,
    ``file:///...``) unchanged, a local path made absolute against this process's working
    directory (``~`` expanded).

    Called on the driver before anything is shipped to executors, which run in working
    directories of their own; anything else (an empty value, a non-string) is returned as
    is, for :func:`~sparkiq.changelog.storage.open_storage` to reject with its message.
    """
    if not isinstance(location, str) or not location.strip() or "://" in location:
        return location
    return os.path.abspath(os.path.expanduser(location))


def read_source_offsets(checkpoint_location: str, batch_id: int) -> list[Any]:
    """The end offsets of ``batch_id``, one per source, from Spark's offset log.

    Spark writes ``<checkpoint>/offsets/<batch_id>`` before running the batch: a version line,
    a metadata line, then one line per source holding its offset as JSON (``-`` for none).
    """
    storage = open_storage(pyarrow_uri(checkpoint_location))
    path = storage.path("offsets", str(batch_id))
    try:
        lines = storage.read_bytes(path).decode().splitlines()
    except FileNotFoundError:
        raise ChangelogError(
            f"Spark's offset log for batch {batch_id} is missing at {path!r}: is the query "
            f"running with checkpointLocation {checkpoint_location!r}?"
        ) from None
    offsets: list[Any] = []
    for line in lines[2:]:
        line = line.strip()
        if line in ("", "-"):
            offsets.append(None)
            continue
        try:
            offsets.append(json.loads(line))
        except ValueError:
            offsets.append(line)
    return offsets


def pyarrow_uri(spark_uri: str) -> str:
    """The same location for pyarrow: Hadoop's ``s3a://`` is pyarrow's ``s3://``."""
    return "s3://" + spark_uri[len("s3a://") :] if spark_uri.startswith("s3a://") else spark_uri


def spark_uri(pyarrow_location: str) -> str:
    """The same location for Spark's Hadoop filesystems: pyarrow's ``s3://`` is ``s3a://``."""
    if pyarrow_location.startswith("s3://"):
        return "s3a://" + pyarrow_location[len("s3://") :]
    return pyarrow_location


def position_components(offsets: list[Any]) -> dict[str, dict[int, int]]:
    """Position components reported by the sources: Kafka-shaped offsets
    (``{"topic": {"partition": offset}}``) become ``kafka:<topic>`` components."""
    components: dict[str, dict[int, int]] = {}
    for offset in offsets:
        if not isinstance(offset, dict):
            continue
        for topic, partitions in offset.items():
            if isinstance(partitions, dict) and all(
                isinstance(v, int) and str(k).lstrip("-").isdigit() for k, v in partitions.items()
            ):
                target = components.setdefault(f"kafka:{topic}", {})
                for partition, value in partitions.items():
                    target[int(partition)] = max(value, target.get(int(partition), value))
    return components


def _maybe_crash(point: str, table: str, batch_id: int) -> None:
    spec = os.environ.get(CRASH_ENV)
    if spec and spec == f"{point}:{table}:{batch_id}":
        log.error("%s set: exiting at %s of %s batch %d", CRASH_ENV, point, table, batch_id)
        os._exit(86)


def use_this_python_for_local_workers(spark: Any) -> None:
    """In local mode, run Spark's Python workers with this interpreter, through
    ``sparkiq-worker-python`` (:mod:`sparkiq.spark.worker_python`: workers that connect back
    before their imports, so a busy machine does not make them miss Spark's 10 s).

    Without ``PYSPARK_PYTHON`` PySpark starts workers with whatever ``python3`` is first on
    ``PATH``, which for a script run as ``.venv/bin/python app.py`` is not the virtual
    environment, so the sink's tasks fail to import sparkiq and pyarrow. Executors of a local
    master run on this machine, so this interpreter is the right one; an explicit
    ``PYSPARK_PYTHON`` or ``spark.pyspark.python`` always wins, and cluster masters are left
    alone (their executors need sparkiq installed, see docs/guide.md).
    """
    # The one place that looks at the session's kind. A Connect session is never asked for
    # a sparkContext (it has none; its server picks its workers' Python): told apart by its
    # class's module, without importing the Connect client (grpc) into classic processes.
    if type(spark).__module__.startswith("pyspark.sql.connect"):
        return
    context = getattr(spark, "sparkContext", None)  # a classic session; None for a stand-in
    if context is None or not str(getattr(context, "master", "")).startswith("local"):
        return
    if os.environ.get("PYSPARK_PYTHON") or context.getConf().get("spark.pyspark.python"):
        return
    python = worker_python.command()
    if getattr(context, "pythonExec", python) != python:
        log.info("running local Python workers with %s", python)
        context.pythonExec = python
