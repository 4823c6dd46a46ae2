"""``python -m MODULE`` processes for tests, forked from a process that has imported sparkiq.

The suite starts about a hundred Python processes that import all of sparkiq: ``sparkiq
serve`` nodes, followers, benchmark helpers. A new interpreter spends most of a CPU-second
importing pyarrow, numpy, DuckDB, sqlglot and sparkiq before it does anything a test looks
at, and on two cores that is time taken from every other test. Here each test process (a
pytest worker) keeps one *zygote*: a Python process that imported those modules once and
then forks a child per request. The child is a real process with a pid of its own, its own
working directory, environment, arguments and output files; signals, ``/proc`` and a kill
reach it as they would reach ``subprocess.Popen``'s; it runs the module as ``python -m``
would (``__main__``, ``sys.argv``, the interpreter's normal exit with its threads and
``atexit``). What it skips is the interpreter's start and those imports.

What it cannot show is a problem in that start: ``sparkiq``'s own command line and import
are tested with real interpreters (tests/test_cli.py, tests/test_package.py).

:func:`popen` takes the arguments ``subprocess.Popen`` would and returns a
:class:`ForkedProcess` with the same ``pid``, ``poll``, ``wait``, ``send_signal``,
``terminate``, ``kill`` and ``returncode``. A command that is not
``[sys.executable, "-m", MODULE, ...]`` is started by ``subprocess.Popen`` itself.
``SPARKIQ_TEST_NO_FORK=1`` starts every process with ``subprocess.Popen``.

Usage of the zygote itself: ``python -m tests.forked_python SOCKET`` (started by
:func:`popen`; it exits, killing what it forked, when its standard input closes).
"""

from __future__ import annotations

import array
import atexit
import contextlib
import gc
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from typing import IO, Any

#: What every zygote imports before its first fork: what a node imports, and pandas, which
#: pyarrow imports when a node first builds an array from Python values (its pandas check,
#: 0.33-0.38 CPU-s in each child otherwise: some 25 CPU-s over a run of the suite).
PRELOAD = ("sparkiq.cli", "sparkiq.node", "pandas")
NO_FORK_ENV = "SPARKIQ_TEST_NO_FORK"
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The zygote of this process, started on first use; the lock guards its start.
_zygote: _Zygote | None = None
_zygote_lock = threading.Lock()


class ForkedProcess:
    """A child of the zygote, driven like ``subprocess.Popen``. Its exit status comes over
    the connection that asked for it (the zygote reaps it): a negative number is the signal
    that ended it, as with ``Popen``."""

    def __init__(self, args: Sequence[str], connection: socket.socket, pid: int) -> None:
        self.args, self.pid, self.returncode = list(args), pid, None
        # the ends of the pipes asked for (``PIPE``), as Popen's
        self.stdin: IO[Any] | None = None
        self.stdout: IO[Any] | None = None
        self.stderr: IO[Any] | None = None
        self._connection = connection
        self._lock = threading.Lock()  # guards reading the status and closing the connection

    def _read_status(self, timeout: float | None) -> int | None:
        with self._lock:
            if self.returncode is None:
                self._connection.settimeout(timeout)
                try:
                    data = self._connection.recv(64)
                except (TimeoutError, BlockingIOError):
                    return None
                # the zygote writes the status, or closes the connection when it dies
                self.returncode = int(data) if data else -signal.SIGKILL
                self._connection.close()
            return self.returncode

    def poll(self) -> int | None:
        return self._read_status(0.0)

    def wait(self, timeout: float | None = None) -> int:
        status = self._read_status(timeout)
        if status is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return status

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # as Popen: never signal a pid that may be another's now
            # As Popen too, a process that ended and was reaped before its status reached
            # us is not an error: the zygote reaps its children and sends each status
            # after, so between the two the pid is gone while poll() still says running
            # (a whole run on four workers hit it stopping a cluster's node).
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def __enter__(self) -> ForkedProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        for stream in (self.stdin, self.stdout, self.stderr):
            if stream is not None:
                stream.close()
        self.wait()


