"""A follower process killed (SIGKILL) 20 times at random moments, during its restore and
while tailing a changelog that keeps growing, always recovers: restarted on the same
local_dir, it ends in exactly the state and position of a fresh follower."""

from __future__ import annotations

import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from sparkiq.changelog import Changelog
from tests import forked_python
from tests.changelog.helpers import apply_changes, make_wide_table, write_rows
from tests.cluster import follower_process
from tests.cluster.test_follower import random_row, restrict

ROOT = Path(__file__).resolve().parents[2]
KEYS = [f"key{i:04d}" for i in range(1500)]
INITIAL_BATCHES = 300
KILLS = 20
#: Batches the owner commits for each follower run, 30 ms apart, from the run's start: the
#: changelog keeps growing while each follower restores and tails, but by an amount that does
#: not depend on how slow the machine is (paced by time alone, a run at load 25 wrote 2,250
#: batches and the fresh follower's restore of them outlasted its bound).
BATCHES_PER_RUN = 40


def changes_of(rng: random.Random, batch_id: int) -> dict[str, Any]:
    if batch_id == 0:
        return {k: random_row(rng, k) for k in KEYS}
    changes: dict[str, Any] = {k: random_row(rng, k) for k in rng.sample(KEYS, 120)}
    changes.update(dict.fromkeys(rng.sample(KEYS, 15)))
    return changes


class Run:
    """One follower process and the progress lines it printed (``at <batch> <head>``)."""

    def __init__(self, *args: object) -> None:
        self.proc = forked_python.popen(
            [sys.executable, "-m", "tests.cluster.follower_process", *map(str, args)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[tuple[int, int] | None] = queue.Queue()
        self.first: int | None = None
        self.last: tuple[int, int] | None = None
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            _, batch, head = line.split()
            self.lines.put((int(batch), int(head)))
        self.lines.put(None)

    def wait_until(self, done: Any, timeout: float = 30.0) -> None:
        """Consume progress lines until ``done(batch, head)`` holds."""
        deadline = time.monotonic() + timeout
        while True:
            item = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            assert item is not None, self.proc.stderr.read() if self.proc.stderr else ""
            self.last = item
            if self.first is None:
                self.first = item[0]
            if done(*item):
                return

    def kill(self) -> tuple[int, int] | None:
        """SIGKILL the process; return the last progress it reported before dying."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.reader.join()
        while (item := self.lines.get()) is not None:
            self.last = item
        assert self.proc.stderr is not None
        self.proc.stderr.close()
        return self.last


def kill_at_random(run: Run, kill: int, rng: random.Random) -> str:
    """Wait for a random moment of the given kind in the run's life; return its kind."""
    if kill == 0:  # anywhere in start-up: imports, opening stores, the marker
        time.sleep(rng.uniform(0.0, 0.8))
        return "start-up"
    if kill <= KILLS // 2:  # part-way through applying the backlog
        fraction = rng.uniform(0.05, 0.3)

        def far_enough(batch: int, head: int) -> bool:
            assert run.first is not None
            return batch >= run.first + fraction * (head - run.first)

        run.wait_until(far_enough)
        return "restore"
    run.wait_until(lambda batch, head: batch >= head)  # caught up, then tailing new batches
    time.sleep(rng.uniform(0.0, 0.3))
    return "tailing"


def test_a_follower_killed_at_random_points_recovers_to_a_fresh_followers_state(
    tmp_path: Path,
) -> None:
    rng = random.Random(574)
    state, local, out = tmp_path / "state", tmp_path / "local", tmp_path / "out.json"
    changelog = make_wide_table(str(state))
    history = [changes_of(rng, b) for b in range(INITIAL_BATCHES)]
    for batch_id, changes in enumerate(history):
        write_rows(changelog, batch_id, changes)

    stop_writing = threading.Event()
    budget = threading.Semaphore(0)  # batches the owner may still commit

    def keep_writing() -> None:  # the owner keeps committing while the follower is killed
        writer_rng = random.Random(575)
        while not stop_writing.wait(0.03):
            if not budget.acquire(blocking=False):
                continue
            changes = changes_of(writer_rng, len(history))
            write_rows(Changelog(str(state), "w"), len(history), changes)
            history.append(changes)

    writer = threading.Thread(target=keep_writing)
    writer.start()
    reported: list[tuple[str, tuple[int, int] | None]] = []
    try:
        for kill in range(KILLS):
            for _ in range(BATCHES_PER_RUN):
                budget.release()
            run = Run(state, local, 10**9, out)
            try:
                phase = kill_at_random(run, kill, rng)
            finally:
                last = run.kill()
            reported.append((phase, last))
    finally:
        stop_writing.set()
        writer.join()

    during_restore = [r for p, r in reported if r is not None and r[0] < r[1]]
    during_tailing = [r for p, r in reported if p == "tailing" and r is not None and r[0] >= r[1]]
    assert len(during_restore) >= 5, reported
    assert len(during_tailing) >= 5, reported

    final = len(history) - 1
    finished = Run(state, local, final, out)
    assert finished.proc.wait(timeout=60) == 0, finished.proc.stderr.read()  # type: ignore[union-attr]
    resumed = json.loads(out.read_text())

    with follower_process.follow(str(state), str(tmp_path / "fresh")) as fresh:
        assert fresh.wait_for(final, timeout=60)
        expected = follower_process.dump(fresh)
        followed = [k for k in KEYS if fresh.partition_for_key(k) in follower_process.PARTITIONS]
    assert resumed["batch"] == expected["batch"] == final
    assert resumed["position"] == expected["position"]
    assert resumed["rows"] == expected["rows"]

    # And both equal the owner's table restricted to the subset.
    truth = apply_changes(history)
    restricted = {
        k: restrict(truth.get(k), follower_process.keep, follower_process.COLUMNS) for k in followed
    }
    as_json = json.loads(json.dumps(restricted, default=str, sort_keys=True))
    assert expected["rows"] == {k: r for k, r in as_json.items() if r is not None}
    assert 100 < len(expected["rows"]) < len(followed)  # a real subset
    assert sorted(os.listdir(local / "w")) == [
        "00000",
        "00001",
        "00003",
        "follower.json",
        "replica.json",
    ]
