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
   A small batch is written on the driver instead: when the table's previous batch had at
   most :data:`DRIVER_ROWS` rows, the tagged batch is collected as Arrow (one Spark job, as
   evaluating it costs anyway) and the driver writes its segments with the same function the
   tasks run, with no Python stage in Spark at all. A batch the driver cannot collect (over
   ``spark.driver.maxResultSize``, say) is written by tasks after all.
   ``SPARKIQ_SINK_WRITE`` (where the App is created) says ``auto`` (the default), ``tasks``
   or ``driver``;
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

import json
import logging
import os
import time
from typing import Any

import sparkiq.spark.worker_python as worker_python
from sparkiq.changelog import Changelog, CommitRecord, SegmentInfo, TableManifest
from sparkiq.changelog.segment import check_visible
from sparkiq.changelog.storage import open_storage
from sparkiq.errors import ChangelogError, ConfigError
from sparkiq.spark.batch_layout import BatchLayout, batch_layout
from sparkiq.spark.segment_writer import (
    IN_PLACE_REFUSED,
    META_SCHEMA,
    PARTITION_COLUMN,
    SEGMENT_FAULT_ENV,
    TASK_PHASES,
    segment_fault,
    segment_writer,
)

__all__ = [
    "ASSUME_IN_PLACE_ENV",
    "CRASH_ENV",
    "IN_PLACE_REFUSED",
    "SEGMENT_FAULT_ENV",
    "DRIVER_ROWS",
    "SHUFFLE_ENV",
    "TASK_PHASES",
    "WRITE_ENV",
    "TableSink",
    "absolute_location",
    "collect_arrow",
    "pyarrow_uri",
    "spark_uri",
    "tag_expression",
    "use_this_python_for_local_workers",
    "write_task_count",
]

log = logging.getLogger("sparkiq.sink")

#: Fault injection for tests of exactly-once: ``"<point>:<table>:<batch_id>"`` makes the
#: driver process exit abruptly at that point (``before_commit`` or ``after_commit``).
CRASH_ENV = "SPARKIQ_TEST_CRASH_AT"

#: Fault injection for tests of the in-place check: ``"<table>:<batch_id>"`` makes the driver
#: write that batch without a shuffle whatever :func:`batch_layout` decided, as if it had
#: guessed Spark's plan wrong.
ASSUME_IN_PLACE_ENV = "SPARKIQ_TEST_ASSUME_IN_PLACE"

#: ``always``: every batch is shuffled into the table's partitions, even one that already
#: sits in them (``auto``, the default, writes such a batch in place). Read where the sink is
#: created (the App's process).
SHUFFLE_ENV = "SPARKIQ_SINK_SHUFFLE"

#: Where a batch's segments are written: ``auto`` (the default) on the driver when the
#: table's previous batch had at most :data:`DRIVER_ROWS` rows, else by write tasks;
#: ``tasks`` or ``driver`` always there. Read where the sink is created (the App's process).
WRITE_ENV = "SPARKIQ_SINK_WRITE"
#: The most rows of a table's previous batch for which ``auto`` writes on the driver: a
#: streaming batch is usually about as large as the one before, and this many rows encode
#: in tens of milliseconds on one core and take a few MB there, while a Python stage in
#: Spark costs a micro-batch about 100 ms whatever its size (docs/benchmarks.md).
DRIVER_ROWS = 50_000
#: In Spark's error for a collect over ``spark.driver.maxResultSize`` (classic and Connect).
_TOO_LARGE = "maxResultSize"


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
        self.write_where = _write_where()
        self._layout: BatchLayout | None = None  # kept once settled (see batch_layout)

    def __call__(self, df: Any, batch_id: int) -> None:
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
        tagged = df.selectExpr("*", tag_expression(self.manifest))
        layout = self.layout()
        if _assume_in_place(table, batch_id):
            layout = BatchLayout(True, f"{ASSUME_IN_PLACE_ENV} is set")
        fault = segment_fault(table, batch_id)
        planned = time.perf_counter()
        attempt = 0
        facts = None
        where = "on the driver"
        if self._on_driver(changelog, batch_id):
            facts = self._write_on_driver(tagged, batch_id, fault)
        if facts is None:
            where = "in place" if layout.in_place else "after a shuffle"
            try:
                facts = self._write(tagged, batch_id, layout, fault, attempt)
            except Exception as error:
                if not layout.in_place or IN_PLACE_REFUSED not in str(error):
                    raise
                layout = self._refused_in_place(batch_id, layout, error)
                where = "after a shuffle"
                attempt = 1  # other file names: a late write of the refused attempt is unread
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
            "job_ms": 1e3 * (ran - planned),  # the Spark job(s) and the driver's writing
            "check_ms": 1e3 * (checked - ran),
            "commit_ms": 1e3 * (done - checked),
        }
        for name in TASK_PHASES:  # summed over the write tasks
            phases[f"tasks_{name}"] = sum(float(f[name]) for f in facts)
        log.debug(
            "%s: batch %d written %s: %s",
            table,
            batch_id,
            where,
            ", ".join(f"{k} {v:.1f}" for k, v in phases.items()),
            extra={
                "sparkiq_batch_id": batch_id,
                "sparkiq_sink_phases": phases,
                "sparkiq_in_place": where == "in place",
                "sparkiq_written": where,
            },
        )

    def _on_driver(self, changelog: Changelog, batch_id: int) -> bool:
        """Whether to write the batch on the driver (see :data:`WRITE_ENV`): ``auto`` asks
        the changelog how large the previous batch was (nothing is kept between batches)."""
        if self.write_where != "auto":
            return self.write_where == "driver"
        previous = changelog.read_commit(batch_id - 1) if batch_id > 0 else None
        return previous is not None and previous.rows <= DRIVER_ROWS

    def _write_on_driver(
        self, tagged: Any, batch_id: int, fault: str | None
    ) -> list[dict[str, Any]] | None:
        """Collect the tagged batch as Arrow and write its segments here, with the write
        tasks' own function; its segments' facts. None when the batch is over
        ``spark.driver.maxResultSize`` and ``auto`` lets write tasks take it."""
        try:
            data = collect_arrow(tagged)
        except Exception as error:
            # Only a batch too large for the driver goes to tasks: any other failure (the
            # query stopping mid-batch, a failed task) is the batch's, as on the task path.
            if self.write_where == "driver" or _TOO_LARGE not in str(error):
                raise
            log.warning(
                "%s: batch %d could not be collected to the driver (%s); write tasks write it",
                self.manifest.name,
                batch_id,
                str(error).splitlines()[0][:300] if str(error) else type(error).__name__,
            )
            return None
        writer = segment_writer(self.state_dir, self.manifest, batch_id, fault)
        return [fact for out in writer(iter(data.to_batches())) for fact in out.to_pylist()]

    def _write(
        self, tagged: Any, batch_id: int, layout: BatchLayout, fault: str | None, attempt: int
    ) -> list[Any]:
        """Run the Spark job writing the batch's segments (in place or after a shuffle, as
        ``layout`` says) as write ``attempt``; the segments' facts."""
        writer = segment_writer(
            self.state_dir,
            self.manifest,
            batch_id,
            fault,
            in_place=layout.reason if layout.in_place else None,
            attempt=attempt,
        )
        if not layout.in_place:
            tagged = tagged.repartition(self.write_tasks, PARTITION_COLUMN)
        return list(tagged.mapInArrow(writer, META_SCHEMA).collect())

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


