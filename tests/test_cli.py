"""The command line, run as a user runs it: a real subprocess on a real state_dir."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sparkiq import Node
from tests.changelog.helpers import make_table, write_batch


def sparkiq(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sparkiq.cli", *args], capture_output=True, text=True, timeout=60
    )


def test_status_and_compact(tmp_path: Path) -> None:
    changelog = make_table(str(tmp_path), partitions=3)
    for batch_id in range(12):
        write_batch(changelog, batch_id, {f"k{i}": batch_id * i for i in range(30)})
    with Node(str(tmp_path), node_id="n1") as node:
        assert node.wait_for("t", 11, timeout=10)
        node.write_status_file()

    status = sparkiq("status", "--state-dir", str(tmp_path))
    assert status.returncode == 0, status.stderr
    lines = status.stdout.splitlines()
    assert lines[1].split()[:6] == ["t", "3", "k", "0..11", "11", "-"]
    assert "node 'n1'" in status.stdout
    assert sum(" live " in line for line in lines) == 3

    compact = sparkiq("compact", "--state-dir", str(tmp_path), "--retention", "0")
    assert compact.returncode == 0, compact.stderr
    assert "t: snapshot at batch 11, 30 rows; retention deleted" in compact.stdout
    after = sparkiq("status", "--state-dir", str(tmp_path)).stdout.splitlines()
    assert after[1].split()[:6] == ["t", "3", "k", "11..11", "11", "11"]


def test_status_of_an_empty_directory_fails_clearly(tmp_path: Path) -> None:
    result = sparkiq("status", "--state-dir", str(tmp_path))
    assert result.returncode == 1
    assert "no sparkiq tables" in result.stderr


def test_every_option_names_its_environment_variable() -> None:
    for command in ("demo", "status", "compact"):
        text = sparkiq(command, "--help").stdout
        assert "--state-dir" in text and "SPARKIQ_STATE_DIR" in text
