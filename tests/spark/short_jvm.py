"""JVM options for every Spark JVM the tests start: each test session's own driver, the
Spark Connect server, the drivers tests run as subprocesses (writers, consumers, the demo,
the docs' page runner), a standalone master, worker and its executors.

Such a JVM lives seconds to minutes and runs many small jobs. HotSpot's default tiered JIT
spends most of that CPU compiling code (C2) that pays off only in long runs, and its
parallel GC starts a thread per core; on a 2-core machine shared with the rest of the suite
both take the CPU from the work the test waits for. Stopping at C1 with the serial collector
halved a writer process's JVM CPU (26.8 s to 13.8 s for tests/spark/writer_process.py's four
batches); the CPU of whole tests, every process counted, fell from 80 s to 51 s
(test_exactly_once.py), 121 s to 64 s (the standalone driver-restart test), 117 s to 78 s
(tests/cli/test_demo.py's two demos) and, for the test session's own driver, 144 s to 107 s
over five files that use it (test_sql_ddl, test_tws, test_rocksdb, test_differential,
test_app). Nothing a test checks depends on the JIT or the collector.

Without tiered compilation HotSpot reserves a 48 MB code cache instead of 240 MB, and a test
session's driver compiles every class Spark generates for the session's queries: one worker
of a three-worker run filled it, the JIT stopped ("CodeCache is full") and the next generated
class killed the JVM (``VirtualMachineError: Out of space in CodeCache for adapters``, which
Spark's uncaught-exception handler turns into an exit), failing every later test of that
worker. The cache is reserved at the tiered size again: reserved address space, committed
only as code is compiled.

Every such JVM also maps the classes a Spark driver loads from a class-data-sharing archive
when ``make test`` has built one (:mod:`tests.spark.class_archive`: a third less CPU again
for a writer process).

Drivers get the options from ``SPARK_SUBMIT_OPTS``, which ``spark-submit`` (and so PySpark)
puts on the driver's java command line: tests/conftest.py sets it for the test process and
everything it starts. Executors and standalone daemons are separate JVMs that need their own
settings (:func:`executor_conf`, ``SPARK_DAEMON_JAVA_OPTS``).
"""

from __future__ import annotations

from tests.spark.class_archive import archive_options

#: How the JVM starts a process: ``vfork`` and ``exec`` of the command itself, not JDK 17's
#: default ``posix_spawn`` of its ``jspawnhelper``, which then starts the command (two programs
#: loaded per process). Without Hadoop's native library, which PySpark does not ship, Hadoop's
#: local file system sets the permissions of every file and directory it creates by running
#: ``chmod``: two per checkpoint or state file written (the file and its ``.crc``), some 8,500
#: in a run of the suite, and Spark deletes a RocksDB store's folder with ``rm -rf``. ``perf``
#: over a whole run put 2.7% of all CPU in ``jspawnhelper``, ``chmod`` and the JVMs' reapers.
LAUNCH_MECHANISM = "VFORK"
#: Spark settings such a JVM reads from its system properties (``spark.*``): queries run
#: interpreted, not compiled to Java classes first. Spark's code generation pays off over
#: many rows; the tests' queries see a few hundred, and compiling each new plan with Janino
#: was an eighth of a test session driver's Java samples (Java Flight Recorder over seven
#: files on the session). Those files: 130 and 126 -> 121 and 118 CPU-seconds, every process
#: counted. Spark's own test suites run both ways; no sparkiq test depends on which.
INTERPRETED = "-Dspark.sql.codegen.wholeStage=false -Dspark.sql.codegen.factoryMode=NO_CODEGEN"
#: C1 only, one GC thread: cheaper for a JVM that runs small jobs for minutes; the code cache
#: at the size tiered compilation would reserve, so a long session's generated code fits.
BASE_OPTIONS = (
    "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m -XX:+UseSerialGC "
    f"-Djdk.lang.Process.launchMechanism={LAUNCH_MECHANISM}"
)
#: The JVM options and the class archive, when there is one: an executor's and a standalone
#: daemon's (Spark refuses ``spark.*`` settings in an executor's options).
JVM_OPTIONS = f"{BASE_OPTIONS} {archive_options()}".strip()
#: A driver's: the JVM options and the Spark settings.
SHORT_JVM_OPTIONS = f"{JVM_OPTIONS} {INTERPRETED}"


def executor_conf() -> dict[str, str]:
    """The Spark setting that starts each executor of a cluster with :data:`JVM_OPTIONS`
    (a local master's executor is its driver)."""
    return {"spark.executor.extraJavaOptions": JVM_OPTIONS}