class _Zygote:
    def __init__(self) -> None:
        self.directory = tempfile.mkdtemp(prefix="sparkiq-zygote-")
        atexit.register(shutil.rmtree, self.directory, True)
        self.path = os.path.join(self.directory, "socket")
        import sparkiq

        # The code this process runs (a git worktree's own, say), whatever the venv points at;
        # no BLAS threads (numpy's) in a process that forks.
        code = [os.path.dirname(os.path.dirname(sparkiq.__file__)), _REPO]
        environ = os.environ | {
            "PYTHONPATH": os.pathsep.join(code),
            "PYTHONUNBUFFERED": "1",
            "OPENBLAS_NUM_THREADS": "1",
        }
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.forked_python", self.path],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=environ,
            cwd=_REPO,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()  # after its imports: a hang limit is pytest's
        if line != b"ready\n":
            raise RuntimeError(f"the test zygote did not start: {line!r}")

    def fork(
        self,
        args: Sequence[str],
        module: str,
        files: Sequence[int],
        env: Mapping[str, str],
        cwd: str,
    ) -> ForkedProcess:
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        connection.connect(self.path)
        request = {"module": module, "argv": list(args[3:]), "env": dict(env), "cwd": cwd}
        fds = array.array("i", files)
        connection.sendmsg(
            [json.dumps(request).encode() + b"\n"],
            [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds.tobytes())],
        )
        answer = b""
        while not answer.endswith(b"\n"):  # a byte at a time: the exit status may follow
            chunk = connection.recv(1)
            if not chunk:
                raise RuntimeError("the test zygote closed the connection before forking")
            answer += chunk
        return ForkedProcess(args, connection, int(answer))


def _forkable(args: Sequence[str], kwargs: Mapping[str, Any]) -> str | None:
    """The module of ``[sys.executable, "-m", MODULE, ...]`` when the rest of the call is
    one the zygote can honour, else None."""
    if os.environ.get(NO_FORK_ENV) == "1" or not isinstance(args, (list, tuple)):
        return None
    if len(args) < 3 or args[0] != sys.executable or args[1] != "-m":
        return None
    if set(kwargs) - {"stdin", "stdout", "stderr", "env", "cwd", "text"}:
        return None
    streams = [kwargs.get(name) for name in ("stdin", "stdout", "stderr")]
    if any(not (s is None or isinstance(s, int) or hasattr(s, "fileno")) for s in streams):
        return None
    return str(args[2])


#: What :func:`popen` returns.
Process = ForkedProcess | subprocess.Popen[Any]


def popen(args: Sequence[str], **kwargs: Any) -> Process:
    """``subprocess.Popen(args, **kwargs)``, forked from the zygote when ``args`` runs a
    module of this interpreter and the other arguments are among ``stdin``, ``stdout``,
    ``stderr`` (files, ``PIPE``, ``DEVNULL``, ``STDOUT``, or not given: this process's
    own), ``env``, ``cwd`` and ``text``."""
    module = _forkable(args, kwargs)
    if module is None:
        return subprocess.Popen(args, **kwargs)
    global _zygote
    with _zygote_lock:
        if _zygote is None or _zygote.process.poll() is not None:
            _zygote = _Zygote()
        zygote = _zygote
    child_ends: list[int] = []  # what the child gets as 0, 1 and 2
    ours: dict[str, IO[Any]] = {}  # the pipes' other ends, as Popen's stdin/stdout/stderr
    to_close: list[int] = []
    try:
        for fd, name in enumerate(("stdin", "stdout", "stderr")):
            target = kwargs.get(name)
            if target is None:
                child_ends.append(fd)  # inherited, as Popen's child would
            elif target == subprocess.STDOUT and name == "stderr":
                child_ends.append(child_ends[1])
            elif target == subprocess.DEVNULL:
                null = os.open(os.devnull, os.O_RDWR)
                to_close.append(null)
                child_ends.append(null)
            elif target == subprocess.PIPE:
                read, write = os.pipe()
                theirs, mine = (read, write) if fd == 0 else (write, read)
                to_close.append(theirs)
                child_ends.append(theirs)
                mode = ("w" if fd == 0 else "r") + ("" if kwargs.get("text") else "b")
                ours[name] = open(mine, mode)  # noqa: SIM115
            else:
                child_ends.append(target if isinstance(target, int) else target.fileno())
        env = kwargs.get("env")
        process = zygote.fork(
            args,
            module,
            child_ends,
            os.environ if env is None else env,
            os.fspath(kwargs.get("cwd") or os.getcwd()),
        )
    except BaseException:
        for stream in ours.values():
            stream.close()
        raise
    finally:
        for fd in to_close:
            os.close(fd)
    process.stdin, process.stdout, process.stderr = (
        ours.get("stdin"),
        ours.get("stdout"),
        ours.get("stderr"),
    )
    return process


