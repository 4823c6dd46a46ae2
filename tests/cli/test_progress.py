"""Progress on a terminal: a bar per restoring partition in ``sparkiq status --watch``, and a
spinner with the elapsed time while a long pull query runs (``sparkiq query`` and the shell,
where Ctrl-C cancels it); neither when piped."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sparkiq import Node
from sparkiq.sql.watchdog import statement_counts
from tests.changelog.helpers import make_table, write_batch
from tests.cli.slow_link import SlowLink
from tests.cli.terminal import Terminal
from tests.sql.planned import plan_ahead

needs_tmux = pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux (.ci/run)")


def write_status(local_dir: Path, partitions: list[dict[str, Any]]) -> None:
    """``status.json`` as a node writes it (``Hosting.write_status_file``), atomically."""
    local_dir.mkdir(parents=True, exist_ok=True)
    doc = {"node_id": "n0", "updated_at": time.time(), "partitions": partitions}
    (local_dir / "status.tmp").write_text(json.dumps(doc))
    os.replace(local_dir / "status.tmp", local_dir / "status.json")


def partition(p: int, state: str, batch: int, latest: int, rows: int, eta: float | None) -> Any:
    return {
        "table": "t",
        "partition": p,
        "state": state,
        "batch_id": batch,
        "latest_batch_id": latest,
        "lag_batches": latest - batch,
        "restored_rows": rows,
        "restored_bytes": rows * 40,
        "eta_seconds": eta,
        "error": None,
    }


@needs_tmux
def test_status_watch_draws_a_bar_per_restoring_partition(
    tmp_path: Path, terminal: Terminal
) -> None:
    state = tmp_path / "state"
    changelog = make_table(str(state), partitions=2)
    for b in range(3):
        write_batch(changelog, b, {"a": b})
    local = state / "replicas" / "n0"
    write_status(
        local,
        [
            partition(0, "restoring", 56, 199, 12345, 7.2),
            partition(1, "restoring", 0, 199, 40, None),
        ],
    )
    command = f"{shlex.quote(sys.executable)} -m sparkiq.cli status --watch 0.2"
    terminal.start(command, {"SPARKIQ_STATE_DIR": str(state)})
    screen = terminal.wait_for(lambda s: "restoring t[0]" in s and "Ctrl-C stops" in s)
    lines = screen.splitlines()
    bar0 = next(line for line in lines if line.startswith("restoring t[0]"))
    bar1 = next(line for line in lines if line.startswith("restoring t[1]"))
    # 57 of 200 batches: 28%, the words as status.json has them
    assert bar0.endswith(" 28% · batch 56/199 · 12,345 rows · ETA 8 s")
    assert bar1.endswith("  0% · batch 0/199 · 40 rows · ETA unknown")
    drawn = bar0[len("restoring t[0] ") :][:20]
    assert drawn.count("━") + drawn.count("╸") == 20
    assert drawn.index("╸") == 5  # 5.7 of 20 cells done: five whole, then a half
    assert "╸" not in bar1[len("restoring t[1] ") :][:20]
    assert "node 'n0' restoring" in screen

    # live again: the bars go at the next redraw, the table stays
    write_status(local, [partition(0, "live", 199, 199, 50000, None)])
    screen = terminal.wait_for(lambda s: "restoring t[" not in s and " live " in s)
    assert "node 'n0' restoring" not in screen
    terminal.keys("C-c")
    screen = terminal.wait_for(lambda s: "EXIT=" in s)
    assert "EXIT=0" in screen and "Traceback" not in screen


# A pull query the node answers at once (no key ends in "zz"): through the slow link, its
# answer takes ANSWER_DELAY seconds, three times the spinner's threshold of 1 s.
QUICK = "SELECT count(*) AS n FROM t WHERE k LIKE '%zz'"
ANSWER_DELAY = 3.0

# A statement that really runs on the node until it is stopped: a nested-loop join of three
# copies of the table on a string expression no join algorithm can use, 6,000 rows each (two
# hundred billion combinations): it would run into the node's 30 s statement timeout, so it
# is surely still running when Ctrl-C comes, however fast the machine is just then.
ENDLESS = "SELECT count(*) AS n FROM t a, t b, t c WHERE a.k || b.k || c.k LIKE '%k00000k%zz'"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    root = tmp_path_factory.mktemp("slow")
    changelog = make_table(str(root / "state"), partitions=2)
    write_batch(changelog, 0, {f"k{i:05d}": i for i in range(6000)})
    # DuckDB on one thread: ENDLESS holds one core until it is canceled, not both (the
    # suite's other workers need one)
    node = Node(str(root / "state"), node_id="q", listen="127.0.0.1:0", sql_limits={"threads": 1})
    node.start()
    try:
        node.poll_once()
        plan_ahead(node, ENDLESS)  # "one statement running" is then ENDLESS, not its bind
        yield node
    finally:
        node.stop()


@pytest.fixture
def slow_link(node: Node) -> Iterator[SlowLink]:
    """The node behind a link that delays its answers by ANSWER_DELAY seconds."""
    assert node.url is not None
    link = SlowLink(int(node.url.rsplit(":", 1)[1]), delay=ANSWER_DELAY)
    try:
        yield link
    finally:
        link.close()


@needs_tmux
def test_a_long_pull_query_shows_a_spinner_on_a_terminal(
    slow_link: SlowLink, terminal: Terminal
) -> None:
    command = (
        f"{shlex.quote(sys.executable)} -m sparkiq.cli query --url {slow_link.url} "
        f"{shlex.quote(QUICK)}"
    )
    started = time.monotonic()
    terminal.start(command, {})
    # Wait for the whole spinner line: tmux may capture the screen between two writes of it.
    screen = terminal.wait_for(lambda s: "(Ctrl-C stops)" in s or "EXIT=" in s)
    assert "running query: " in screen, screen  # seen while the query runs
    line = next(x for x in screen.splitlines() if "running query: " in x)
    seconds = float(line.split("running query: ")[1].split(" s")[0])
    assert 1.0 <= seconds <= time.monotonic() - started
    assert "(Ctrl-C stops)" in line
    screen = terminal.wait_for(lambda s: "EXIT=" in s, timeout=120)
    assert "EXIT=0" in screen
    assert "running query" not in screen  # erased when the answer came
    assert "-- 1 rows at position p1." in screen
    assert any(line.split() == ["│", "0", "│"] for line in screen.splitlines())  # the answer


def test_a_long_pull_query_piped_prints_no_progress(slow_link: SlowLink) -> None:
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "sparkiq.cli", "query", "--url", slow_link.url, "--csv", QUICK],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "n\n0\n"
    assert result.stderr.startswith("-- 1 rows at position p1.")
    assert result.stderr.count("\n") == 1 and "\x1b" not in result.stderr
    assert time.monotonic() - started >= ANSWER_DELAY  # long enough for a spinner


def _statements_settle(running: int, canceled: int, within: float = 120) -> None:
    """Until the node's DuckDB statements (the node runs in this process) are ``running``
    and ``canceled`` of them were interrupted because their caller left."""
    deadline = time.monotonic() + within
    while statement_counts()[0] != running or statement_counts()[1]["canceled"] != canceled:
        assert time.monotonic() < deadline, f"statements: {statement_counts()}"
        time.sleep(0.05)


@needs_tmux
def test_the_shell_shows_a_spinner_and_ctrl_c_cancels_the_query_on_the_node(
    slow_link: SlowLink, terminal: Terminal, tmp_path: Path
) -> None:
    # Through the link (a client far away: its Ctrl-C closes the node's connection through
    # it), without delay until the last query.
    slow_link.delay = 0.0
    command = f"{shlex.quote(sys.executable)} -m sparkiq.cli shell --url {slow_link.url}"
    terminal.start(command, {"SPARKIQ_HISTORY": str(tmp_path / "history")})
    terminal.wait_for(lambda s: "sparkiq>" in s, timeout=120)
    canceled = statement_counts()[1]["canceled"]

    terminal.type(ENDLESS + ";")
    terminal.keys("Enter")
    screen = terminal.wait_for(lambda s: "(Ctrl-C stops)" in s, timeout=120)
    assert "running query: " in screen
    _statements_settle(running=1, canceled=canceled)
    terminal.keys("C-c")
    screen = terminal.wait_for(lambda s: "canceled" in s, timeout=120)
    _statements_settle(running=0, canceled=canceled + 1)  # stopped on the node, not left on
    assert "running query" not in screen and "Traceback" not in screen

    # the shell goes on: a quick query, then a slow answer to its end, its spinner erased
    terminal.type("SELECT k FROM t WHERE k < 'k00003';")
    terminal.keys("Enter")
    terminal.wait_for(lambda s: "3 rows at position" in s, timeout=120)
    slow_link.delay = ANSWER_DELAY
    terminal.type(QUICK + ";")
    terminal.keys("Enter")
    screen = terminal.wait_for(lambda s: "1 row at position" in s, timeout=300)
    assert "running query" not in screen
    assert any(line.split() == ["│", "0", "│"] for line in screen.splitlines())
    assert statement_counts()[1]["canceled"] == canceled + 1
    terminal.type("\\q")
    terminal.keys("Enter")
    assert "EXIT=0" in terminal.wait_for(lambda s: "EXIT=" in s, timeout=60)
