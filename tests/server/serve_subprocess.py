"""A ``sparkiq serve`` subprocess for tests that measure a node from outside: its memory
(``/proc/<pid>``), or stalls that a test process sharing the node's GIL would hide."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from tests import forked_python


@contextmanager
def serving(
    args: list[str],
    cwd: Path,
    ready: Callable[[forked_python.Process], bool],
    *,
    env: Mapping[str, str] | None = None,
    errors: tuple[type[BaseException], ...] = (),
    timeout: float = 120.0,
    interval: float = 0.1,
) -> Iterator[forked_python.Process]:
    """``sparkiq serve *args`` in ``cwd`` (its output in ``cwd/node.log``), yielded once
    ``ready(process)`` is true -- ``errors`` raised by it mean "not yet" -- and terminated
    on exit. ``timeout`` is for a hang, not a speed target: on a loaded machine starting
    Python and importing pyarrow and DuckDB takes tens of seconds."""
    log = cwd / "node.log"
    environ = os.environ | {"PYTHONUNBUFFERED": "1"} | dict(env or {})
    command = [sys.executable, "-m", "sparkiq.cli", "serve", *args]
    with open(log, "wb") as out:
        process = forked_python.popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=environ, cwd=cwd
        )
    try:
        deadline = time.monotonic() + timeout
        while True:
            assert process.poll() is None, log.read_text()[-3000:]
            try:
                if ready(process):
                    break
            except errors:
                pass
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(interval)
        yield process
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
