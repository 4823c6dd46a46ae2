"""Follower tail latency: from a batch's commit to a follower in another process seeing it.

A table (8 partitions, 20,000 keys) is written by hand in this process: a few warm-up
batches, then, per reader, 30 committed batches (``--quick``: 15) of 1,000 changed rows
plus the row ``("probe", n=<batch id>)``, spaced by random pauses of 70-130 ms so commits
fall anywhere within the reader's poll interval. The reader runs in its own process
(``bench/_tail_observer.py``), restores the table, then spins every 0.5 ms on the batch
every followed partition has applied, and prints the wall-clock time it first saw each
batch, with the probe row read right then (checked: it holds that batch or a later one, and
only the projected columns).

Latency of a batch = seen - the commit record's ``committed_at`` (same wall clock). Readers:

* ``sparkiq.follow(state_dir, table)`` at its default poll interval;
* the same with a ``where=`` filter (about half the rows) and a ``columns=`` projection;
* ``sparkiq.follow`` polling every 20 ms, if its default differs, to compare like with like;
* baseline, measured in the same run: a plain :class:`sparkiq.Node` in another process,
  polling every 20 ms (what ``bench.freshness`` calls the external node). Without
  ``sparkiq.follow`` only this one runs, and the report says so.

A poller waits for its next poll, on average half its interval, so p50 is expected near
half the poll interval plus the commit record's write and the apply; the commit record's
write (``committed_at`` until the record is visible) is shown as the floor. What a reader
adds beyond that wait is estimated from the mean (the wait's mean is known, half the
interval; a p50 of 30 such waits moves by several ms from run to run).

Run: ``python -m bench.follower_tail [--quick | --smoke]``.
"""

from __future__ import annotations

import inspect
import json
import os
import queue
import random
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

import sparkiq
from bench._changelog import as_arrow, key_name, open_table
from bench._common import Report, Scale, entry_point, percentile, scratch_dir

TABLE = "tail"
PROBE = "probe"
KEYSPACE = 20_000
ROWS = 1_000
WARMUP_BATCHES = 3
PAUSE_S = (0.07, 0.13)
READY_TIMEOUT_S = 120.0
SEEN_TIMEOUT_S = 30.0
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASELINE = "Node, another process"
NODE_POLL_S = 0.02  # sparkiq.Node's default poll interval


@dataclass(frozen=True)
class Reader:
    label: str
    mode: str  # a mode of bench._tail_observer
    subset: bool = False
    poll_interval: float | None = None  # None: the API's default


@dataclass
class Run:
    reader: Reader
    poll_interval: float
    latency_ms: list[float]
    write_ms: list[float]


class _Writer:
    """Writes the benchmark's batches; the probe row carries the batch id."""

    def __init__(self, state_dir: str) -> None:
        self.table = open_table(state_dir, TABLE)
        self.rng = random.Random(23)
        self.names = [key_name(i) for i in range(KEYSPACE)]
        self.next_id = 0

    def write(self, rows: int) -> tuple[int, float, float]:
        """Commit one batch; return its id, ``committed_at`` and when the write returned."""
        batch_id, self.next_id = self.next_id, self.next_id + 1
        keys = [self.names[i] for i in self.rng.sample(range(KEYSPACE), rows)] + [PROBE]
        ns = [self.rng.randrange(1, 1_000_000) for _ in range(rows)] + [batch_id]
        totals = [self.rng.random() * 1e6 for _ in keys]
        record = self.table.write(as_arrow(keys, ns, totals), batch_id=batch_id)
        return batch_id, record.committed_at, time.time()


