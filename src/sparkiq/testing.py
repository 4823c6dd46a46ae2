"""Helpers to test a pipeline built with sparkiq, with real Spark and real stores.

- :func:`spark_session`: a small local SparkSession tuned for tests (two cores, few shuffle
  partitions, no UI, UTC), or a Spark Connect session when given ``remote=``.
- :func:`connect_server`: a local Spark Connect server in its own JVM, for
  ``spark_session(remote=...)``.
- :func:`temporary_state_dir`: a state directory removed afterwards.
- :func:`kafka_broker`: a real single-node Apache Kafka cluster (KRaft) on 127.0.0.1 for
  the block (:class:`KafkaBroker`: one a test can stop and restart), and
  :func:`spark_kafka_jars`: Spark's Kafka connector for ``spark.jars`` (both
  from the jars ``make jvm-jars`` copies into a checkout's ``.jvm/``).
- :class:`JsonSource`: a folder of JSON files as a streaming source, fed batch by batch;
  :meth:`JsonSource.feed` returns once the App has applied the batch, so the next query sees
  it.
- :func:`table_rows`, :func:`diff_table` and :func:`assert_table_matches`: a table's live
  state, compared with the answer Spark computes in batch mode over the same input (the
  ground truth).

Everything here works with classic PySpark and Spark Connect sessions (no ``sparkContext``,
RDDs or py4j), and importing this module starts no JVM: Spark starts when
:func:`spark_session` is called.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from sparkiq._testing_kafka import (
    KAFKA_JVM_OPTIONS,
    KafkaBroker,
    kafka_broker,
    kafka_jars_dir,
    spark_kafka_jars,
    stop_process_group,
)
from sparkiq.query.queries import RangeQuery
from sparkiq.query.request import StateQueryRequest
from sparkiq.spark import worker_python

__all__ = [
    "KAFKA_JVM_OPTIONS",
    "LOCAL_SPARK_CONF",
    "JsonSource",
    "KafkaBroker",
    "TableDiff",
    "assert_table_matches",
    "connect_server",
    "diff_table",
    "kafka_broker",
    "kafka_jars_dir",
    "spark_kafka_jars",
    "spark_session",
    "table_rows",
    "temporary_state_dir",
]

#: What :func:`spark_session` configures for a local master, before ``config=`` overrides.
LOCAL_SPARK_CONF: Mapping[str, str] = {
    "spark.sql.shuffle.partitions": "4",  # the default 200 makes every small batch slow
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    # Spark matches a regex over Py4J error text when a query stops mid-foreachBatch; the
    # default thread stack overflows on long texts (see docs/guide.md#stopping).
    "spark.driver.extraJavaOptions": "-Xss32m",
    "spark.sql.session.timeZone": "UTC",  # naive timestamps mean the same on every machine
    "spark.driver.memory": "2g",
    # a test's temporary checkpoints go away with the query
    "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
    # An idle streaming query (the default trigger, no new input) looks for input again after
    # this delay; Spark's 10 ms lists the source every 10 ms, about a quarter of a core for
    # three idle file-source queries, taken from the work a test waits for. 100 ms adds at
    # most 0.1 s before a new file's batch starts.
    "spark.sql.streaming.pollingDelay": "100ms",
    "spark.log.level": "ERROR",
}

# Session settings a Spark Connect server accepts from a client.
_REMOTE_CONF = ("spark.sql.shuffle.partitions", "spark.sql.session.timeZone")


def spark_session(
    app_name: str = "sparkiq-test",
    *,
    master: str = "local[2]",
    remote: str | None = None,
    shuffle_partitions: int | None = None,
    time_zone: str | None = None,
    driver_memory: str | None = None,
    log_level: str | None = None,
    config: Mapping[str, str] | None = None,
) -> Any:
    """A SparkSession for tests: ``master`` (default ``local[2]``) with
    :data:`LOCAL_SPARK_CONF`, or the Spark Connect server at ``remote`` (``sc://host:port``;
    the ``SPARK_REMOTE`` environment variable works too) with the session settings only.

    The keyword arguments override single settings and ``config`` any Spark setting. As with
    ``getOrCreate``, an existing session of this process is returned with only its runtime
    settings changed. With a local master, Spark's Python workers run this interpreter unless
    ``PYSPARK_PYTHON`` says otherwise (it sets ``PYSPARK_PYTHON`` when unset).
    """
    from pyspark.sql import SparkSession

    settings = dict(LOCAL_SPARK_CONF)
    named = {
        "spark.sql.shuffle.partitions": shuffle_partitions,
        "spark.sql.session.timeZone": time_zone,
        "spark.driver.memory": driver_memory,
        "spark.log.level": log_level,
    }
    settings.update({k: str(v) for k, v in named.items() if v is not None})
    settings.update({k: str(v) for k, v in (config or {}).items()})
    remote = remote or os.environ.get("SPARK_REMOTE")
    builder: Any = SparkSession.builder.appName(app_name)
    if remote:
        # Connect's own builder: PySpark's generic one refuses a Connect session in a
        # process that already runs a classic one (SESSION_ALREADY_EXIST), as tests do.
        from pyspark.sql.connect.session import SparkSession as ConnectSession

        os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"  # what the generic builder marks
        builder = ConnectSession.builder.appName(app_name).remote(remote)
        overridden = set(config or {})
        settings = {k: v for k, v in settings.items() if k in _REMOTE_CONF or k in overridden}
    else:
        os.environ.setdefault("PYSPARK_PYTHON", worker_python.command())
        builder = builder.master(master)
    for key, value in settings.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


@contextlib.contextmanager
def connect_server(
    master: str = "local[2]",
    *,
    config: Mapping[str, str] | None = None,
    timeout: float = 180.0,
    python: str | None = None,
) -> Iterator[str]:
    """Run a Spark Connect server (PySpark's own, ``pyspark[connect]``) for the block; yields
    its address, ``sc://127.0.0.1:<port>``.

    The server is a separate JVM started with ``spark-submit`` from the installed PySpark,
    so a process can hold a classic session and a Connect session at once (PySpark's
    ``remote("local")`` refuses to start a server next to an existing SparkContext). It
    listens on 127.0.0.1 on a free port, runs ``master`` with :data:`LOCAL_SPARK_CONF` and
    ``config``, starts its Python workers with ``python`` (default: this interpreter, through
    ``sparkiq-worker-python``), and is stopped (with its process group) when the block ends.
    When it does not start within ``timeout``, the error quotes the end of its log.
    """
    import socket
    import subprocess
    import time

    from pyspark.find_spark_home import _find_spark_home

    home = _find_spark_home()
    settings = {**LOCAL_SPARK_CONF, **(config or {})}
    with socket.socket() as probe:  # a port free now (the server takes it moments later)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings.update(
        {
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(port),
        }
    )
    command = [os.path.join(home, "bin", "spark-submit"), "--master", master]
    for key, value in settings.items():
        command += ["--conf", f"{key}={value}"]
    command += ["--class", "org.apache.spark.sql.connect.service.SparkConnectServer"]
    workdir = tempfile.mkdtemp(prefix="sparkiq-connect-")
    log_path = os.path.join(workdir, "spark-connect.log")
    env = {**os.environ, "SPARK_HOME": home, "PYSPARK_PYTHON": python or worker_python.command()}
    env.pop("SPARK_REMOTE", None)
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(
            command,
            cwd=workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stopped with everything it ran
        )
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    with open(log_path, encoding="utf-8", errors="replace") as log_file:
                        tail = log_file.read()[-3000:]
                    raise RuntimeError(
                        f"the Spark Connect server did not start on port {port} (exit code "
                        f"{process.poll()}); the end of its log:\n{tail}"
                    ) from None
                time.sleep(0.2)
        yield f"sc://127.0.0.1:{port}"
    finally:
        stop_process_group(process)
        shutil.rmtree(workdir, ignore_errors=True)


@contextlib.contextmanager
def temporary_state_dir(prefix: str = "sparkiq-test-") -> Iterator[str]:
    """A new empty directory for an App's ``state_dir``, removed with everything in it
    when the block ends (stop the App inside the block)."""
    path = tempfile.mkdtemp(prefix=prefix)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


class JsonSource:
    """A folder of JSON-lines files: a streaming source a test feeds one batch at a time.

    ``schema`` is a DDL string (``"k string, n long"``). Each :meth:`write` adds one file,
    written under a hidden name and renamed, so Spark never reads half a file; with
    :meth:`stream`'s default of one file per trigger, each write is one micro-batch.
    """

    def __init__(self, path: str | os.PathLike[str], schema: str) -> None:
        self.path = Path(path)
        self.schema = schema
        self.path.mkdir(parents=True, exist_ok=True)
        self._files = len(list(self.path.glob("*.json")))

    def stream(self, spark: Any, *, files_per_trigger: int = 1) -> Any:
        """The folder as a streaming DataFrame."""
        return (
            spark.readStream.schema(self.schema)
            .option("maxFilesPerTrigger", files_per_trigger)
            .json(str(self.path))
        )

    def batch(self, spark: Any) -> Any:
        """Every row written so far as a batch DataFrame: the input of a ground truth."""
        return spark.read.schema(self.schema).json(str(self.path))

    def write(self, rows: Iterable[Mapping[str, Any]]) -> Path:
        """Add ``rows`` (dicts of column values) as one new file and return its path.

        Dates and datetimes are written in ISO 8601 (naive datetimes are read in the
        session time zone), decimals as exact text and binary as base64.
        """
        lines = [json.dumps(dict(row), default=_json_value) for row in rows]
        name = f"{self._files:06d}.json"
        hidden = self.path / f".{name}.tmp"
        hidden.write_text("".join(line + "\n" for line in lines))
        final = self.path / name
        hidden.rename(final)
        self._files += 1
        return final

    def feed(self, app: Any, rows: Iterable[Mapping[str, Any]], timeout: float = 120.0) -> Path:
        """:meth:`write` the rows, then wait until ``app`` has processed them and its local
        replicas have applied every committed batch, so queries see them."""
        path = self.write(rows)
        app.process_all_available(timeout=timeout)
        return path


def _json_value(value: Any) -> Any:
    if isinstance(value, dt.date | dt.datetime):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(bytes(value)).decode()
    raise TypeError(f"JsonSource cannot write a {type(value).__qualname__}")


def table_rows(source: Any, table: str) -> dict[Any, dict[str, Any]]:
    """Every row of ``table`` now, by key, from an App, a Node or a Client.

    A key is a scalar for one key column, a tuple for several; a windowed table's key is
    ``(key, window start)``. Raises AssertionError if a partition cannot answer.
    """
    result = source.query(StateQueryRequest.in_store(table).with_query(RangeQuery.with_no_bounds()))
    rows: dict[Any, dict[str, Any]] = {}
    for partition, answer in sorted(result.partition_results.items()):
        if answer.is_failure:
            raise AssertionError(
                f"partition {partition} of {table!r} did not answer: "
                f"{answer.failure_reason.name}: {answer.failure_message}"
            )
        with answer.result as items:
            for key, row in items:
                rows[_hashable(key)] = row
    return rows


@dataclass(frozen=True)
class TableDiff:
    """How a table's live rows differ from the expected rows, by key."""

    table: str
    missing: dict[Any, dict[str, Any]] = field(default_factory=dict)  # expected, not live
    unexpected: dict[Any, dict[str, Any]] = field(default_factory=dict)  # live, not expected
    different: dict[Any, tuple[dict[str, Any], dict[str, Any]]] = field(default_factory=dict)

    @property
    def is_empty(self) -> bool:
        return not (self.missing or self.unexpected or self.different)

    def __str__(self) -> str:
        if self.is_empty:
            return f"table {self.table!r} matches"
        lines = [
            f"table {self.table!r} differs: {len(self.missing)} missing, "
            f"{len(self.unexpected)} unexpected, {len(self.different)} different keys"
        ]
        for key, row in list(self.missing.items())[:5]:
            lines.append(f"  missing    {key!r}: expected {row!r}")
        for key, row in list(self.unexpected.items())[:5]:
            lines.append(f"  unexpected {key!r}: live {row!r}")
        for key, (live, expected) in list(self.different.items())[:5]:
            lines.append(f"  different  {key!r}: live {live!r}, expected {expected!r}")
        return "\n".join(lines)


def diff_table(
    source: Any,
    table: str,
    expected: Any,
    *,
    key: str | Sequence[str] | None = None,
    window: str | None = None,
    normalize: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> TableDiff:
    """Compare ``table``'s live rows (from an App, a Node or a Client) with ``expected``: a
    batch DataFrame (typically the pipeline's computation run by ``spark.read`` over the same
    input) or row dicts.

    The key columns and window column are the table's own when ``source`` knows them (an
    App or a Node); pass ``key=`` (and ``window=``) for a Client. ``normalize`` is applied
    to both sides' rows before comparing, e.g. to sort a ``collect_set`` or round a float
    sum whose last bits depend on the order Spark added in.
    """
    columns, window_column = _layout(source, table, key, window)
    if hasattr(expected, "collect") and hasattr(expected, "schema"):
        expected_rows = [row.asDict(recursive=True) for row in expected.collect()]
    else:
        expected_rows = [dict(row) for row in expected]
    same = normalize or (lambda row: row)
    truth: dict[Any, dict[str, Any]] = {}
    for row in expected_rows:
        row_key: Any = row[columns[0]] if len(columns) == 1 else tuple(row[c] for c in columns)
        if window_column is not None:
            row_key = (row_key, (row[window_column] or {}).get("start"))
        truth[_hashable(row_key)] = same(row)
    live = {k: same(v) for k, v in table_rows(source, table).items()}
    return TableDiff(
        table,
        missing={k: v for k, v in truth.items() if k not in live},
        unexpected={k: v for k, v in live.items() if k not in truth},
        different={k: (v, truth[k]) for k, v in live.items() if k in truth and truth[k] != v},
    )


def assert_table_matches(
    source: Any,
    table: str,
    expected: Any,
    *,
    key: str | Sequence[str] | None = None,
    window: str | None = None,
    normalize: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> None:
    """Raise AssertionError, listing the differing keys, unless :func:`diff_table` finds
    none."""
    diff = diff_table(source, table, expected, key=key, window=window, normalize=normalize)
    if not diff.is_empty:
        raise AssertionError(str(diff))


def _layout(
    source: Any, table: str, key: str | Sequence[str] | None, window: str | None
) -> tuple[tuple[str, ...], str | None]:
    if key is not None:
        return ((key,) if isinstance(key, str) else tuple(key)), window
    tables = getattr(source, "tables", None)
    if isinstance(tables, Mapping) and table in tables:  # an App
        schema = tables[table].manifest.schema
    elif callable(getattr(source, "schema", None)):  # a Node
        schema = source.schema(table)
    else:
        raise TypeError(f"cannot tell the key columns of {table!r}: pass key= (and window=)")
    return tuple(schema.key_columns), schema.window_column


def _hashable(value: Any) -> Any:
    """Keys as PySpark gives them, made usable as dict keys (lists from the wire become
    tuples)."""
    if isinstance(value, list | tuple):
        return tuple(_hashable(v) for v in value)
    return value