def tag_expression(manifest: TableManifest) -> str:
    """The SQL expression of the tag column: ``pmod(hash(key columns), P)`` named
    :data:`PARTITION_COLUMN`, Spark's ``hash`` (Murmur3, seed 42) as ``F.hash`` computes it.

    Given to ``selectExpr`` as one string rather than built from ``pyspark.sql.functions``:
    with a classic session each of those functions is several py4j round trips from the
    ``foreachBatch`` thread (the function's lookup, and PySpark 4's call-site capture asking
    for the active session and a setting), 28 a batch for ``col``, ``hash``, ``lit`` and
    ``pmod`` against about 5 for this string; under Spark Connect both build the plan on the
    client."""
    keys = ", ".join(_quoted(c) for c in manifest.key_columns)
    return f"pmod(hash({keys}), {int(manifest.partitions)}) AS {_quoted(PARTITION_COLUMN)}"


def _quoted(name: str) -> str:
    """``name`` as a SQL identifier: in backticks, a backtick in it doubled."""
    return "`" + name.replace("`", "``") + "`"


def _always_shuffle() -> bool:
    value = os.environ.get(SHUFFLE_ENV, "auto").strip().lower()
    if value not in ("auto", "always"):
        raise ConfigError(f"{SHUFFLE_ENV} must be 'auto' or 'always', got {value!r}")
    return value == "always"


def _write_where() -> str:
    value = os.environ.get(WRITE_ENV, "auto").strip().lower()
    if value not in ("auto", "tasks", "driver"):
        raise ConfigError(f"{WRITE_ENV} must be 'auto', 'tasks' or 'driver', got {value!r}")
    return value


def _assume_in_place(table: str, batch_id: int) -> bool:
    if os.environ.get(ASSUME_IN_PLACE_ENV) != f"{table}:{batch_id}":
        return False
    log.error("%s set: writing %s batch %d in place", ASSUME_IN_PLACE_ENV, table, batch_id)
    return True


def collect_arrow(df: Any) -> Any:
    """``df``'s rows as a ``pyarrow.Table``, in one Spark job and, under Spark Connect, one
    round trip.

    Connect's ``toArrow`` first asks the server for the DataFrame's schema (an AnalyzePlan
    call, about 20 ms a micro-batch on a busy machine: bench/notes/sink_connect.md) only to
    cast the result to the types it would name; the segment writer reads columns by name
    and converts each type itself (as it does for the Arrow batches write tasks receive), so
    the server's table is taken as sent. The private method that returns it is looked up,
    and ``toArrow`` used where a PySpark has no such method, or with a classic session
    (whose schema is known to the driver without a call)."""
    if type(df).__module__.startswith("pyspark.sql.connect"):
        to_table = getattr(df, "_to_table", None)
        if callable(to_table):
            result = to_table()
            return result[0] if isinstance(result, tuple) else result  # PySpark 4: (table, schema)
    return df.toArrow()


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
