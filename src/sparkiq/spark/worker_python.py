"""A Python for Spark's workers that answers Spark's connect-back before it imports anything.

Spark starts some Python workers as plain processes (``python -m <worker module>``) and waits
for each to connect back to a socket: the foreachBatch and listener workers of Spark Connect,
and the runner of a Python streaming source (``spark.readStream.format("sparkiq")``), in
classic sessions too (UDFs and batch data sources go through PySpark's daemon instead).
The wait is fixed at 10 s (``PythonWorkerFactory``, no setting), and Spark's authentication
then allows another 10 s. But a worker module connects back only after its imports: PySpark,
pandas, pyarrow and gRPC, about 0.6 CPU-s. On a busy host (a shared CI machine, a driver next
to heavy jobs) that took 13-19 s here, the worker missed the deadline and the query failed
with "Python worker failed to connect back", whatever the pipeline did.

Run with ``PYSPARK_PYTHON`` pointing at the ``sparkiq-worker-python`` command, a worker
process first connects, authenticates and sends its process id (what PySpark's
``get_sock_file_to_executor`` does), using the standard library only, in milliseconds. Then
it imports the worker module and runs it as ``__main__`` with PySpark's
``get_sock_file_to_executor`` answering with that socket. After the handshake Spark reads the
socket without a deadline, so the imports may take what the machine gives them. Any other
start (``-m pyspark.daemon``, ``-c ...``, a script) runs unchanged.

Spark also puts the ``pyspark.zip`` and py4j zip of its own installation first on a worker's
``PYTHONPATH``. With PySpark installed by pip that zip lies inside the very package this
interpreter imports from ``site-packages``, with the same files, but a zip holds no compiled
bytecode: every worker process compiled each PySpark module it imported from source again
(0.8-1.0 against 0.15-0.25 CPU-s for the modules a UDF worker imports, measured here). The
command drops those two zips from the path when they are this interpreter's own PySpark's,
for every start; the zips of any other Spark installation stay where Spark put them.

It depends on what PySpark's worker modules share (``__main__`` opens the socket with
``pyspark.worker_util.get_sock_file_to_executor``) and on the handshake of Spark's
``SocketAuthHelper``; both are stable across the PySpark versions ``pyproject.toml`` allows,
and the Spark Connect tests start every worker through this module.
"""

from __future__ import annotations

import contextlib
import os
import runpy
import socket
import struct
import sys
import sysconfig
from collections.abc import Iterator, Mapping
from typing import IO, Any, cast

__all__ = ["command", "connect_back", "main", "own_pyspark_zips"]

# What Spark's JVM puts in the environment of a worker it waits for (PythonWorkerFactory):
# a TCP port and a secret, or the path of a Unix socket (no secret).
_PORT = "PYTHON_WORKER_FACTORY_PORT"
_SOCK_PATH = "PYTHON_WORKER_FACTORY_SOCK_PATH"
_SECRET = "PYTHON_WORKER_FACTORY_SECRET"


def connect_back(environ: Mapping[str, str]) -> tuple[IO[bytes], socket.socket]:
    """Connect to the JVM that started this process, authenticate and send this process's id;
    the socket's file and the socket, as PySpark's ``local_connect_and_auth`` returns them
    (with its timeout: ``SPARK_AUTH_SOCKET_TIMEOUT``, 15 s)."""
    timeout = int(environ.get("SPARK_AUTH_SOCKET_TIMEOUT", 15))
    buffer = int(environ.get("SPARK_BUFFER_SIZE", 65536))
    secret = environ.get(_SECRET)
    if _SOCK_PATH in environ and secret is None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        sock.connect(environ[_SOCK_PATH])
    else:
        host = "::1" if environ.get("SPARK_PREFER_IPV6", "false").lower() == "true" else "127.0.0.1"
        sock = socket.create_connection((host, int(environ[_PORT])), timeout=timeout)
    sock_file = cast(IO[bytes], sock.makefile("rwb", buffer))
    try:
        if secret is not None:
            # SocketAuthHelper: the secret, length first; the JVM answers "ok" or "err".
            sock_file.write(_with_length(secret.encode()))
            sock_file.flush()
            (length,) = struct.unpack(">i", _read_exactly(sock_file, 4))
            reply = _read_exactly(sock_file, length).decode()
            if reply != "ok":
                raise ConnectionError(f"Spark refused this Python worker's secret ({reply!r})")
        sock_file.write(struct.pack(">i", os.getpid()))
        sock_file.flush()
    except BaseException:
        sock_file.close()
        sock.close()
        raise
    return sock_file, sock


