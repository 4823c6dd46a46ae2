"""``sparkiq status`` tells a running node from a stopped or a silent one, and its ``rows``
column is the rows each partition holds (not what the node applied since it opened)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

from sparkiq import Node
from sparkiq.status_report import STALE_STATUS_SECONDS
from sparkiq.testing import write_table

ROOT = Path(__file__).resolve().parents[2]


def status(state_dir: Path) -> str:
    command = [sys.executable, "-m", "sparkiq.cli", "status", "--state-dir", str(state_dir)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def node_rows(text: str) -> list[list[str]]:
    """The partition lines under the node's header line, split into their columns."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["table", "part"])
    return [line.split() for line in lines[start + 1 :] if line.startswith("  t ")]


def test_a_stopped_node_and_a_silent_one_are_not_shown_live(tmp_path: Path) -> None:
    rows = [{"k": f"k{i:02d}", "n": i} for i in range(40)]
    table = write_table(str(tmp_path), "t", rows, key="k", partitions=2)
    table.write([{"k": "k01", "n": 100}, {"k": "k02", "n": 200}])  # overwrites: 40 rows still
    with Node(str(tmp_path), node_id="n1") as node:
        assert node.wait_for("t", 1, timeout=60)
        node.write_status_file()
        running = status(tmp_path)
        held = len(node.sql("SELECT k FROM t").rows)
    assert "node 'n1'" in running and ", updated " in running
    shown = node_rows(running)
    assert [r[2] for r in shown] == ["live", "live"]
    # rows: what each partition holds (40 in all, the two overwrites not counted twice)
    assert sum(int(r[5]) for r in shown) == 40 == held

    stopped = status(tmp_path)  # the node closed: its last status says so
    assert "node 'n1'" in stopped and ": STOPPED " in stopped and " s ago" in stopped
    assert [r[2] for r in node_rows(stopped)] == ["stopped", "stopped"]

    # a node killed without a last word: its status grows old
    doc_path = tmp_path / "replicas" / "n1" / "status.json"
    doc = json.loads(doc_path.read_text())
    del doc["stopped_at"]
    doc["updated_at"] = time.time() - STALE_STATUS_SECONDS - 60
    doc_path.write_text(json.dumps(doc))
    silent = status(tmp_path)
    assert ": NOT UPDATED for " in silent and "killed, paused" in silent
    assert [r[2] for r in node_rows(silent)] == ["stale", "stale"]


def test_writers_at_once_never_leave_a_status_file_a_reader_cannot_read(tmp_path: Path) -> None:
    """The tailer, a restore's progress and a caller may write ``status.json`` at the same
    moment: the file a reader finds is always one whole document."""
    write_table(str(tmp_path), "t", [{"k": f"k{i}", "n": i} for i in range(20)], key="k")
    unreadable: list[str] = []
    with Node(str(tmp_path), node_id="n1") as node:
        assert node.wait_for("t", 0, timeout=60)
        node.write_status_file()
        doc_path = tmp_path / "replicas" / "n1" / "status.json"
        writing = True

        def read() -> None:  # once written, the file is replaced whole, never removed
            while writing:
                try:
                    json.loads(doc_path.read_text())
                except (OSError, ValueError) as error:
                    unreadable.append(repr(error))

        def write() -> None:
            for _ in range(300):
                node.write_status_file()

        reader = threading.Thread(target=read)
        writers = [threading.Thread(target=write) for _ in range(3)]
        reader.start()
        for thread in writers:
            thread.start()
        for thread in writers:
            thread.join()
        writing = False
        reader.join()
    assert unreadable == []
