"""Exactly-once: a writer killed between segment write and commit, and a writer killed right
after the commit, each restart and leave state equal to the batch ground truth, with each batch
committed once.

Both kill points are exercised on one state_dir, one after the other (two writer processes,
each a JVM start, instead of four): the first writer dies before the commit of batch 1, the
second re-runs batch 1 and dies after the commit of batch 2. What each crash leaves is checked
as in a run of that kill point alone. The restart that re-runs batch 2 as a no-op and finishes
is the same pipeline on the test session's own driver: a driver that never saw this state_dir
and knows of it only what is on disk, as a restarted process does, without a third JVM start.
"""

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
from tests.spark.writer_process import writer_app

# Starts JVMs or processes of its own: scheduled first (tests/conftest.py).
pytestmark = pytest.mark.slow

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


def assert_crashed_at(
    state: Path, point: str, batch: int, crashed: subprocess.CompletedProcess[str]
) -> None:
    """The writer died at ``point`` of ``batch``: its segments were written, and its commit
    record exists only when the point is after the commit."""
    assert crashed.returncode == 86, crashed.stderr[-2000:]
    segments = (state / "tables" / "totals" / "segments").glob(f"*/{batch:020d}.arrow")
    assert list(segments), f"the crash happened after the segments of batch {batch} were written"
    committed = list(range(batch + 1 if point == "after_commit" else batch))
    assert Changelog(str(state), "totals").committed_batch_ids() == committed


def restart_in_process(spark: Any, source: Path, state: Path) -> None:
    """The writer's pipeline restarted on ``spark`` (this process's session), run until every
    input file is processed."""
    app = writer_app(spark, str(source), str(state))
    app.start(local_node=False)
    try:
        app.process_all_available(timeout=300)
    finally:
        app.stop()


def test_writer_killed_at_commit_boundary_recovers_exactly(spark: Any, tmp_path: Path) -> None:
    source, state = tmp_path / "in", tmp_path / "state"
    source.mkdir()
    truth = write_input(source, files=4)
    changelog = Changelog(str(state), "totals")

    # Killed between the segments of batch 1 and its commit record: batch 1 is re-run.
    crashed = run_writer(source, state, crash_at="before_commit:totals:1")
    assert_crashed_at(state, "before_commit", 1, crashed)

    # Killed right after the commit record of batch 2: its re-run must be a no-op.
    crashed = run_writer(source, state, crash_at="after_commit:totals:2")
    assert_crashed_at(state, "after_commit", 2, crashed)
    commit_1, commit_2 = (Path(changelog.commit_path(b)).read_bytes() for b in (1, 2))

    restart_in_process(spark, source, state)
    assert changelog.committed_batch_ids() == [0, 1, 2, 3]
    assert Path(changelog.commit_path(1)).read_bytes() == commit_1
    assert Path(changelog.commit_path(2)).read_bytes() == commit_2  # the re-run wrote nothing
    assert replica_rows(state) == truth
