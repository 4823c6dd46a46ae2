"""``sparkiq shell`` driven for real: a terminal (tmux) runs it against a node on 127.0.0.1,
keys are typed into it and the rendered screen is read back."""

from __future__ import annotations

import os
import re
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
    write_rows(orders, 0, {"o1": {"order_id": "o1", "customer": "ann"}})
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
        # the change's row: "4000" alone also matches the node's URL above (port 40001)
        screen = terminal.wait_for(
            lambda s: any("|" in line and "4000" in line for line in s.splitlines())
        )
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


def test_shell_meta_commands_work_as_in_psql(tmp_path: Path, terminal: Terminal) -> None:
    state = tmp_path / "state"
    table = make_table(str(state), partitions=2)
    write_batch(table, 0, {"a": 1, "b": 22})
    with Node(str(state), node_id="sh", listen="127.0.0.1:0", poll_interval=0.05) as node:
        node.poll_once()
        assert node.url is not None
        command = f"{shlex.quote(sys.executable)} -m sparkiq.cli shell --url {node.url}"
        terminal.start(command, {"SPARKIQ_HISTORY": str(tmp_path / "history")})
        terminal.wait_for(lambda s: "sparkiq>" in s)

        def run(line: str, done: str) -> list[str]:
            """Type ``line``, wait for ``done``; the screen's lines after the command."""
            terminal.keys("C-l")  # a clear screen: only this command's output is read
            terminal.wait_for(lambda s: "sparkiq>" in s and "Time:" not in s)
            terminal.type(line)
            terminal.keys("Enter")
            screen = terminal.wait_for(lambda s: done in s)
            lines = screen.rstrip().splitlines()
            return lines[next(i for i, x in enumerate(lines) if line in x) + 1 :]

        # \d lists the tables; \d TABLE describes one: columns, types, key
        lines = run("\\d", "partitions")
        assert any(line.split("│")[1:3] == [" t     ", " k   "] for line in lines), lines
        lines = run("\\d t", "Key: (k); 2 partitions")
        assert 'Table "t"' in lines
        cells = [[c.strip() for c in x.strip().strip("│").split("│")] for x in lines if "│" in x]
        assert cells == [["k", "string", "key", ""], ["n", "long", "", ""]]
        assert any(
            x.split() == ["┃", "column", "┃", "type", "┃", "key", "┃", "window", "┃"] for x in lines
        ), lines
        lines = run("\\d nope", "ERROR")
        assert "ERROR no table named 'nope'" in lines[0]

        # \x: one block per row, as psql's expanded display
        assert run("\\x", "Expanded display is on.")[0] == "Expanded display is on."
        lines = run("SELECT k, n FROM t ORDER BY k;", "2 rows at position")
        assert lines[:6] == [
            "-[ RECORD 1 ]----",
            "k | a",
            "n | 1",
            "-[ RECORD 2 ]----",
            "k | b",
            "n | 22",
        ]
        assert run("\\x off", "Expanded display is off.")[0] == "Expanded display is off."

        # \timing prints each statement's time; \pset format csv prints CSV
        assert run("\\timing", "Timing is on.")[0] == "Timing is on."
        assert run("\\pset format csv", "Output format is csv.")[0] == "Output format is csv."
        lines = run("SELECT count(*), sum(n) FROM t;", "Time:")
        assert lines[:2] == ["count,sum", "2,23"]  # Postgres' column names
        assert re.fullmatch(r"Time: \d+\.\d{3} ms", lines[3]), lines
        lines = run("\\pset format xml", "allowed formats")
        assert lines[0] == "\\pset: allowed formats are aligned, csv, json"

        # an unknown meta-command is answered as unknown, not with the help
        lines = run("\\foo", "invalid command")
        assert lines[:2] == ["invalid command \\foo", "Try \\? for help."]
        assert "\\timing" in "\n".join(run("\\?", "\\pset format"))

        terminal.type("\\q")
        terminal.keys("Enter")
        screen = terminal.wait_for(lambda s: "EXIT=" in s)
        assert "EXIT=0" in screen and "Traceback" not in screen
