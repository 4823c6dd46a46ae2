"""The live system the docs' samples run against: ``sparkiq demo`` (as ``make demo`` runs
it, on a free port, into a temporary state dir) and, beside it, a node on the same state with
the Postgres endpoint. Started once for the docs tests, stopped after the last of them."""

from __future__ import annotations

import os
import re
import shutil
import signal
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
    Postgres endpoint's port, and the directory holding ``demo-state``."""

    http: str
    pg_port: int
    root: Path

    @property
    def url(self) -> str:
        return f"http://{self.http}"


def _wait_until_served(url: str, process: subprocess.Popen[str], log: Path) -> None:
    """Until every demo table answers a query with at least one row. No deadline of its own:
    the demo gives up by itself when Spark serves no micro-batch in five minutes.

    The tables are asked only once the demo has printed its first summary of them (a line
    ``[HH:MM:SS] batch N | ...``: it read them through its node): three queries every half
    second over its start, which takes tens of seconds, cost the demo's node and this
    process CPU for nothing."""
    while not re.search(r"^\[[\d:]+\] batch ", log.read_text(), re.M):
        assert process.poll() is None, f"the demo stopped; its output:\n{log.read_text()}"
        time.sleep(0.5)
    while True:
        assert process.poll() is None, f"the demo stopped; its output:\n{log.read_text()}"
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


# Package scope: the demo streams three queries as long as it runs; kept for the whole
# session it went on taking CPU from every test its worker ran after the docs.
@pytest.fixture(scope="package")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    root = tmp_path_factory.mktemp("docs-live")
    state = root / "demo-state"
    command = [sys.executable, "-m", "sparkiq.cli", "demo", "--state-dir", str(state)]
    # A micro-batch every 20 s, not every second: the demo runs beside the docs tests that
    # read it, and at 1 s its three queries took half a core all along (a batch costs the
    # same CPU however few rows it holds; measured over a minute: 19 CPU-s at 5 s, 9 at
    # 10 s; its start and 90 s served: 44.6 and 41.7 CPU-s at 10 s, 31.1 and 36.5 at 20 s).
    # The samples need live tables, not fast ones; a push query waits up to one interval
    # for a change, and the first rows come one interval after the start.
    command += ["--listen", "127.0.0.1:0", "--rate", "50", "--trigger", "20"]
    log = root / "demo.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, text=True, cwd=root
        )
    pg = None
    try:
        while not log.read_text().endswith("\n"):  # its first line: the console's URL
            assert process.poll() is None, log.read_text()
            time.sleep(0.1)
        first = log.read_text().splitlines()[0]
        match = re.fullmatch(r"sparkiq console: http://(127\.0\.0\.1:\d+)/", first)
        assert match, first
        _wait_until_served(f"http://{match.group(1)}", process, log)
        pg = Node(str(state), node_id="docs-pg", store="memory", pg_listen="127.0.0.1:0")
        pg.start()
        pg.poll_once()
        assert pg.pg_address is not None
        yield Live(match.group(1), pg.pg_address[1], root)
    finally:
        if pg is not None:
            pg.stop()
        process.send_signal(signal.SIGINT)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


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
