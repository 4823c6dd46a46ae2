"""Client sessions in a process of their own, so that they run on a host of their own.

``python -m tests.hosts.clients OUT SPEC [--token T] [--ca PEM] [--pause S]``: runs one
:class:`~tests.faults.history.Loader` per session of ``SPEC`` (a JSON list of
``{"name", "seed", "urls"}``) and appends each operation, as it ends, to ``OUT`` as one
JSON line (:func:`encode`); SIGTERM stops the sessions and writes what is left. A namespace
is a property of a process (its sockets), so the sessions cannot be threads of the test
process: ``ip netns exec CLIENTS python -m tests.hosts.clients ...`` puts them on the clients'
host. Operation times are ``time.monotonic()``, which is one clock for every namespace of the
machine, so the test process compares them with its own fault times.

:class:`RemoteSessions` is the test process's side: it reads ``OUT`` as it grows and hands
out one :class:`RemoteSession` per session, each with the ``ops`` a ``Loader`` has, for
:func:`tests.faults.underload.under_load`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
from decimal import Decimal
from pathlib import Path
from typing import Any

from tests.faults.history import Loader, Op


def encode(op: Op) -> str:
    def plain(value: object) -> object:
        if isinstance(value, Decimal) and value == int(value):
            return int(value)  # DuckDB's sum of longs
        raise TypeError(f"{type(value).__name__} in an operation: {value!r}")

    return json.dumps(dataclasses.asdict(op), default=plain)


def decode(line: str) -> Op:
    doc = json.loads(line)
    doc["bound"] = {int(p): b for p, b in doc["bound"].items()}
    doc["position"] = {int(p): b for p, b in doc["position"].items()}
    return Op(**doc)


def run(out: str, sessions: list[dict[str, Any]], token: str | None, ca: str | None,
        pause: float) -> None:  # fmt: skip
    loaders = [
        Loader(s["name"], s["urls"], s["seed"], pause=pause, token=token, ca=ca) for s in sessions
    ]
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    written = [0] * len(loaders)
    with open(out, "a") as handle:

        def flush() -> None:
            for i, loader in enumerate(loaders):
                done = len(loader.ops)  # a list only appended to: read up to a length
                for op in loader.ops[written[i] : done]:
                    handle.write(encode(op) + "\n")
                written[i] = done
            handle.flush()

        for loader in loaders:
            loader.start()
        while not stop.wait(0.1):
            flush()
        for loader in loaders:
            loader.stop()
        flush()


class RemoteSession:
    """One session of a clients process, as the test process sees it."""

    def __init__(self, name: str, reader: RemoteSessions) -> None:
        self.client_name, self._reader = name, reader
        self._ops: list[Op] = []  # filled by the reader

    @property
    def ops(self) -> list[Op]:
        self._reader.read()
        return self._ops


class RemoteSessions:
    """Starts a clients process on ``prefix`` (``ip netns exec NS``) and reads its output."""

    def __init__(
        self,
        out: Path,
        sessions: list[dict[str, Any]],
        *,
        prefix: list[str],
        cwd: str,
        env: dict[str, str],
        token: str | None = None,
        ca: str | None = None,
        pause: float = 0.0,
    ) -> None:
        self.out = out
        self.sessions = {s["name"]: RemoteSession(s["name"], self) for s in sessions}
        self._offset = 0
        out.write_text("")
        args = [*prefix, sys.executable, "-m", "tests.hosts.clients", str(out),
                json.dumps(sessions), "--pause", str(pause)]  # fmt: skip
        args += ["--token", token] if token else []
        args += ["--ca", ca] if ca else []
        with open(out.with_suffix(".log"), "ab") as log:
            self.process = subprocess.Popen(
                args, cwd=cwd, env=os.environ | env, stdout=log, stderr=subprocess.STDOUT
            )

    def read(self) -> None:
        """Take in the lines written since the last call (a partial last line waits)."""
        with open(self.out, "rb") as handle:
            handle.seek(self._offset)
            data = handle.read()
        whole = data[: data.rfind(b"\n") + 1]
        self._offset += len(whole)
        for line in whole.decode().splitlines():
            op = decode(line)
            self.sessions[op.client]._ops.append(op)
        if self.process.poll() not in (None, 0):
            log = self.out.with_suffix(".log").read_text(errors="replace")[-3000:]
            raise AssertionError(f"the clients process exited: {log}")

    def stop(self) -> list[Op]:
        """Stop the sessions; every operation they made, session by session."""
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(120)
        self.read()
        return [op for s in self.sessions.values() for op in s._ops]

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="tests.hosts.clients")
    parser.add_argument("out")
    parser.add_argument("sessions", type=json.loads)
    parser.add_argument("--token")
    parser.add_argument("--ca")
    parser.add_argument("--pause", type=float, default=0.0)
    args = parser.parse_args(argv)
    run(args.out, args.sessions, args.token, args.ca, args.pause)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