def _with_length(data: bytes) -> bytes:
    return struct.pack(">i", len(data)) + data


def _read_exactly(sock_file: IO[bytes], n: int) -> bytes:
    data = sock_file.read(n)
    if len(data) != n:
        raise ConnectionError("Spark closed the connection during the Python worker's handshake")
    return data


def _answering_with(sock_file: IO[bytes], sock: socket.socket) -> Any:
    """A stand-in for PySpark's ``get_sock_file_to_executor`` that hands out the socket this
    process already opened (and sets the same timeout: ``None`` blocks, ``-1`` keeps the
    handshake's)."""

    @contextlib.contextmanager
    def get_sock_file_to_executor(timeout: int | None = -1) -> Iterator[IO[bytes]]:
        if timeout is None or timeout > 0:
            sock.settimeout(timeout)
        try:
            yield sock_file
        finally:
            sock_file.close()

    return get_sock_file_to_executor


def command() -> str:
    """The ``sparkiq-worker-python`` command of this interpreter's installation, for
    ``PYSPARK_PYTHON`` or ``spark.pyspark.python``; this interpreter itself where the command
    is not beside it (a source tree on ``PYTHONPATH``), whose workers then connect back after
    their imports. Never one found on ``PATH``: it may belong to another environment, whose
    interpreter lacks this one's packages."""
    beside = os.path.join(os.path.dirname(sys.executable), "sparkiq-worker-python")
    return beside if os.access(beside, os.X_OK) else sys.executable


def own_pyspark_zips(entries: list[str]) -> set[str]:
    """The entries of a path that are the ``pyspark.zip`` or py4j zip inside the PySpark
    package installed in this interpreter's ``site-packages``, where the same modules are
    importable compiled (the package and py4j both installed there)."""
    packages = sysconfig.get_paths()["purelib"]
    if not (
        os.path.isfile(os.path.join(packages, "pyspark", "__init__.py"))
        and os.path.isfile(os.path.join(packages, "py4j", "__init__.py"))
    ):
        return set()
    lib = os.path.realpath(os.path.join(packages, "pyspark", "python", "lib"))
    return {
        entry
        for entry in entries
        if os.path.dirname(os.path.realpath(entry)) == lib
        and (
            os.path.basename(entry) == "pyspark.zip"
            or (os.path.basename(entry).startswith("py4j-") and entry.endswith("-src.zip"))
        )
    }


def main(argv: list[str] | None = None) -> int:
    """``sparkiq-worker-python ARGS``: what ``python ARGS`` does, but a Spark worker module
    connects back first."""
    args = sys.argv[1:] if argv is None else argv
    entries = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    own = own_pyspark_zips(entries)
    if own:
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in entries if p not in own)
    waited_for = _PORT in os.environ or _SOCK_PATH in os.environ
    if not (waited_for and len(args) == 2 and args[0] == "-m"):
        os.execv(sys.executable, [sys.executable, *args])
    sock_file, sock = connect_back(os.environ)
    own = own_pyspark_zips(sys.path)  # as this process's path spells them
    sys.path[:] = [p for p in sys.path if p not in own]
    sys.path[0] = os.getcwd()  # where `python -m` looks first (Spark's files for the job)
    import pyspark.worker_util  # the slow part: PySpark, and the rest as the module needs

    pyspark.worker_util.get_sock_file_to_executor = _answering_with(sock_file, sock)
    runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