def _readers() -> tuple[list[Reader], list[str]]:
    notes = []
    readers = [Reader(BASELINE, "node")]
    if not hasattr(sparkiq, "follow"):
        notes.append(
            "`sparkiq.follow` does not exist in this checkout: only a plain `sparkiq.Node` in "
            "another process was measured"
        )
        return readers, notes
    params = inspect.signature(sparkiq.follow).parameters
    follows = [Reader("follow", "follow")]
    if "where" in params and "columns" in params:
        follows.append(Reader("follow, where= + columns=", "follow-subset", subset=True))
    else:
        notes.append("`sparkiq.follow` takes no `where=`/`columns=`: the subset was not measured")
    poll = params.get("poll_interval")
    if poll is not None and poll.default != NODE_POLL_S:  # also at the Node's interval
        follows.append(
            Reader(f"follow, {NODE_POLL_S * 1000:.0f} ms poll", "follow", False, NODE_POLL_S)
        )
    return [*follows, *readers], notes


def _read_lines(stream: Any, lines: queue.Queue[dict[str, Any]]) -> None:
    for line in stream:
        line = line.strip()
        if line:
            lines.put(json.loads(line))


def _measure(
    writer: _Writer, reader: Reader, state_dir: str, local_dir: str, steps: int, rows: int
) -> Run:
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bench._tail_observer",
            reader.mode,
            state_dir,
            local_dir,
            TABLE,
            *([] if reader.poll_interval is None else [str(reader.poll_interval)]),
        ],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[dict[str, Any]] = queue.Queue()
    threading.Thread(target=_read_lines, args=(child.stdout, lines), daemon=True).start()

    def next_line(deadline: float) -> dict[str, Any]:
        while True:
            try:
                return lines.get(timeout=0.05)
            except queue.Empty:
                if child.poll() is not None and lines.empty():
                    raise RuntimeError(
                        f"{reader.label}: the reader exited ({child.returncode})"
                    ) from None
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{reader.label}: the reader did not answer in time"
                    ) from None

    try:
        ready = next_line(time.monotonic() + READY_TIMEOUT_S)
        assert ready.get("ready"), ready
        committed: dict[int, float] = {}
        write_ms: list[float] = []
        for _ in range(steps):
            time.sleep(writer.rng.uniform(*PAUSE_S))
            batch_id, committed_at, written = writer.write(rows)
            committed[batch_id] = committed_at
            write_ms.append((written - committed_at) * 1000)
        seen: dict[int, dict[str, Any]] = {}
        deadline = time.monotonic() + SEEN_TIMEOUT_S
        while not set(committed) <= set(seen):
            doc = next_line(deadline)
            seen[doc["batch"]] = doc
    finally:
        assert child.stdin is not None
        child.stdin.close()  # asks the reader to stop and close its replicas
        try:
            child.wait(30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
    columns = ["k", "n"] if reader.subset else ["k", "n", "total"]
    for batch_id in committed:
        doc = seen[batch_id]
        if doc["probe"] is None or doc["probe"] < batch_id or doc["columns"] != columns:
            raise RuntimeError(
                f"{reader.label}: when batch {batch_id} was visible, the probe row was "
                f"n={doc['probe']} with columns {doc['columns']} (expected n >= {batch_id}, "
                f"columns {columns})"
            )
    latency = [(seen[b]["seen"] - committed[b]) * 1000 for b in sorted(committed)]
    return Run(reader, float(ready["poll_interval"]), latency, write_ms)


def run(scale: Scale = Scale.FULL) -> Report:
    steps = scale.pick(30, 15, 2)
    rows, warmup_rows = scale.pick((ROWS, KEYSPACE // 2), (ROWS, KEYSPACE // 2), (100, 500))
    readers, notes = _readers()
    report = Report(
        name="follower_tail",
        title="Follower tail latency: commit to follower-visible",
        measures=(
            f"per committed batch ({steps} per reader, {rows:,} changed rows each, 70-130 ms "
            "apart), the time from the commit record's `committed_at` until a reader in "
            "another process sees every followed partition at that batch"
        ),
        baseline=(
            "a plain `sparkiq.Node` in another process (polls every 20 ms), on the same "
            "table in the same run; floor: the commit record's own write (fsync, rename)"
        ),
        target="p50 about half the poll interval plus the commit write and one apply",
        columns=[
            "reader",
            "poll ms",
            "batches",
            "p50 ms",
            "p90 ms",
            "max ms",
            "mean ms",
            "reader adds ms",
            "p50 vs Node",
        ],
        scale=scale,
    )
    runs: list[Run] = []
    with scratch_dir("follower-tail") as root:
        state_dir = os.path.join(root, "state")
        writer = _Writer(state_dir)
        for _ in range(WARMUP_BATCHES):
            writer.write(warmup_rows)
        for index, reader in enumerate(readers):
            local_dir = os.path.join(root, f"local-{index}")
            runs.append(_measure(writer, reader, state_dir, local_dir, steps, rows))

    by_label = {r.reader.label: r for r in runs}
    base_p50 = percentile(by_label[BASELINE].latency_ms, 50)
    write_ms = [ms for r in runs for ms in r.write_ms]
    floor = statistics.fmean(write_ms)

    def beyond(r: Run) -> float:
        """Mean latency minus the mean wait for the next poll (half the interval) and the
        commit write: what the reader's poll, read and apply add (the mean, not p50, since
        the wait is uniform and its mean is known)."""
        return statistics.fmean(r.latency_ms) - r.poll_interval * 1000 / 2 - floor

    report.rows.append(
        [
            "commit record written (floor)",
            "-",
            str(len(write_ms)),
            f"{percentile(write_ms, 50):.1f}",
            f"{percentile(write_ms, 90):.1f}",
            f"{max(write_ms):.1f}",
            f"{floor:.1f}",
            "-",
            "-",
        ]
    )
    for r in runs:
        p50 = percentile(r.latency_ms, 50)
        report.rows.append(
            [
                r.reader.label,
                f"{r.poll_interval * 1000:.0f}",
                str(len(r.latency_ms)),
                f"{p50:.1f}",
                f"{percentile(r.latency_ms, 90):.1f}",
                f"{max(r.latency_ms):.1f}",
                f"{statistics.fmean(r.latency_ms):.1f}",
                f"{beyond(r):+.1f}",
                "1.0x (baseline)" if r.reader.label == BASELINE else f"{p50 / base_p50:.2f}x",
            ]
        )
    for r in runs:
        p50 = percentile(r.latency_ms, 50)
        interval = r.poll_interval * 1000
        report.readings.append(
            f"{r.reader.label}: p50 {p50:.1f} ms, p90 {percentile(r.latency_ms, 90):.1f} ms "
            f"with a {interval:.0f} ms poll interval (expected p50 about "
            f"{floor + interval / 2:.0f} ms: half the interval + the commit write; the reader "
            f"adds {beyond(r):.1f} ms on average)"
            + ("" if r.reader.label == BASELINE else f"; {p50 / base_p50:.2f}x the Node's p50")
            + "."
        )
    report.notes = [
        *notes,
        "reader adds ms = mean latency - half the poll interval (the mean wait for the next "
        "poll) - the mean commit write: the reader's poll, segment reads, apply and the "
        "scheduling of its process",
        "readers spin every 0.5 ms on the applied batch, so up to ~0.5 ms of each figure is "
        "their own sampling; each reader's probe row was checked at every batch",
    ]
    report.figures = {
        "latency_ms": {r.reader.label: r.latency_ms for r in runs},
        "p50_ms": {r.reader.label: percentile(r.latency_ms, 50) for r in runs},
        "p90_ms": {r.reader.label: percentile(r.latency_ms, 90) for r in runs},
        "poll_interval_s": {r.reader.label: r.poll_interval for r in runs},
        "commit_write_ms": floor,
        "beyond_wait_ms": {r.reader.label: beyond(r) for r in runs},
        "follow_available": hasattr(sparkiq, "follow"),
    }
    return report


main = entry_point(run, __doc__)

if __name__ == "__main__":
    main()
