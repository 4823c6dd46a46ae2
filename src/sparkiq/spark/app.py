"""The embedded application: materialize streaming DataFrames and query them in-process.

::

    app = App(spark, state_dir="/data/sparkiq", name="shop")
    app.materialize("revenue_by_product", revenue_df, key="product", partitions=8)
    app.start()
    app.process_all_available()
    app.get("revenue_by_product", "p-17")

:meth:`App.materialize` only validates and records what to run; :meth:`App.start` writes the
table manifests, starts one Spark streaming query per table (its checkpoint lives under
``state_dir``) and, unless ``local_node=False``, a :class:`~sparkiq.Node`
hosting every partition. Starting an App on an existing ``state_dir`` resumes every table
where it stopped: Spark from its checkpoint, the replicas from their local files.

Tables can also be defined in SQL over streams registered by name: :meth:`App.sql` runs
``CREATE TABLE ... AS SELECT``, ``DROP TABLE``, ``SHOW TABLES`` and ``DESCRIBE`` on the writer
(parsed by :mod:`sparkiq.spark.ddl`, run by :mod:`sparkiq.spark.ddl_run`) and hands pull
queries to the local node.

The same code runs with a classic and a Spark Connect session. The ``foreachBatch`` sink
(:class:`~sparkiq.spark.sink.TableSink`) carries plain data only, because under Connect it
runs in the server's Python process; everything the driver does about a commit - waking the
local node, scheduling snapshots, :meth:`App.process_all_available` - starts from reading the
changelog on the driver (:class:`~sparkiq.spark.commits.CommitWatcher`), never from state
kept by the sink.

The parts that stand alone live beside it: the sink, DDL, maintenance, lookups, a table's
layout checks (:mod:`sparkiq.spark.table_layout`), starting and stopping one table's query
(:mod:`sparkiq.spark.table_query`), following commits (:mod:`sparkiq.spark.commits`),
reporting the writer's status (:mod:`sparkiq.spark.writer_report`). What remains here is
when the queries start and stop (start, wait, stop, drop) and the query methods, which share
the App's lock and tables.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import shutil
import threading
import time
from collections.abc import Sequence
from typing import Any

import sparkiq.spark.ddl as ddl
import sparkiq.spark.ddl_run as ddl_run
from sparkiq.changelog import (
    Changelog,
    check_table_name,
    open_storage,
)
from sparkiq.errors import ConfigError, SparkiqError, UnknownStoreError
from sparkiq.node import Node
from sparkiq.query.request import StateQueryRequest
from sparkiq.query.result import StateQueryResult
from sparkiq.spark.attach import checkpoint_of
from sparkiq.spark.commits import CommitWatcher, finished_batch, newest_commit
from sparkiq.spark.failures import query_failed
from sparkiq.spark.maintenance import compact_table
from sparkiq.spark.publishing import publish_spec
from sparkiq.spark.sink import (
    absolute_location,
    pyarrow_uri,
    spark_uri,
    use_this_python_for_local_workers,
)
from sparkiq.spark.table_layout import check_layout, table_manifest
from sparkiq.spark.table_query import Table, check_checkpoint, start_query, stop_query
from sparkiq.spark.writer_report import WriterReporter

__all__ = ["App", "Table"]

log = logging.getLogger("sparkiq.app")


class App:
    """Materializes streaming DataFrames as queryable tables in ``state_dir``.

    ``state_dir`` is a local path or a URI pyarrow can open (``s3://...``); the changelog
    lives there. A relative path is relative to this (the driver's) working directory: it
    is made absolute here, once, because executors run elsewhere (:attr:`state_dir` holds
    the absolute form). On a cluster it must be a location the driver, every executor and
    every reader share (docs/deploy.md). ``checkpoint_dir`` is where each table's Spark
    checkpoint goes (``<checkpoint_dir>/<table>``; a relative path is made absolute the same
    way); by default ``<state_dir>/checkpoints``, with ``s3://`` spelled ``s3a://`` for Spark.
    ``name`` names the application in logs and Spark query names. ``local_dir``, ``store`` and
    ``poll_interval`` configure the local node (see :class:`~sparkiq.Node`).
    Every ``snapshot_every`` batches (None: never) each table is snapshotted by a Spark job
    in the background, then files older than ``retention`` seconds that no snapshot needs
    are deleted (None: keep everything); see :mod:`sparkiq.spark.maintenance`.
    ``kafka_config`` is the Kafka client config of tables published to a topic
    (``kafka_topic=``), e.g. ``{"bootstrap.servers": "host:9092"}``.
    """

    def __init__(
        self,
        spark: Any,
        state_dir: str,
        name: str = "sparkiq",
        *,
        local_dir: str | None = None,
        store: str = "rocksdb",
        poll_interval: float = 0.02,
        checkpoint_dir: str | None = None,
        snapshot_every: int | None = 100,
        retention: float | None = 24 * 3600.0,
        kafka_config: dict[str, Any] | None = None,
    ) -> None:
        if not hasattr(spark, "readStream"):
            raise ConfigError(f"App() needs a SparkSession, got {type(spark).__name__}")
        if snapshot_every is not None and (
            isinstance(snapshot_every, bool)
            or not isinstance(snapshot_every, int)
            or snapshot_every < 1
        ):
            raise ConfigError(
                f"snapshot_every must be a positive int (batches) or None, got {snapshot_every!r}"
            )
        if retention is not None and (
            isinstance(retention, bool) or not isinstance(retention, int | float) or retention < 0
        ):
            raise ConfigError(f"retention must be seconds >= 0 or None, got {retention!r}")
        self.snapshot_every = snapshot_every
        self.retention = None if retention is None else float(retention)
        self.spark = spark
        use_this_python_for_local_workers(spark)
        self.storage = open_storage(state_dir)  # rejects an empty or unusable value first
        state_dir = absolute_location(state_dir)
        self.state_dir = state_dir
        if checkpoint_dir is None:
            if "?" in state_dir:
                raise ConfigError(
                    f"state_dir {state_dir!r} has URI options: pass checkpoint_dir= explicitly "
                    "(a location Spark's Hadoop filesystems can write)"
                )
            checkpoint_dir = (
                self.storage.path("checkpoints")
                if self.storage.is_local
                else spark_uri(state_dir.rstrip("/") + "/checkpoints")
            )
        self.checkpoint_dir = absolute_location(checkpoint_dir)
        self.name = name
        self.kafka_config = kafka_config
        self._local_dir, self._store_kind, self._poll_interval = local_dir, store, poll_interval
        self._tables: dict[str, Table] = {}
        self._streams: dict[str, Any] = {}
        self.node: Node | None = None
        self._started = False
        self._lock = threading.Lock()
        self._watcher: CommitWatcher | None = None
        self._reporter: WriterReporter | None = None
        self._attached: list[tuple[str, str, Any]] = []  # App.attach: (checkpoint, name, ops)

    # -- defining tables ---------------------------------------------------------------------

    def materialize(
        self,
        name: str,
        df: Any,
        key: str | Sequence[str],
        partitions: int = 8,
        *,
        window: str | None = None,
        tombstone: str | None = None,
        output_mode: str = "update",
        trigger: dict[str, Any] | None = None,
        history: dt.timedelta | int | None = None,
        kafka_topic: str | None = None,
        kafka_config: dict[str, Any] | None = None,
        kafka_key_format: str = "json",
    ) -> Table:
        """Declare that streaming DataFrame ``df`` is materialized as table ``name``.

        ``key`` is a column name or a list of names; every row of ``df`` is the current row of
        its key (a later row for the same key replaces the earlier one). ``partitions`` is
        fixed for the table's lifetime. ``window`` names the ``window()`` struct column of a
        windowed aggregation: the table then keeps one row per key and window. ``tombstone``
        names a boolean column: a row with ``True`` there deletes its key. ``output_mode`` is
        Spark's (``update`` suits aggregations and plain keyed streams; ``complete`` replaces
        the whole table every batch). ``trigger`` is passed to ``DataStreamWriter.trigger``
        (e.g. ``{"processingTime": "1 second"}``). ``history`` is how long past batches stay
        readable (``AS OF``, versioned key queries, and reads pinned to one batch while newer
        ones land): a ``timedelta``, or an int number of batches; default five minutes.
        ``kafka_topic`` publishes the table to that compacted Kafka topic, each committed
        batch in one transaction (docs/kafka.md), from a thread of this process;
        ``kafka_config`` (over the App's) is the Kafka client config, ``kafka_key_format``
        ``"json"`` or ``"kafka"``. ``table.publisher.status()`` shows its lag.

        Raises :class:`ConfigError` / :class:`SchemaError` / :class:`LayoutMismatchError`
        naming the problem; nothing is written until :meth:`start`. Once the App is started,
        the table is started at once: its manifest is written, the local node hosts it and
        its Spark query runs.
        """
        manifest = table_manifest(
            name, df, key, partitions, window, tombstone, output_mode, history
        )
        if name in self._tables:
            raise ConfigError(f"table {name!r} is already materialized in this App", store=name)
        check_layout(Changelog(self.state_dir, name), manifest)  # before anything runs
        spec = publish_spec(
            manifest, kafka_topic, kafka_config, self.kafka_config, kafka_key_format
        )
        table = Table(name, manifest, df, trigger, publish=spec)
        with self._lock:
            if name in self._tables:
                raise ConfigError(f"table {name!r} is already materialized in this App", store=name)
            if self._started:
                self._start_table(table)
            self._tables[name] = table
        return table

    @property
    def tables(self) -> dict[str, Table]:
        return dict(self._tables)

    def register_stream(self, name: str, df: Any) -> None:
        """Make streaming DataFrame ``df`` readable as ``name`` in the SELECT of
        ``CREATE TABLE ... AS`` (see :meth:`sql`).

        When a statement reads it, ``name`` becomes a temporary view of the SparkSession.
        Registering a name again replaces its stream for later statements; tables already
        created keep the stream they were created from.
        """
        try:
            check_table_name(name)
        except ValueError:
            raise ConfigError(
                f"invalid stream name {name!r}: use letters, digits and underscores, starting "
                "with a letter or underscore"
            ) from None
        if not hasattr(df, "isStreaming") or not hasattr(df, "createOrReplaceTempView"):
            raise ConfigError(f"register_stream() needs a DataFrame, got {type(df).__name__}")
        if not df.isStreaming:
            raise ConfigError(
                f"DataFrame for stream {name!r} is not streaming: build it from spark.readStream"
            )
        self._streams[name] = df

    @property
    def registered_streams(self) -> dict[str, Any]:
        return dict(self._streams)

    # -- running -----------------------------------------------------------------------------

    def start(self, local_node: bool = True) -> App:
        """Start every table's Spark query and, by default, a local node serving them.

        An App may start with no table: tables materialized (or created in SQL) later start
        at once. It also registers the ``sparkiq`` data source in the session, so the App's
        own Spark jobs can ``spark.read.format("sparkiq")`` its tables."""
        from sparkiq.spark.datasource import register_data_source

        with self._lock:
            if self._started:
                return self
            register_data_source(self.spark)
            for table in self._tables.values():
                changelog = Changelog(self.state_dir, table.name)
                table.manifest = table.manifest.ensure_written(
                    changelog.storage, changelog.manifest_path
                )
                check_checkpoint(changelog, self._checkpoint_location(changelog.table))
            if local_node:
                self.node = self._new_node().start()
            for table in self._tables.values():
                self._start_query(table)
            self._watcher = CommitWatcher(
                self.name, self.state_dir, self._watched, self._on_commit, self._poll_interval
            )
            self._watcher.start()
            self._reporter = WriterReporter(
                self.name, self.state_dir, self._reported, publishing=self._publishing
            )
            self._reporter.start()
            self._started = True
        return self

    def _new_node(self) -> Node:
        # The embedded node is standalone whatever SPARKIQ_LISTEN/PEERS/TOKEN say, and asks
        # no Kafka broker whatever SPARKIQ_KAFKA_BOOTSTRAP says: those configure `sparkiq
        # serve` processes, which serve this state_dir over HTTP.
        node = Node(
            self.state_dir,
            node_id="local",
            listen=None,
            peers=None,
            token=None,
            kafka_bootstrap=None,
            local_dir=self._local_dir,
            store=self._store_kind,
            poll_interval=self._poll_interval,
        )
        for location, name, operators in self._attached:
            node.attach(location, name, operators)
        return node

    def _start_table(self, table: Table) -> None:
        """Start a table added after :meth:`start`: manifest, local replicas, then query."""
        changelog = Changelog(self.state_dir, table.name)
        check_checkpoint(changelog, self._checkpoint_location(changelog.table))
        table.manifest = table.manifest.ensure_written(changelog.storage, changelog.manifest_path)
        # Hosted now rather than at the node's next refresh: process_all_available() and
        # get() know the table as soon as its query runs.
        if not self._refresh_node(table.name, hosted=True):
            raise SparkiqError(f"the local node cannot host table {table.name!r}", store=table.name)
        self._start_query(table)

    def _refresh_node(self, name: str, *, hosted: bool) -> bool:
        """Refresh the local node until it hosts table ``name`` (or no longer does); False
        when it still does not after about a second."""
        for _ in range(50):
            node = self.node
            if node is None or (name in node.tables) == hosted:
                return True
            try:
                node.refresh_tables()
            except Exception:  # raced the node's own periodic refresh: look again
                log.debug("refreshing the local node for %s", name, exc_info=True)
            if (name in node.tables) != hosted:
                time.sleep(0.02)
        return False

    def _checkpoint_location(self, table: str) -> str:
        return self.checkpoint_dir.rstrip("/") + "/" + table

    def _start_query(self, table: Table) -> None:
        start_query(
            self.spark,
            table,
            state_dir=self.state_dir,
            checkpoint=self._checkpoint_location(table.name),
            query_name=f"sparkiq.{self.name}.{table.name}",
            snapshot_every=self.snapshot_every,
            retention=self.retention,
        )

    def compact(self, table: str | None = None) -> None:
        """Snapshot ``table`` (or every table) at its newest batch now, with a Spark job, and
        apply retention; blocks until done. Raises UnknownStoreError for an unknown table."""
        names = [table] if table is not None else list(self._tables)
        for name in names:
            if name not in self._tables:
                raise UnknownStoreError(
                    f"unknown table {name!r}; materialized tables: {sorted(self._tables)}",
                    store=name,
                )
        for name in names:
            existing = self._tables[name].maintenance
            if existing is not None:
                existing.wait()
            compact_table(self.state_dir, name, retention_seconds=self.retention, spark=self.spark)

    def process_all_available(self, timeout: float | None = None) -> None:
        """Wait until every query processed all available input and the local node applied
        every batch committed so far.

        Raises :class:`SparkiqError` when a table's query failed (Spark stopped it): its
        message says why in a few lines (:func:`~sparkiq.spark.failures.failure_reason`,
        e.g. Kafka records aged out before Spark read them) and which batch the table stays
        at; Spark's exception, with every trace, is its ``__cause__``.

        What "committed so far" means is read from the changelog on the driver, after Spark
        reports the input processed: the newest commit record of each table (a batch's
        commit record is written before its ``foreachBatch`` call returns). It never relies
        on the sink object, which under Spark Connect is a copy in another process."""
        from pyspark.errors import StreamingQueryException

        self._require_started()
        for table in self._tables.values():
            query = table.query
            try:
                query.processAllAvailable()
                error = query.exception()
            except StreamingQueryException as failed:  # how Spark reports a failed query
                error = failed
            if error is not None:
                changelog = Changelog(self.state_dir, table.name)
                committed = newest_commit(changelog, table.committed_batch_id)
                raise query_failed(table.name, error, committed) from error
            self._read_commits(table, query)
        if self.node is None:
            return
        for table in self._tables.values():
            batch_id = table.committed_batch_id
            if batch_id >= 0 and not self.node.wait_for(table.name, batch_id, timeout):
                failing = [s for s in self.node.status() if s.table == table.name and s.error]
                raise SparkiqError(
                    f"local replicas of {table.name!r} did not reach batch {batch_id}"
                    + (f": {failing[0].error}" if failing else f" within {timeout} s"),
                    store=table.name,
                )

    def _read_commits(self, table: Table, query: Any) -> None:
        """Bring ``table.committed_batch_id`` up to the newest commit record of its changelog
        (checked against the query's last progress)."""
        changelog = Changelog(self.state_dir, table.name)
        table.committed_batch_id = newest_commit(changelog, table.committed_batch_id, query)

    def _watched(self) -> list[tuple[str, int, Any]]:
        """``(table, newest commit seen, table)`` of every started table (the watcher's view)."""
        return [(t.name, t.committed_batch_id, t) for t in self._tables.values() if t.query]

    def _reported(self) -> list[tuple[str, Any, int]]:
        """``(table, its query, newest commit seen)`` of every started table (what the
        writer status reporter writes about)."""
        return [(t.name, t.query, t.committed_batch_id) for t in self._tables.values() if t.query]

    def _publishing(self, name: str) -> tuple[dict[str, Any], ...]:
        """Table ``name``'s publisher to Kafka as its writer status record shows it."""
        table = self._tables.get(name)
        publisher = None if table is None else table.publisher
        return () if publisher is None else (publisher.status().to_record(),)

    def _on_commit(self, table: Table, batch_id: int) -> None:
        """The commit watcher saw ``batch_id`` of ``table`` committed."""
        table.committed_batch_id = max(table.committed_batch_id, batch_id)
        node = self.node  # looked up per commit: DROP TABLE may restart the node
        if node is not None:
            node.notify(table.name)
        if table.maintenance is not None:
            table.maintenance.on_commit(batch_id)

    def stop(self, timeout: float = 2.0) -> None:
        """Stop the Spark queries, then the local node. Idempotent.

        Each query is stopped between micro-batches, or once the batch running at the call
        has ended, when that happens within ``timeout`` seconds: interrupting a batch is safe
        (the changelog stays consistent and the batch re-runs on restart) but wastes its
        work and makes Spark log the interruption. The queries are stopped side by side, so
        ``timeout`` bounds the whole wait: one after another, the queries still running
        start new batches while an earlier one is waited for (three queries, three timeouts).
        """
        with self._lock:
            # the batch each query runs now, read before the watcher and reporter stop
            # (which can take a while): the stop waits for that one (sparkiq.spark.table_query)
            finished = {
                name: finished_batch(table.query)
                for name, table in self._tables.items()
                if table.query is not None
            }
            watcher, self._watcher = self._watcher, None
            if watcher is not None:
                watcher.stop()
            reporter, self._reporter = self._reporter, None
            if reporter is not None:  # before the queries stop: stop_query writes the last word
                reporter.stop()
            stopping = [
                threading.Thread(
                    target=stop_query,
                    args=(table, timeout),
                    kwargs={
                        "finished": finished.get(name),
                        "state_dir": self.state_dir,
                        "reporter": None,
                    },
                    name=f"sparkiq-stop-{name}",
                )
                for name, table in self._tables.items()
                if table.query is not None
            ]
            for thread in stopping:
                thread.start()
            for thread in stopping:
                thread.join()  # stop_query catches what a stop raises: each thread ends
            if self.node is not None:
                self.node.stop()
                self.node = None
            self._started = False

    def _drop_table(self, name: str, *, delete_changelog: bool) -> None:
        """Stop table ``name``'s Spark query and forget the table (``DROP TABLE``). The
        changelog stays, and nodes keep serving its last batch, unless ``delete_changelog``:
        then the changelog, the Spark checkpoint and the local node's replica go too."""
        with self._lock:
            table = self._tables.pop(name)
            finished = None if table.query is None else finished_batch(table.query)
            stop_query(
                table, 2.0, finished=finished, state_dir=self.state_dir, reporter=self._reporter
            )
            if not delete_changelog:
                return
            if table.maintenance is not None:  # a snapshot must not land in a deleted dir
                table.maintenance.wait()
            changelog = Changelog(self.state_dir, name)
            reporter = self._reporter
            if reporter is not None:  # nor a writer status record (it was popped: no more)
                with reporter.lock:
                    changelog.storage.delete_dir(changelog.root)
            else:
                changelog.storage.delete_dir(changelog.root)
            checkpoint = open_storage(pyarrow_uri(self._checkpoint_location(name)))
            checkpoint.delete_dir(checkpoint.root)
            node = self.node
            local_dir = node.local_dir if node is not None else self._default_local_dir()
            restart = node is not None and not self._refresh_node(name, hosted=False)
            if restart and node is not None:  # it keeps serving what is gone: start anew
                node.stop()
            if local_dir is not None and self._store_kind == "rocksdb":
                shutil.rmtree(os.path.join(local_dir, name), ignore_errors=True)
            if restart:
                self.node = self._new_node().start()

    def _default_local_dir(self) -> str | None:
        if self._local_dir is not None or not self.storage.is_local:
            return self._local_dir
        return os.path.join(self.storage.root, "replicas", "local")

    def __enter__(self) -> App:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- queries -----------------------------------------------------------------------------

    def _require_node(self) -> Node:
        if self.node is None:
            raise ConfigError(
                "this App has no local node: call start() (with local_node=True) first"
            )
        return self.node

    def _require_started(self) -> None:
        if not self._started:
            raise ConfigError("the App is not started: call start() first")

    def sql(self, text: str, **options: Any) -> Any:
        """Run one SQL statement.

        ``CREATE TABLE name WITH (KEY = ..., PARTITIONS = n) AS SELECT ...`` (Spark SQL over
        the streams given to :meth:`register_stream`), ``DROP TABLE``, ``SHOW TABLES`` and
        ``DESCRIBE`` run here, on the writer; see :mod:`sparkiq.spark.ddl` for the grammar.
        They are never reachable from a node or the REST API. Every other statement (SELECT,
        EXPLAIN) is a pull query run by the local node with ``options``. Results have
        ``columns``, ``rows`` and ``position``.
        """
        statement = ddl.parse(text)
        if statement is not None:
            if options:
                raise ConfigError(
                    f"options {sorted(options)} apply to pull queries (SELECT, EXPLAIN), "
                    "not to DDL statements"
                )
            return ddl_run.execute(self._ddl_writer(), statement)
        if self.node is None:
            raise ConfigError(
                "App.sql() runs pull queries (SELECT, EXPLAIN) on the App's local node and "
                "this App has none: start() it with local_node=True, or query a Node or a "
                "Client serving its state_dir"
            )
        return self.node.sql(text, **options)

    def _ddl_writer(self) -> ddl_run.Writer:
        """What a DDL statement may read of and do to this App."""
        return ddl_run.Writer(
            spark=self.spark,
            tables=self.tables,
            streams=self.registered_streams,
            materialize=self.materialize,
            drop=lambda name, delete: self._drop_table(name, delete_changelog=delete),
        )

    def stream(self, text: str, **options: Any) -> Any:
        """Run a push query (``SELECT ... FROM t [WHERE ...] EMIT CHANGES``) on the local
        node: a closeable iterator (and context manager) of changes with ``.key``, ``.row``
        (None for a deletion) and ``.position``; ``from_position=`` resumes after a change,
        ``snapshot=True`` starts with the table's current rows. See docs/sql.md."""
        return self._require_node().stream(text, **options)

    def attach(
        self, query: Any, name: str, *, checkpoint: str | None = None, operators: Any = None
    ) -> list[str]:
        """Serve the state of a streaming query this App did not start (the user's own,
        unchanged) from its checkpoint, as tables ``<name>_<operator>...`` on the local node
        (docs/attach.md); return the tables served now. ``checkpoint``: the query's
        checkpoint location when it is not Spark's default for the query."""
        location = checkpoint_of(self.spark, query, checkpoint)
        self._attached.append((location, name, operators))
        return self._require_node().attach(location, name, operators)

    def query(self, request: StateQueryRequest) -> StateQueryResult[Any]:
        """Answer an IQv2-style request from the local node."""
        return self._require_node().query(request)

    def get(self, store: str, key: Any) -> dict[str, Any] | None:
        """The current row of ``key`` in table ``store`` as a dict, or None."""
        node = self._require_node()
        if store not in self._tables and store not in node.tables:
            raise UnknownStoreError(
                f"unknown store {store!r}; materialized tables: {sorted(self._tables)}",
                store=store,
            )
        return node.get(store, key)
