"""Replica apply throughput: how fast a fresh node catches up on a changelog.

A changelog of 20 committed batches x 50k changed rows over 8 partitions (keys drawn from
200k, so later batches mix inserts and updates) is written by hand; then a fresh
:class:`~sparkiq.Node` applies all of it in one ``poll_once()`` (read, verify checksums,
decode each segment, write it with its position in one RocksDB write batch), timed. The
node keeps versions (the table's default history, as every replica does), so this is the
apply with versions; ``bench.versions`` measures it beside the same store without them. The
same for ``store="memory"``. Baselines measured in the same run:

* raw rocksdict: ``WriteBatch`` puts of the same key/row bytes, in the same (sorted) order,
  into 8 fresh databases, bytes already in memory - the floor of the RocksDB write path;
  once with the options sparkiq's replicas use (the floor ratios are taken against) and
  once with rocksdict's defaults;
* changelog read only: ``Changelog.read_segment`` of every segment (read, SHA-256, Arrow
  decode to Python lists), no store - the part of an apply that is not the store.

Each figure is the median of 3 repetitions, each on fresh local directories.

Run: ``python -m bench.apply [--quick | --smoke]``.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable

from rocksdict import Options, Rdict, WriteBatch

from bench._changelog import Changes, as_arrow, key_name, open_table
from bench._common import Report, Scale, entry_point, median, scratch_dir, verdict
from sparkiq import Node
from sparkiq.stores.rocksdb_options import store_options
from sparkiq.testing import TableWriter

TABLE = "apply"
TARGET_ROWS_S = 300_000.0
RAW = "raw rocksdict, default options"
TUNED = "raw rocksdict, replica options"
REPETITIONS = 3


def _write_changelog(
    state_dir: str, batches: int, rows: int, keyspace: int, partitions: int
) -> tuple[TableWriter, list[Changes]]:
    table = open_table(state_dir, TABLE, partitions)
    rng = random.Random(3)
    names = [key_name(i) for i in range(keyspace)]
    written = []
    for batch_id in range(batches):
        keys = [names[i] for i in rng.sample(range(keyspace), rows)]
        ns = [rng.randrange(1, 1_000_000) for _ in keys]
        totals = [rng.random() * 1e6 for _ in keys]
        changes = table.changes(as_arrow(keys, ns, totals))
        table.write_changes(batch_id=batch_id, changes=changes)
        # in segment order (sorted by key), which is the order a replica writes them in
        written.append({p: dict(sorted(c.items())) for p, c in changes.items()})
    return table, written


def _raw_rocksdict(
    root: str, batches: list[Changes], partitions: int, options: Callable[[], Options]
) -> float:
    dbs = [Rdict(os.path.join(root, f"{p:05d}"), options()) for p in range(partitions)]
    try:
        t0 = time.perf_counter()
        for changes in batches:
            for partition, rows in changes.items():
                batch = WriteBatch(raw_mode=True)
                put = batch.put
                for key, value in rows.items():
                    put(key, value)
                dbs[partition].write(batch)
        return time.perf_counter() - t0
    finally:
        for db in dbs:
            db.close()


def _read_only(table: TableWriter, batches: int) -> float:
    changelog = table.changelog
    t0 = time.perf_counter()
    for batch_id in range(batches):
        record = changelog.read_commit(batch_id)
        assert record is not None
        for partition in record.segments:
            changelog.read_segment(record, partition)
    return time.perf_counter() - t0


def _node_apply(state_dir: str, local_dir: str, store: str, expected: int) -> float:
    node = Node(state_dir, node_id="bench", local_dir=local_dir, store=store)
    try:
        node.refresh_tables()
        t0 = time.perf_counter()
        applied = node.poll_once()
        elapsed = time.perf_counter() - t0
        if applied != expected:
            raise RuntimeError(
                f"{store} node applied {applied} (partition, batch)s, not {expected}"
            )
        return elapsed
    finally:
        node.stop()


def run(scale: Scale = Scale.FULL) -> Report:
    batches, rows, partitions = scale.pick((20, 50_000, 8), (5, 20_000, 8), (2, 500, 8))
    repetitions = scale.pick(REPETITIONS, REPETITIONS, 1)
    keyspace = 4 * rows
    report = Report(
        name="apply",
        title="Replica apply throughput",
        measures=(
            f"one `poll_once()` of a fresh node applying {batches} committed batches x "
            f"{rows:,} changed rows ({partitions} partitions, keys drawn from {keyspace:,}): "
            "read + verify + decode every segment, write each (partition, batch) atomically "
            f"with its position; median of {repetitions} repetitions on fresh directories"
        ),
        baseline=(
            "raw rocksdict `WriteBatch` puts of the same bytes in the same (key-sorted) order, "
            "already in memory, into 8 fresh databases opened with the replicas' RocksDB "
            "options (and, for comparison, rocksdict's defaults); and the changelog reads "
            "alone (read, SHA-256, Arrow decode)"
        ),
        target=f">= {TARGET_ROWS_S:,.0f} rows/s into RocksDB on one core",
        columns=["path", "seconds", "rows/s", "vs raw floor"],
        scale=scale,
    )
    with scratch_dir("apply") as root:
        state_dir = os.path.join(root, "state")
        t0 = time.perf_counter()
        table, written = _write_changelog(state_dir, batches, rows, keyspace, partitions)
        setup_s = time.perf_counter() - t0
        total_rows = sum(len(r) for changes in written for r in changes.values())
        applications = sum(len(changes) for changes in written)
        raw_paths: dict[str, Callable[[], Options]] = {
            RAW: lambda: Options(raw_mode=True),
            TUNED: lambda: store_options(create=True),
        }
        timings: dict[str, list[float]] = {
            **{path: [] for path in raw_paths},
            "changelog read only": [],
            "node apply, RocksDB": [],
            "node apply, memory": [],
        }
        for rep in range(repetitions):  # the paths take turns, so drift hits them alike
            scratch = os.path.join(root, f"rep{rep}")
            for path, options in raw_paths.items():
                timings[path].append(
                    _raw_rocksdict(os.path.join(scratch, path), written, partitions, options)
                )
            timings["changelog read only"].append(_read_only(table, batches))
            timings["node apply, RocksDB"].append(
                _node_apply(state_dir, os.path.join(scratch, "node"), "rocksdb", applications)
            )
            timings["node apply, memory"].append(
                _node_apply(state_dir, os.path.join(scratch, "mem"), "memory", applications)
            )
    seconds = {path: median(ts) for path, ts in timings.items()}
    rate = {path: total_rows / s for path, s in seconds.items()}
    floor, raw = TUNED, rate[TUNED]
    for path in timings:
        report.rows.append(
            [
                path,
                f"{seconds[path]:.2f}",
                f"{rate[path]:,.0f}",
                "1.0x (floor)"
                if path == floor
                else "n/a (no writes)"
                if path.startswith("changelog")
                else f"{rate[path] / raw:.2f}x",
            ]
        )
    rocks, mem = rate["node apply, RocksDB"], rate["node apply, memory"]
    read_share = seconds["changelog read only"] / seconds["node apply, RocksDB"]
    report.readings = [
        f"RocksDB apply {rocks:,.0f} rows/s, {rocks / raw:.2f}x raw rocksdict with the "
        f"replicas' options ({rocks / rate[RAW]:.2f}x with its defaults): "
        + verdict(rocks, TARGET_ROWS_S, "rows/s", at_most=False)
        + f"; reading the changelog is {read_share:.0%} of its time.",
        f"memory apply {mem:,.0f} rows/s ({mem / rocks:.1f}x the RocksDB apply).",
    ]
    report.figures = {
        "rows": total_rows,
        "batches": batches,
        "partitions": partitions,
        "seconds": seconds,
        "rows_per_s": rate,
        "all_seconds": timings,
        "setup_s": setup_s,
    }
    return report


main = entry_point(run, __doc__)

if __name__ == "__main__":
    main()
