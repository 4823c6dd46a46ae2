"""Exactly-once: a writer killed between segment write and commit, or right after the commit,
restarts and leaves state equal to the batch ground truth, with each batch committed once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sparkiq import Node
from sparkiq.changelog import Changelog
from sparkiq.spark.sink import CRASH_ENV

ROOT = Path(__file__).resolve().parents[2]


def run_writer(
    source: Path, state: Path, crash_at: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != CRASH_ENV}
    if crash_at:
        env[CRASH_ENV] = crash_at
    return subprocess.run(
        [sys.executable, "-m", "tests.spark.writer_process", str(source), str(state)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def write_input(source: Path, files: int) -> dict[str, dict[str, Any]]:
    truth: dict[str, dict[str, Any]] = {}
    for f in range(files):
        lines = []
        for i in range(60):
            key, value = f"k{(i * 7 + f) % 25}", i + f * 100
            lines.append(json.dumps({"k": key, "v": value}))
            row = truth.setdefault(key, {"k": key, "total": 0, "n": 0})
            row["total"] += value
            row["n"] += 1
        (source / f"{f:03d}.json").write_text("\n".join(lines) + "\n")
    return truth


def replica_rows(state: Path) -> dict[str, dict[str, Any]]:
    with Node(str(state), store="memory") as node:
        node.poll_once()
        return {k: node.get("totals", k) for k in (f"k{i}" for i in range(25))}  # type: ignore[misc]


@pytest.mark.parametrize("point", ["before_commit", "after_commit"])
def test_writer_killed_at_commit_boundary_recovers_exactly(tmp_path: Path, point: str) -> None:
    source, state = tmp_path / "in", tmp_path / "state"
    source.mkdir()
    truth = write_input(source, files=3)

    crashed = run_writer(source, state, crash_at=f"{point}:totals:1")
    assert crashed.returncode == 86, crashed.stderr[-2000:]
    changelog = Changelog(str(state), "totals")
    segments_of_1 = list(
        (state / "tables" / "totals" / "segments").glob("*/00000000000000000001.arrow")
    )
    assert segments_of_1, "the crash happened after the segments of batch 1 were written"
    if point == "before_commit":
        assert changelog.committed_batch_ids() == [0]
    else:
        assert changelog.committed_batch_ids() == [0, 1]
        commit_1 = Path(changelog.commit_path(1)).read_bytes()

    finished = run_writer(source, state)
    assert finished.returncode == 0, finished.stderr[-2000:]
    assert changelog.committed_batch_ids() == [0, 1, 2]
    if point == "after_commit":  # the re-run of batch 1 was a no-op
        assert Path(changelog.commit_path(1)).read_bytes() == commit_1
    assert replica_rows(state) == truth
