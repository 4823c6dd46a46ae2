"""``sparkiq-worker-python``: a Spark worker connects back before its imports.

The test plays Spark's side of the handshake (PythonWorkerFactory and SocketAuthHelper) on a
real socket and starts real worker processes. The worker module below cannot finish importing
until the test lets it, so a worker that connected only after its imports (plain ``python``)
would never connect in time; the real Spark path is exercised by every Connect test, which
starts its workers through the same command.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from subprocess import Popen
from typing import Any

import pytest

from sparkiq.spark import worker_python

HANG = 120.0  # a bound for a hang only; nothing here waits for it when things work

# A worker module shaped as PySpark's are; its import waits for the file `go`, as PySpark's
# imports wait for the CPU on a busy machine.
WORKER = """
import os, struct, time
while not os.path.exists(os.environ["GO"]):
    time.sleep(0.01)
from pyspark.worker_util import get_sock_file_to_executor


def main(infile, outfile):
    (n,) = struct.unpack(">i", infile.read(4))
    outfile.write(struct.pack(">i", 2 * n))
    outfile.flush()


if __name__ == "__main__":
    with get_sock_file_to_executor(timeout=None) as sock_file:
        main(sock_file, sock_file)
"""


@pytest.fixture
def module_dir(tmp_path: Path) -> Path:
    (tmp_path / "slow_worker.py").write_text(WORKER)
    return tmp_path


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(HANG)
        yield server


@contextlib.contextmanager
def started(module_dir: Path, env: dict[str, str], python: str) -> Iterator[Popen[bytes]]:
    """``python -m slow_worker`` with ``env``, killed when the block ends."""
    worker = subprocess.Popen(
        [python, "-m", "slow_worker"],
        cwd=module_dir,
        env={**os.environ, "GO": str(module_dir / "go"), **env},
        stderr=subprocess.PIPE,
    )
    try:
        yield worker
    finally:
        worker.kill()
        worker.wait()


def tcp(listener: socket.socket, secret: str) -> dict[str, str]:
    """What Spark's JVM puts in a TCP worker's environment."""
    port = str(listener.getsockname()[1])
    return {"PYTHON_WORKER_FACTORY_PORT": port, "PYTHON_WORKER_FACTORY_SECRET": secret}


def read_exactly(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        assert chunk, "the worker closed the connection"
        data += chunk
    return data


def read_int(conn: socket.socket) -> int:
    return int(struct.unpack(">i", read_exactly(conn, 4))[0])


def the_rest_of_the_handshake_then_the_module(
    conn: socket.socket, worker: Popen[bytes], module_dir: Path
) -> None:
    assert read_int(conn) == worker.pid  # the whole handshake while the imports still wait
    (module_dir / "go").touch()
    conn.sendall(struct.pack(">i", 21))
    assert read_int(conn) == 42  # the module ran as __main__ on the same socket


def test_a_worker_connects_authenticates_and_sends_its_pid_before_its_imports(
    module_dir: Path, listener: socket.socket
) -> None:
    with started(module_dir, tcp(listener, "s3cret"), worker_python.command()) as worker:
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(HANG)
            assert read_exactly(conn, read_int(conn)) == b"s3cret"
            conn.sendall(struct.pack(">i", 2) + b"ok")
            the_rest_of_the_handshake_then_the_module(conn, worker, module_dir)
        assert worker.wait(HANG) == 0


def test_a_plain_interpreter_connects_only_after_the_imports(
    module_dir: Path, listener: socket.socket
) -> None:
    """What the command is for: with ``python`` itself the worker is silent until its imports
    are done (here: until ``go`` exists), which is what missed Spark's 10 s."""
    with started(module_dir, tcp(listener, "s3cret"), sys.executable):
        listener.settimeout(1.0)
        with pytest.raises(TimeoutError):
            listener.accept()
        (module_dir / "go").touch()
        listener.settimeout(HANG)
        conn, _ = listener.accept()
        conn.close()


