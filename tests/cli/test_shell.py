"""``sparkiq shell`` driven for real: a terminal (tmux) runs it against a node on 127.0.0.1,
keys are typed into it and the rendered screen is read back."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sparkiq import Node
from tests.changelog.helpers import create_changelog, make_table, write_batch, write_rows
from tests.cli.terminal import Terminal

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux (.ci/run)")

ORDERS_SCHEMA = {
    "type": "struct",
    "fields": [
        {"name": "order_id", "type": "string", "nullable": True, "metadata": {}},
        {"name": "customer", "type": "string", "nullable": True, "metadata": {}},
    ],
}


def test_shell_runs_queries_completes_names_shows_errors_and_exits(
    tmp_path: Path, terminal: Terminal
) -> None:
    state = tmp_path / "state"
    table = make_table(str(state), partitions=2)
    write_batch(table, 0, {"a": 1, "b": 22, "c": 333})
    orders = create_changelog(str(state), "orders_by_customer", ORDERS_SCHEMA, ["order_id"])
    write_rows(orders, 0, {"o1": {"order_id": "o1", "customer": "ann"}}, None)
    history = tmp_path / "history"
    with Node(
        str(state), node_id="sh", listen="127.0.0.1:0", token="tok", poll_interval=0.05
    ) as node:
        node.poll_once()
        assert node.url is not None
        command = f"{shlex.quote(sys.executable)} -m sparkiq.cli shell --url {node.url}"
        terminal.start(command, {"SPARKIQ_TOKEN": "tok", "SPARKIQ_HISTORY": str(history)})
        terminal.wait_for(lambda s: "sparkiq>" in s)
        assert "connected to " + node.url + "; 2 tables." in terminal.screen()

        # a statement over two lines: Enter before the ';' continues it
        terminal.type("SELECT k, n FROM t")
        terminal.keys("Enter")
        terminal.type("ORDER BY k;")
        terminal.keys("Enter")
        screen = terminal.wait_for(lambda s: "3 rows at position p1." in s)
        rows = [
            [cell.strip() for cell in line.strip().strip("│").split("│")]
            for line in screen.splitlines()
            if line.startswith("│")
        ]
        assert rows == [["a", "1"], ["b", "22"], ["c", "333"]]
        assert "      -> ORDER BY k;" in screen

        # Tab completes a table name from its prefix, then a column name
        terminal.type("SELECT customer FROM orders_by")
        terminal.keys("Tab")
        terminal.wait_for(lambda s: "FROM orders_by_customer" in s)
        terminal.type(" WHERE order_i")
        terminal.keys("Tab")
        terminal.wait_for(lambda s: "WHERE order_id" in s)
        terminal.type(" = 'o1';")
        terminal.keys("Enter")
        screen = terminal.wait_for(lambda s: "1 row at position" in s)
        assert "│ ann      │" in screen

        # a push query prints changes as batches commit; Ctrl-C returns to the prompt
        terminal.type("SELECT k, n FROM t WHERE n > 100 EMIT CHANGES;")
        terminal.keys("Enter")
        terminal.wait_for(lambda s: "streaming changes; Ctrl-C stops" in s)
        write_batch(table, 1, {"d": 4000, "e": 5})
        screen = terminal.wait_for(lambda s: "4000" in s)
        changes = [line.split("|") for line in screen.splitlines() if "|" in line]
        assert [c.strip() for c in changes[0]] == ["batch", "k", "n"]
        assert [[c.strip() for c in change] for change in changes[1:]] == [["1", "d", "4000"]]
        terminal.keys("C-c")
        terminal.wait_for(lambda s: s.rstrip().endswith("sparkiq>"))

        # an error as the API gives it, with its caret; the shell goes on
        terminal.type("SELECT nope FROM t;")
        terminal.keys("Enter")
        screen = terminal.wait_for(lambda s: "ERROR unknown column 'nope'" in s)
        lines = screen.splitlines()
        at = next(i for i, line in enumerate(lines) if line.startswith("ERROR unknown column"))
        assert lines[at + 1 : at + 3] == ["SELECT nope FROM t", "       ^"]

        terminal.type("\\q")
        terminal.keys("Enter")
        screen = terminal.wait_for(lambda s: "EXIT=" in s)
        assert "EXIT=0" in screen and "Traceback" not in screen

    saved = history.read_text()
    assert "SELECT k, n FROM t\n+ORDER BY k;" in saved
    assert "SELECT nope FROM t;" in saved


def test_shell_says_how_to_reach_a_node(tmp_path: Path) -> None:
    from tests.cluster.serve_processes import free_port

    url = f"http://127.0.0.1:{free_port()}"
    result = subprocess.run(
        [sys.executable, "-m", "sparkiq.cli", "shell", "--url", url],
        capture_output=True,
        text=True,
        timeout=60,
        env=os.environ | {"SPARKIQ_HISTORY": str(tmp_path / "h")},
    )
    assert result.returncode == 2
    assert result.stderr == (
        f"sparkiq shell: cannot reach {url}: is `sparkiq serve` running? set --url or SPARKIQ_URL\n"
    )
