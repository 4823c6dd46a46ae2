"""Freshness: time from a batch's commit to the new value being queryable.

A :class:`sparkiq.App` materializes ``groupBy("k").agg(max(v))`` over a file source. Each
step adds one file (1,000 rows plus the row ``("probe", i)``), so micro-batch ``i`` moves
the probe key's value to ``i``. Two readers watch the probe key:

* the App's local node, in the same process: the App's commit watcher notifies it when it
  sees the commit record (the embedded path); a thread calls ``app.get`` every 0.5 ms;
* an external :class:`~sparkiq.Node` over the same ``state_dir`` in another process, with
  its own replicas, tailing the changelog at its default poll interval (the writer/server
  split); it calls ``node.get`` every 0.5 ms and reports when the value changes.

Freshness of a batch = when a reader first returned its value - the commit record's
``committed_at`` (both from the same wall clock). Steps are spaced by a random pause, so
commits fall anywhere within the external node's poll interval.

Run: ``python -m bench.freshness [--quick | --smoke]``.
"""

from __future__ import annotations

import os
import queue
import random
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from bench._common import (
    Report,
    Scale,
    cli,
    percentile,
    scratch_dir,
    spark_session,
    verdict,
    write_json_rows,
)
from sparkiq import App, Node
from sparkiq.changelog import Changelog

TABLE = "fresh"
PROBE = "probe"
TARGET_MS = 50.0
SPIN_S = 0.0005
STEP_TIMEOUT_S = 120.0


def _watch(get: Any, stop: threading.Event, seen: dict[int, float]) -> None:
    """Record the wall-clock time each new value of the probe key is first returned."""
    last = None
    while not stop.is_set():
        row = get(TABLE, PROBE)
        now = time.time()
        value = None if row is None else row["v"]
        if value != last and value is not None:
            seen.setdefault(int(value), now)
            last = value
        time.sleep(SPIN_S)


def observe(state_dir: str) -> None:
    """The external reader (run in its own process): print ``<value> <unix time>`` lines
    whenever the probe key's value changes; stop when stdin closes."""
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    node = Node(state_dir, node_id="external").start()
    print("ready", flush=True)
    last = None
    try:
        while not stop.is_set():
            row = node.get(TABLE, PROBE)
            now = time.time()
            value = None if row is None else row["v"]
            if value != last and value is not None:
                last = value
                print(f"{value} {now:.6f}", flush=True)
            time.sleep(SPIN_S)
    finally:
        node.stop()


def _read_lines(stream: Any, lines: queue.Queue[str]) -> None:
    for line in stream:
        lines.put(line.strip())


