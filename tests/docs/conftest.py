"""The live system the docs' samples run against: ``sparkiq demo`` (as ``make demo`` runs
it, with its output piped, into a temporary state dir) and, beside it, a node on the same
state with the Postgres endpoint. Started once for the docs tests; the last test of
tests/docs/test_docs_blocks.py checks what the demo printed and stops it with Ctrl-C."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from sparkiq import Node
from tests import http_calls
from tests.docs.blocks import write_inputs

DEMO_TABLES = ("revenue_by_product", "orders_by_user", "revenue_per_window")


@dataclass(frozen=True)
class Live:
    """Where the docs' samples run: the demo's node (``http``, ``host:port``), the
    Postgres endpoint's port, and the directory holding ``demo-state``; the demo's process,
    the files its stdout and stderr go to, and the address it was told to listen on (held
    by another socket: it serves on a free port instead and says so)."""

    http: str
    pg_port: int
    root: Path
    demo: subprocess.Popen[str]
    out: Path
    err: Path
    asked: str

    @property
    def url(self) -> str:
        return f"http://{self.http}"


def _printed(log: Path, err: Path) -> str:
    return f"its output:\n{log.read_text()}\nits errors:\n{err.read_text()[-3000:]}"


def _wait_until_served(url: str, process: subprocess.Popen[str], log: Path, err: Path) -> None:
    """Until every demo table answers a query with at least one row. No deadline of its own:
    the demo gives up by itself when Spark serves no micro-batch in five minutes.

    The tables are asked only once the demo has printed its first summary of them (a line
    ``[HH:MM:SS] batch N | ...``: it read them through its node): three queries every half
    second over its start, which takes tens of seconds, cost the demo's node and this
    process CPU for nothing."""
    while not re.search(r"^\[[\d:]+\] batch ", log.read_text(), re.M):
        assert process.poll() is None, f"the demo stopped; {_printed(log, err)}"
        time.sleep(0.5)
    while True:
        assert process.poll() is None, f"the demo stopped; {_printed(log, err)}"
        try:
            counts = [
                http_calls.post(f"{url}/query", json={"sql": f"SELECT count(*) AS n FROM {t}"})
                for t in DEMO_TABLES
            ]
            if all(r.status_code == 200 and r.json()["rows"][0]["n"] > 0 for r in counts):
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)


def stop_demo(process: subprocess.Popen[str]) -> int:
    """Ctrl-C as a terminal sends it, to the demo's whole process group (its Spark JVM
    too); its exit code."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGINT)
    try:
        return process.wait(120)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        return process.wait()


# Package scope: the demo streams three queries as long as it runs; kept for the whole
# session it went on taking CPU from every test its worker ran after the docs.
@pytest.fixture(scope="package")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    root = tmp_path_factory.mktemp("docs-live")
    state = root / "demo-state"
    held = socket.socket()  # another process on the address the demo is told to use
    held.bind(("127.0.0.1", 0))
    held.listen()
    asked = f"127.0.0.1:{held.getsockname()[1]}"
    command = [sys.executable, "-m", "sparkiq.cli", "demo", "--state-dir", str(state)]
    # A micro-batch every 20 s, not every second: the demo runs beside the docs tests that
    # read it, and at 1 s its three queries took half a core all along (a batch costs the
    # same CPU however few rows it holds; measured over a minute: 19 CPU-s at 5 s, 9 at
    # 10 s; its start and 90 s served: 44.6 and 41.7 CPU-s at 10 s, 31.1 and 36.5 at 20 s).
    # The samples need live tables, not fast ones; a push query waits up to one interval
    # for a change, and the first rows come one interval after the start.
    command += ["--listen", asked, "--rate", "50", "--trigger", "20"]
    log, err = root / "demo.log", root / "demo.err"
    with log.open("w") as out, err.open("w") as errors:
        process = subprocess.Popen(
            command, stdout=out, stderr=errors, text=True, cwd=root, start_new_session=True
        )
    pg = None
    try:
        while not log.read_text().endswith("\n"):  # its first line: the console's URL
            assert process.poll() is None, _printed(log, err)
            time.sleep(0.1)
        first = log.read_text().splitlines()[0]
        match = re.fullmatch(r"sparkiq console: http://(127\.0\.0\.1:\d+)/", first)
        assert match, first
        _wait_until_served(f"http://{match.group(1)}", process, log, err)
        pg = Node(str(state), node_id="docs-pg", store="memory", pg_listen="127.0.0.1:0")
        pg.start()
        pg.poll_once()
        assert pg.pg_address is not None
        yield Live(match.group(1), pg.pg_address[1], root, process, log, err, asked)
    finally:
        if pg is not None:
            pg.stop()
        stop_demo(process)  # already stopped when the last test ran
        held.close()


def fill_page_dir(directory: Path, live: Live | None) -> None:
    """Make ``directory`` a page's working directory afresh: whatever it held goes, then
    ``demo-state`` (a link to the live demo's, when there is one) and the input folders of
    :data:`tests.docs.blocks.INPUTS` come."""
    for entry in directory.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    if live is not None:
        os.symlink(live.root / "demo-state", directory / "demo-state")
    write_inputs(directory)


@pytest.fixture
def page_dir(live: Live, tmp_path: Path) -> Path:
    """A page's working directory of its own (see :func:`fill_page_dir`)."""
    fill_page_dir(tmp_path, live)
    return tmp_path
