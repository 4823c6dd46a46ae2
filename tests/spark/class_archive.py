"""A class-data-sharing archive of what a Spark driver loads, shared by the tests' JVMs.

A JVM starting Spark reads, parses and verifies some fifteen thousand classes out of three
hundred jars before it runs anything; the suite starts dozens of such JVMs (the session's
own driver, writer and consumer subprocesses, the demo, the docs' page runner, the Connect
server). HotSpot can instead map those classes, already parsed and verified, from an
archive written by an earlier run (JDK 13+ dynamic CDS: ``-XX:ArchiveClassesAtExit`` to
write it, ``-XX:SharedArchiveFile`` to use it). Measured on this project's 2-core machine,
tests/spark/writer_process.py's four batches took 21.7 and 20.5 CPU-s without it and 13.6
and 14.8 with it.

``make test`` builds the archive once into ``.jvm/spark-classes.jsa`` (``python -m
tests.spark.class_archive``, about 20 CPU-s): a writer process runs its pipeline with
``ArchiveClassesAtExit`` pointing at a temporary file, which is renamed into place once
that JVM has exited (it writes the archive after its Python process is gone), so no JVM
ever maps half an archive. :mod:`tests.spark.short_jvm` adds the archive to the options of
every Spark JVM the tests start, when it exists.

HotSpot checks an archive against the JVM build and the jars on the class path before using
it and runs without it when they differ (a new JDK, a reinstalled PySpark, an executor's
class path that lacks a jar of the driver's): a stale archive costs speed, never a failure.
The checks' warnings are switched off (``-Xlog:cds=off``), as they would otherwise land in
the output tests read.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sparkiq.spark import worker_python

ROOT = Path(__file__).resolve().parents[2]
ARCHIVE = ROOT / ".jvm" / "spark-classes.jsa"
#: How long the writer and then its JVM's archive dump may take on a loaded machine.
BUILD_TIMEOUT = 900.0


def archive_options(archive: Path = ARCHIVE) -> str:
    """The JVM options that map ``archive`` when it exists (silently, see the module
    docstring), else nothing: a missing archive named on the command line would also turn
    off the JDK's own base archive."""
    if not archive.is_file():
        return ""
    return f"-XX:SharedArchiveFile={archive} -Xlog:cds=off -Xlog:cds+dynamic=off"


def build(base_options: str, archive: Path = ARCHIVE) -> None:
    """Run tests/spark/writer_process.py once, its JVM started with ``base_options``, with
    its classes archived at exit into ``archive`` (replaced whole once complete)."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_name(f".{archive.name}.{os.getpid()}")
    env = dict(os.environ)
    env["SPARK_SUBMIT_OPTS"] = f"{base_options} -XX:ArchiveClassesAtExit={partial}"
    env.setdefault("PYSPARK_PYTHON", worker_python.command())
    env.pop("SPARK_REMOTE", None)
    with tempfile.TemporaryDirectory(prefix="sparkiq-classes-") as work:
        source = Path(work) / "in"
        source.mkdir()
        rng = random.Random(7)
        for index in range(3):
            rows = [{"k": f"k{rng.randrange(20)}", "v": rng.randrange(10)} for _ in range(50)]
            (source / f"{index}.json").write_text("\n".join(map(json.dumps, rows)) + "\n")
        command = [sys.executable, "-m", "tests.spark.writer_process", str(source)]
        writer = subprocess.Popen(
            [*command, str(Path(work) / "state")],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its JVM stays in this group: waited for below
        )
        _, stderr = writer.communicate(timeout=BUILD_TIMEOUT)
        if writer.returncode != 0:
            partial.unlink(missing_ok=True)
            raise RuntimeError(f"the archive's writer failed: {stderr.decode()[-3000:]}")
        _wait_for_group(writer.pid, time.monotonic() + BUILD_TIMEOUT)
    if not partial.is_file():
        raise RuntimeError(f"the JVM wrote no archive at {partial}")
    partial.replace(archive)


def _wait_for_group(group: int, deadline: float) -> None:
    """Wait until no process of process group ``group`` is left (the JVM writes the
    archive after the Python process that started it has exited)."""
    while True:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"process group {group} still runs: the archive is unfinished")
        time.sleep(0.2)


if __name__ == "__main__":
    from tests.spark.short_jvm import BASE_OPTIONS, INTERPRETED

    started = time.monotonic()
    build(f"{BASE_OPTIONS} {INTERPRETED}")  # as a test's driver runs
    size = ARCHIVE.stat().st_size >> 20
    print(f"{ARCHIVE.relative_to(ROOT)}: {size} MiB in {time.monotonic() - started:.0f} s")