def run(scale: Scale = Scale.FULL, spark: Any = None) -> Report:
    """``spark``: the session to run on (default: the local one of :func:`spark_session`)."""
    from pyspark.sql import functions as F

    steps = scale.pick(20, 8, 1)
    rows = scale.pick(1_000, 1_000, 100)
    report = Report(
        name="freshness",
        title="Freshness: commit to queryable",
        measures=(
            "per micro-batch, the time from its commit record's `committed_at` to the first "
            f"read returning its value, over {steps} batches (one {rows + 1:,}-row file each, "
            "random pauses between them)"
        ),
        baseline=(
            "the floor any reader can reach: the commit record's own write (fsync, rename), "
            "from `committed_at` until the record is visible, measured on the same batches"
        ),
        target=f"p50 <= {TARGET_MS:.0f} ms",
        columns=["reader", "interval", "batches", "p50 ms", "p90 ms", "max ms"],
        scale=scale,
    )
    spark = spark if spark is not None else spark_session()
    rng = random.Random(13)
    with scratch_dir("freshness") as root:
        source = os.path.join(root, "in")
        os.makedirs(source)
        state_dir = os.path.join(root, "state")

        def add_file(index: int) -> None:
            drawn = [(f"key-{rng.randrange(5_000):05d}", rng.randrange(1000)) for _ in range(rows)]
            write_json_rows(source, index, [*drawn, (PROBE, index)])

        add_file(0)  # warm-up batch
        df = spark.readStream.schema("k string, v long").json(source)
        app = App(spark, state_dir=state_dir, name="bench")
        app.materialize(TABLE, df.groupBy("k").agg(F.max("v").alias("v")), key="k", partitions=8)
        app.start()
        # Hook the local node's notification, which the App's commit watcher sends when it
        # sees a new commit record in the changelog (it polls every poll_interval), to learn
        # when each commit record became visible to the driver.
        table = app.tables[TABLE]
        node = app.node
        assert node is not None
        visible_at: dict[int, float] = {}
        notify = node.notify

        def on_notify(name: str | None = None) -> None:
            visible_at.setdefault(table.committed_batch_id, time.time())
            notify(name)

        node.notify = on_notify  # type: ignore[method-assign,assignment]
        local_seen: dict[int, float] = {}
        stop = threading.Event()
        external = subprocess.Popen(
            [sys.executable, "-m", "bench.freshness", "--observe", state_dir],
            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        lines: queue.Queue[str] = queue.Queue()
        reader = threading.Thread(target=_read_lines, args=(external.stdout, lines), daemon=True)
        reader.start()
        external_seen: dict[int, float] = {}
        watcher = threading.Thread(target=_watch, args=(app.get, stop, local_seen), daemon=True)
        try:
            app.process_all_available()
            watcher.start()

            def drain() -> None:
                while True:
                    try:
                        line = lines.get_nowait()
                    except queue.Empty:
                        return
                    if line != "ready":
                        value, at = line.split()
                        external_seen.setdefault(int(value), float(at))

            deadline = time.monotonic() + STEP_TIMEOUT_S
            while 0 not in external_seen:  # the external node is up and caught up
                if external.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the external node did not start")
                drain()
                time.sleep(0.01)

            batch_of: dict[int, int] = {}
            for index in range(1, steps + 1):
                time.sleep(rng.uniform(0.2, 0.5))
                add_file(index)
                deadline = time.monotonic() + STEP_TIMEOUT_S
                while index not in local_seen or index not in external_seen:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"value {index} was not seen by both readers in time")
                    drain()
                    time.sleep(0.005)
                app.process_all_available()
                batch_of[index] = table.committed_batch_id
        finally:
            stop.set()
            assert external.stdin is not None
            external.stdin.close()  # asks the external node to stop and close its replicas
            try:
                external.wait(30)
            except subprocess.TimeoutExpired:
                external.kill()
                external.wait()
            app.stop()
        changelog = Changelog(state_dir, TABLE)
        committed: dict[int, float] = {}
        visible: dict[int, float] = {}
        for index, batch_id in batch_of.items():
            record = changelog.read_commit(batch_id)
            assert record is not None
            committed[index] = record.committed_at
            visible[index] = visible_at[batch_id]

    delays = {
        "App's local node (notified)": [
            (local_seen[i] - committed[i]) * 1000 for i in sorted(committed)
        ],
        "external Node (polls every 20 ms)": [
            (external_seen[i] - committed[i]) * 1000 for i in sorted(committed)
        ],
    }
    write_ms = [(visible[i] - committed[i]) * 1000 for i in sorted(committed)]
    after_visible = {
        name: [d - w for d, w in zip(ms, write_ms, strict=True)] for name, ms in delays.items()
    }

    def row(label: str, ms: list[float], measures: str) -> list[str]:
        return [
            label,
            measures,
            str(len(ms)),
            f"{percentile(ms, 50):.1f}",
            f"{percentile(ms, 90):.1f}",
            f"{max(ms):.1f}",
        ]

    report.rows.append(
        row("commit record written (floor)", write_ms, "committed_at -> record visible")
    )
    for name, ms in delays.items():
        report.rows.append(row(name, ms, "committed_at -> served"))
        report.rows.append(row(name, after_visible[name], "record visible -> served"))
    for name, ms in delays.items():
        p50 = percentile(ms, 50)
        report.readings.append(
            f"{name}: p50 {p50:.1f} ms, p90 {percentile(ms, 90):.1f} ms - "
            + verdict(p50, TARGET_MS, "ms", at_most=True)
            + "."
        )
    report.notes = [
        "readers poll every 0.5 ms, so up to ~0.5 ms of each figure is the readers' own "
        "sampling; a negative figure would mean the value was served before its commit "
        "record was written (never expected)"
    ]
    report.figures = {
        "delays_ms": delays,
        "commit_write_ms": write_ms,
        "after_visible_ms": after_visible,
        "p50_ms": {n: percentile(ms, 50) for n, ms in delays.items()},
        "p90_ms": {n: percentile(ms, 90) for n, ms in delays.items()},
    }
    return report


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--observe"]:
        observe(args[1])
        return {}
    return cli(run, args, __doc__).as_dict()


if __name__ == "__main__":
    main()