def test_a_worker_over_a_unix_socket_sends_no_secret(module_dir: Path, tmp_path: Path) -> None:
    path = str(tmp_path / "w.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(path)
        server.listen()
        server.settimeout(HANG)
        env = {"PYTHON_WORKER_FACTORY_SOCK_PATH": path}
        with started(module_dir, env, worker_python.command()) as worker:
            conn, _ = server.accept()
            with conn:
                conn.settimeout(HANG)
                the_rest_of_the_handshake_then_the_module(conn, worker, module_dir)
            assert worker.wait(HANG) == 0


def test_a_refused_secret_ends_the_worker_with_a_message(
    module_dir: Path, listener: socket.socket
) -> None:
    with started(module_dir, tcp(listener, "wrong"), worker_python.command()) as worker:
        conn, _ = listener.accept()
        with conn:
            read_exactly(conn, read_int(conn))
            conn.sendall(struct.pack(">i", 3) + b"err")
            _, err = worker.communicate(timeout=HANG)
        assert worker.returncode != 0
        assert b"Spark refused this Python worker's secret ('err')" in err


def test_any_other_start_is_plain_python(tmp_path: Path) -> None:
    """``-m pyspark.daemon`` (no port to connect back to), ``-c``, scripts: run unchanged."""
    out = subprocess.run(
        [worker_python.command(), "-c", "import sys; print(sys.argv[1:])", "a", "b"],
        capture_output=True,
        check=True,
        cwd=tmp_path,
    )
    assert out.stdout.decode().strip() == "['a', 'b']"


def test_the_command_is_installed_beside_the_interpreter() -> None:
    assert Path(worker_python.command()).parent == Path(sys.executable).parent


# A Python streaming source plans its partitions in a worker Spark waits for (the source
# runner); the partition carries whether that worker was started through the command.
def started_source() -> type:
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

    class Reader(DataSourceStreamReader):
        def initialOffset(self) -> dict[str, int]:
            return {"batch": 0}

        # the form without a read limit, which Spark still calls
        def latestOffset(self) -> dict[str, int]:  # type: ignore[override]
            return {"batch": 1}

        def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[Any]:
            through = "sparkiq.spark.worker_python" in sys.modules
            return [InputPartition(through)] if start["batch"] < end["batch"] else []

        def read(self, partition: Any) -> Iterator[tuple[bool]]:
            yield (partition.value,)

        def commit(self, end: dict[str, int]) -> None:
            pass

    class Started(DataSource):
        @classmethod
        def name(cls) -> str:
            return "sparkiq_test_started"

        def schema(self) -> str:
            return "through_the_command boolean"

        def streamReader(self, schema: Any) -> Reader:
            return Reader()

    return Started


def test_a_local_session_starts_its_workers_through_the_command(
    spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A classic local session without PYSPARK_PYTHON: the App's sink points Spark's workers
    at the command. The test session's own (started with PYSPARK_PYTHON, a JVM fewer than a
    session of its own) is put back in that state for the test: no PYSPARK_PYTHON, its
    workers' interpreter PySpark's default. A Python function captures the interpreter when
    it is made, so the source registered below plans in a worker of the command only if the
    session's interpreter was switched before."""
    from sparkiq.spark.sink import use_this_python_for_local_workers

    context = spark.sparkContext
    before = context.pythonExec
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    context.pythonExec = "python3"  # PySpark's default without PYSPARK_PYTHON
    try:
        use_this_python_for_local_workers(spark)
        assert context.pythonExec == worker_python.command()
        spark.dataSource.register(started_source())
    finally:
        context.pythonExec = before
    query = spark.readStream.format("sparkiq_test_started").load().writeStream.format("memory")
    query = query.queryName("sparkiq_test_started").start()
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    rows = spark.sql("SELECT * FROM sparkiq_test_started").collect()
    spark.catalog.dropTempView("sparkiq_test_started")
    assert [r["through_the_command"] for r in rows] == [True]


def test_only_the_zips_of_this_interpreters_own_pyspark_are_dropped(tmp_path: Path) -> None:
    import pyspark

    lib = Path(pyspark.__file__).parent / "python" / "lib"
    own = [str(lib / "pyspark.zip"), *map(str, lib.glob("py4j-*-src.zip"))]
    assert len(own) == 2
    other = tmp_path / "spark" / "python" / "lib"
    entries = [*own, str(other / "pyspark.zip"), str(other / "py4j-0.10.9.9-src.zip"), "/x"]
    assert worker_python.own_pyspark_zips(entries) == set(own)


# A worker module that answers with the file its PySpark was imported from.
WHERE_WORKER = """
import pyspark
from pyspark.worker_util import get_sock_file_to_executor

if __name__ == "__main__":
    with get_sock_file_to_executor(timeout=None) as sock_file:
        sock_file.write(pyspark.__file__.encode() + b"\\n")
        sock_file.flush()
"""


def test_a_waited_for_worker_imports_the_installed_pyspark_too(tmp_path: Path) -> None:
    """The start Spark waits for (not an exec): the zips Spark put first on the path are
    dropped before the worker module imports PySpark."""
    import pyspark

    (tmp_path / "where_worker.py").write_text(WHERE_WORKER)
    lib = Path(pyspark.__file__).parent / "python" / "lib"
    zips = os.pathsep.join([str(lib / "pyspark.zip"), *map(str, lib.glob("py4j-*-src.zip"))])
    path = str(tmp_path / "w.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(path)
        server.listen()
        server.settimeout(HANG)
        env = {**os.environ, "PYTHON_WORKER_FACTORY_SOCK_PATH": path, "PYTHONPATH": zips}
        worker = Popen([worker_python.command(), "-m", "where_worker"], cwd=tmp_path, env=env)
        try:
            conn, _ = server.accept()
            with conn:
                conn.settimeout(HANG)
                assert read_int(conn) == worker.pid
                answer = conn.makefile("rb").readline().decode().strip()
            assert worker.wait(HANG) == 0
        finally:
            worker.kill()
            worker.wait()
    assert answer == pyspark.__file__


def test_a_workers_pyspark_is_the_compiled_one_not_sparks_zip(spark: Any) -> None:
    """Spark puts its pyspark.zip first on a worker's path; the command's workers (the
    session's PYSPARK_PYTHON) import the same PySpark from site-packages, compiled, as the
    driver does."""
    import pyarrow as pa
    import pyspark

    def where(batches: Iterator[Any]) -> Iterator[Any]:
        import pyspark as worker_pyspark

        for _ in batches:
            yield pa.RecordBatch.from_pylist([{"file": worker_pyspark.__file__}])

    (row,) = spark.range(1).mapInArrow(where, "file string").collect()
    assert row["file"] == pyspark.__file__
