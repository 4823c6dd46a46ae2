"""JVM options for the short-lived Spark JVMs the tests start as subprocesses: a writer or
consumer driver, a standalone master, worker and its executors.

Such a JVM lives a minute or two and runs a few small jobs. HotSpot's default tiered JIT
spends most of that CPU compiling code (C2) that pays off only in long runs, and its
parallel GC starts a thread per core; on a 2-core machine shared with the rest of the suite
both take the CPU from the work the test waits for. Stopping at C1 with the serial collector
halved a writer process's JVM CPU (26.8 s to 13.8 s for tests/spark/writer_process.py's four
batches, 85 s to 52 s of wall time at load 19); the CPU of whole tests, every process
counted, fell from 80 s to 51 s (test_exactly_once.py) and from 121 s to 64 s (the standalone
driver-restart test). Nothing a test checks depends on the JIT or the collector; the test
session's own long-lived SparkSession keeps the defaults.
"""

from __future__ import annotations

from sparkiq.testing import LOCAL_SPARK_CONF

#: C1 only, one GC thread: cheaper for a JVM that exits within minutes.
SHORT_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def short_jvm_conf(*, executors: bool = False) -> dict[str, str]:
    """Spark settings that start the driver (and with ``executors``, each executor) with
    :data:`SHORT_JVM_OPTIONS`, keeping the driver options of
    :data:`sparkiq.testing.LOCAL_SPARK_CONF` (its larger thread stack)."""
    driver = LOCAL_SPARK_CONF.get("spark.driver.extraJavaOptions", "")
    conf = {"spark.driver.extraJavaOptions": f"{driver} {SHORT_JVM_OPTIONS}".strip()}
    if executors:
        conf["spark.executor.extraJavaOptions"] = SHORT_JVM_OPTIONS
    return conf