# --- the zygote ---------------------------------------------------------------------------


def _receive(connection: socket.socket) -> tuple[dict[str, Any], list[int]]:
    data, fds = b"", array.array("i")
    while not data.endswith(b"\n"):
        chunk, ancillary, _flags, _address = connection.recvmsg(1 << 20, socket.CMSG_LEN(64))
        if not chunk:
            raise ConnectionError("closed mid-request")
        data += chunk
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    return json.loads(data), list(fds)


def _serve(path: str) -> tuple[dict[str, Any], list[int]]:
    """Forks a child per request until standard input closes. Returns only in a child:
    its request and the descriptors it came with."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # only to wake the selector below
    children: dict[int, socket.socket] = {}
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(wake_read, selectors.EVENT_READ)
    selector.register(sys.stdin, selectors.EVENT_READ)
    print("ready", flush=True)
    while True:
        for key, _ in selector.select():
            if key.fileobj is sys.stdin:
                if not os.read(sys.stdin.fileno(), 4096):
                    for pid in children:  # the test process is gone: so are its children
                        os.kill(pid, signal.SIGKILL)
                    os._exit(0)
            elif key.fileobj == wake_read:
                os.read(wake_read, 4096)
            else:
                connection, _ = listener.accept()
                try:
                    request, fds = _receive(connection)
                except (OSError, ValueError):
                    connection.close()
                    continue
                pid = os.fork()
                if pid == 0:
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    selector.close()
                    for fd in (wake_read, wake_write):
                        os.close(fd)
                    listener.close()
                    connection.close()
                    for other in children.values():
                        other.close()
                    return request, fds
                for fd in fds:
                    os.close(fd)
                connection.sendall(f"{pid}\n".encode())
                children[pid] = connection
        while children:  # reap every child that ended, and tell whoever started it
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            connection = children.pop(pid)
            with contextlib.suppress(OSError):
                connection.sendall(str(os.waitstatus_to_exitcode(status)).encode())
            connection.close()


def _become(request: dict[str, Any], fds: list[int]) -> None:
    """In a forked child: take the request's standard files, directory and environment,
    and run its module as ``python -m`` would."""
    import runpy

    for target, fd in enumerate(fds[:3]):
        os.dup2(fd, target)
    for fd in set(fds):
        if fd > 2:
            os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    time.tzset()
    sys.path[0] = os.getcwd()  # what ``python -m`` puts first
    # as in a new interpreter, the module runs as ``__main__`` without having been imported
    sys.modules.pop(request["module"], None)
    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)


def _zygote_main(path: str) -> None:
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    # What the imports made lives as long as any child: frozen, a child's full collections
    # do not walk it (some 50 ms each) nor write to its pages, which stay shared.
    gc.freeze()
    request, fds = _serve(path)
    sys.argv = [request["module"], *request["argv"]]
    _become(request, fds)


if __name__ == "__main__":
    _zygote_main(sys.argv[1])
