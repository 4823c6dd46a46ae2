"""A SparkSession for tests, and a Spark Connect server to give one.

- :func:`spark_session`: a small local SparkSession tuned for tests (two cores, few shuffle
  partitions, no UI, UTC), or a Spark Connect session when given ``remote=``.
- :func:`connect_server`: a local Spark Connect server in its own JVM, for
  ``spark_session(remote=...)``.

Both work with classic PySpark and Spark Connect (no ``sparkContext``, RDDs or py4j), and
importing this module starts no JVM and imports no pyspark: Spark starts when
:func:`spark_session` is called.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from typing import Any

from sparkiq.spark import worker_python
from sparkiq.testing.kafka import stop_process_group

__all__ = ["LOCAL_SPARK_CONF", "connect_server", "spark_session"]

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
    # Checkpoints (offsets, commits, state files) through Hadoop's FileSystem API, not its
    # FileContext: on a local disk, without Hadoop's native library (PySpark ships none),
    # FileContext runs a `readlink` process for each status it takes of a path, about 50 a
    # micro-batch of a small stateful query, one after another. Measured over 30 such
    # batches on a busy 2-core machine: a batch's median 1.0-1.2 s -> 0.45-0.58 s, its
    # offsets' commit 72-86 -> 23-25 ms. The local file system's rename, which commits a
    # checkpoint file, is atomic either way.
    "spark.sql.streaming.checkpointFileManagerClass": (
        "org.apache.spark.sql.execution.streaming.checkpointing."
        "FileSystemBasedCheckpointFileManager"
    ),
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
