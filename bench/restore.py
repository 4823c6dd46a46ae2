"""Restore: a fresh replica of a large table, from a snapshot plus the changelog after it.

A table of 1,000,000 distinct keys (8 partitions) is written by hand with a history much
longer than the table: 40 committed batches x 100,000 changed rows, the first 10 inserting
every key once (in random order), the other 30 updating keys drawn at random. Every
partition is then snapshotted at batch N-5 with
:func:`~sparkiq.changelog.snapshot.write_snapshot` (timed: snapshot creation), and a fresh
:class:`~sparkiq.Node` (new ``node_id``, new ``local_dir``, RocksDB) is timed from its
creation through ``refresh_tables()`` and ``poll_once()`` until every partition has applied
the newest batch: it loads the snapshot, then applies the last 5 batches.

Baseline, measured in the same run: the same restore from a copy of the changelog (hard
links) that has no snapshot, which replays the whole history. The restored replicas are
checked: both hold the same keys and bytes (a digest of every partition), exactly the
number of keys written, and 1,000 random keys read with ``node.get`` equal the rows last
written. To show what the time goes to, the reads alone are timed too: the snapshots
(read, SHA-256, Arrow decode) and the changelog segments.

Each restore is the median of 3 repetitions (2 with ``--quick``, which uses 200,000 keys
and 20 batches x 40,000 rows), each on a fresh ``local_dir``. Closing the node (which
flushes its memtables) is not part of the time.

Run: ``python -m bench.restore [--quick | --smoke]``.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import time

from bench._changelog import as_arrow, key_name, open_table
from bench._common import Report, Scale, entry_point, median, scratch_dir, verdict
from sparkiq import Node
from sparkiq.changelog import Changelog
from sparkiq.changelog.snapshot import latest_snapshot, write_snapshot
from sparkiq.testing import TableWriter

TABLE = "restore"
PARTITIONS = 8
TAIL = 5  # batches committed after the snapshot
TARGET_S = 10.0
SPOT_CHECKS = 1_000
FROM_SNAPSHOT = f"restore: snapshot + {TAIL} batches"
NO_SNAPSHOT = "restore: full history, no snapshot"


def _write_table(
    state_dir: str, keyspace: int, batches: int, rows: int
) -> tuple[TableWriter, dict[int, tuple[int, float]]]:
    """Write the history; return the table and the last row written for each key index."""
    table = open_table(state_dir, TABLE, PARTITIONS)
    rng = random.Random(17)
    names = [key_name(i) for i in range(keyspace)]
    order = list(range(keyspace))
    rng.shuffle(order)
    inserts = -(-keyspace // rows)  # batches needed to create every key once
    expected: dict[int, tuple[int, float]] = {}
    for batch_id in range(batches):
        if batch_id < inserts:
            indices = order[batch_id * rows : (batch_id + 1) * rows]
        else:
            indices = rng.sample(range(keyspace), rows)
        ns = [rng.randrange(1, 1_000_000) for _ in indices]
        totals = [rng.random() * 1e6 for _ in indices]
        table.write(as_arrow([names[i] for i in indices], ns, totals), batch_id=batch_id)
        expected.update(zip(indices, zip(ns, totals, strict=True), strict=True))
    return table, expected


def _hardlink_copy(src: str, dst: str) -> None:
    """A copy of a changelog that costs no disk: files are never rewritten in place."""
    shutil.copytree(src, dst, copy_function=os.link)


def _snapshot(changelog: Changelog, batch_id: int) -> tuple[float, int]:
    """Snapshot every partition at ``batch_id``; return the seconds and rows written."""
    t0 = time.perf_counter()
    infos = [write_snapshot(changelog, p, batch_id) for p in range(PARTITIONS)]
    return time.perf_counter() - t0, sum(i.rows for i in infos)


def _read_snapshots(changelog: Changelog) -> tuple[float, int]:
    t0 = time.perf_counter()
    rows = 0
    for partition in range(PARTITIONS):
        found = latest_snapshot(changelog, partition)
        assert found is not None
        rows += len(found[1])
    return time.perf_counter() - t0, rows


def _read_segments(changelog: Changelog, first: int, last: int) -> tuple[float, int]:
    t0 = time.perf_counter()
    rows = 0
    for batch_id in range(first, last + 1):
        record = changelog.read_commit(batch_id)
        assert record is not None
        for partition in record.segments:
            rows += len(changelog.read_segment(record, partition)[0])
    return time.perf_counter() - t0, rows


def _restore(state_dir: str, local_dir: str, node_id: str, last: int) -> tuple[float, int, Node]:
    """Time a fresh node from creation until every partition applied batch ``last``;
    return the seconds, the rows it applied and the (still open) node."""
    t0 = time.perf_counter()
    node = Node(state_dir, node_id=node_id, local_dir=local_dir)
    try:
        node.refresh_tables()
        replica = node.replica(TABLE)
        while min(r.batch_id for r in replica.partitions.values()) < last:
            if not node.poll_once():
                errors = [r.error for r in replica.partitions.values() if r.error]
                raise RuntimeError(f"restore of {state_dir!r} stalled: {errors or 'no progress'}")
        elapsed = time.perf_counter() - t0
    except BaseException:
        node.stop()
        raise
    return elapsed, sum(r.applied_rows for r in replica.partitions.values()), node


def _digest(node: Node) -> tuple[int, str]:
    """Number of keys and a SHA-256 of every (key, row) pair the node holds, in order."""
    digest = hashlib.sha256()
    count = 0
    for _, replica in sorted(node.replica(TABLE).partitions.items()):
        iterator, _ = replica.store.scan(None, None)
        with iterator:
            for key, value in iterator:
                digest.update(len(key).to_bytes(4, "little") + key)
                digest.update(len(value).to_bytes(4, "little") + value)
                count += 1
    return count, digest.hexdigest()


def _spot_check(
    node: Node, expected: dict[int, tuple[int, float]], keyspace: int, seed: int
) -> list[str]:
    rng = random.Random(seed)
    wrong = []
    for i in rng.sample(range(keyspace), min(SPOT_CHECKS, keyspace)):
        n, total = expected[i]
        want = {"k": key_name(i), "n": n, "total": total}
        got = node.get(TABLE, key_name(i))
        if got != want:
            wrong.append(f"{key_name(i)}: {got} != {want}")
    return wrong


def _verify(
    nodes: dict[str, Node], expected: dict[int, tuple[int, float]], keyspace: int
) -> list[str]:
    """Check both restored replicas against each other and against what was written;
    raise on any difference (a restore of wrong data is not a result)."""
    digests = {path: _digest(node) for path, node in nodes.items()}
    counts = {path: count for path, (count, _) in digests.items()}
    if len({d for _, d in digests.values()}) != 1 or set(counts.values()) != {keyspace}:
        raise RuntimeError(f"restored replicas differ: {digests} (expected {keyspace:,} keys each)")
    for seed, (path, node) in enumerate(nodes.items()):
        wrong = _spot_check(node, expected, keyspace, seed)
        if wrong:
            raise RuntimeError(f"{path}: {len(wrong)} wrong rows, e.g. {wrong[:3]}")
    return [
        f"both replicas hold {keyspace:,} keys with identical bytes (SHA-256 of every "
        f"partition's keys and rows), and {min(SPOT_CHECKS, keyspace):,} random keys per "
        "replica equal the rows last written"
    ]


def run(scale: Scale = Scale.FULL) -> Report:
    keyspace, batches, rows = scale.pick(
        (1_000_000, 40, 100_000), (200_000, 20, 40_000), (2_000, TAIL + 3, 500)
    )
    repetitions = scale.pick(3, 2, 1)
    last = batches - 1
    snapshot_at = last - TAIL
    report = Report(
        name="restore",
        title="Restore of a large table into a fresh replica",
        measures=(
            f"a fresh node (new `node_id` and `local_dir`, RocksDB) of a {keyspace:,}-key "
            f"table ({PARTITIONS} partitions, history of {batches} batches x {rows:,} changed "
            f"rows), from its creation until every partition applied the newest batch: load "
            f"the snapshot of batch {snapshot_at}, then apply the {TAIL} batches after it; "
            f"median of {repetitions} repetitions on fresh local directories"
        ),
        baseline=(
            "the same restore from a copy of the changelog with no snapshot (replays all "
            f"{batches} batches); and the reads alone (snapshots: read, SHA-256, Arrow "
            "decode; segments: the same)"
        ),
        target=f"restore of 1,000,000 keys from snapshot + changelog <= {TARGET_S:.0f} s",
        columns=["path", "seconds", "rows", "rows/s", "vs no snapshot"],
        scale=scale,
    )
    with scratch_dir("restore") as root:
        state_dir = os.path.join(root, "state")
        plain_dir = os.path.join(root, "no-snapshot")
        t0 = time.perf_counter()
        _, expected = _write_table(state_dir, keyspace, batches, rows)
        setup_s = time.perf_counter() - t0
        _hardlink_copy(state_dir, plain_dir)  # before the snapshots are written
        changelog = Changelog(state_dir, TABLE)
        snapshot_s, snapshot_rows = _snapshot(changelog, snapshot_at)

        timings: dict[str, list[float]] = {FROM_SNAPSHOT: [], NO_SNAPSHOT: []}
        applied: dict[str, int] = {}
        reads: dict[str, list[float]] = {"snapshots": [], "tail": [], "history": []}
        read_rows: dict[str, int] = {}
        checks: list[str] = []
        sources = {FROM_SNAPSHOT: state_dir, NO_SNAPSHOT: plain_dir}
        for rep in range(repetitions):
            nodes: dict[str, Node] = {}
            # alternate which restore goes first, so drift and a warm cache hit both alike
            order = list(sources) if rep % 2 == 0 else list(reversed(sources))
            try:
                for path in order:
                    local_dir = os.path.join(root, f"local-{rep}-{len(nodes)}")
                    seconds, applied[path], nodes[path] = _restore(
                        sources[path], local_dir, f"bench-{rep}-{len(nodes)}", last
                    )
                    timings[path].append(seconds)
                if rep == 0:
                    checks = _verify(nodes, expected, keyspace)
            finally:
                for node in nodes.values():
                    node.stop()
            for name, (seconds, count) in {
                "snapshots": _read_snapshots(changelog),
                "tail": _read_segments(changelog, snapshot_at + 1, last),
                "history": _read_segments(changelog, 0, last),
            }.items():
                reads[name].append(seconds)
                read_rows[name] = count
            shutil.rmtree(os.path.join(root, f"local-{rep}-0"), ignore_errors=True)
            shutil.rmtree(os.path.join(root, f"local-{rep}-1"), ignore_errors=True)

    seconds = {path: median(ts) for path, ts in timings.items()}
    rate = {path: applied[path] / s for path, s in seconds.items()}
    base = seconds[NO_SNAPSHOT]
    read_s = {name: median(ts) for name, ts in reads.items()}
    snapshot_reads = read_s["snapshots"] + read_s["tail"]

    def row(path: str, secs: float, count: int, versus: str) -> list[str]:
        return [path, f"{secs:.2f}", f"{count:,}", f"{count / secs:,.0f}", versus]

    report.rows = [
        row(FROM_SNAPSHOT, seconds[FROM_SNAPSHOT], applied[FROM_SNAPSHOT],
            f"{base / seconds[FROM_SNAPSHOT]:.1f}x faster"),
        row(NO_SNAPSHOT, base, applied[NO_SNAPSHOT], "1.0x (baseline)"),
        row(f"reads only: snapshots + {TAIL} batches' segments", snapshot_reads,
            read_rows["snapshots"] + read_rows["tail"], "n/a (no writes)"),
        row("reads only: every segment", read_s["history"], read_rows["history"],
            "n/a (no writes)"),
        row(f"snapshot creation (batch {snapshot_at}, once)", snapshot_s, snapshot_rows,
            "n/a"),
        row("setup: writing the changelog (once)", setup_s, batches * rows, "n/a"),
    ]  # fmt: skip
    restore_s = seconds[FROM_SNAPSHOT]
    target = (
        verdict(restore_s, TARGET_S, "s", at_most=True)
        if keyspace == 1_000_000
        else f"the target is for 1,000,000 keys (this {scale.value} run has {keyspace:,})"
    )
    report.readings = [
        f"restore of {keyspace:,} keys from snapshot + {TAIL} batches: {restore_s:.1f} s "
        f"({rate[FROM_SNAPSHOT]:,.0f} rows/s) - {target}; with no snapshot it takes "
        f"{base:.1f} s ({rate[NO_SNAPSHOT]:,.0f} rows/s), {base / restore_s:.1f}x as long; "
        f"reading the snapshot and segments is {snapshot_reads / restore_s:.0%} of the "
        "restore.",
        f"snapshot creation of {snapshot_rows:,} rows from {snapshot_at + 1} batches of "
        f"changelog: {snapshot_s:.1f} s ({snapshot_rows / snapshot_s:,.0f} rows written/s).",
    ]
    report.notes = checks
    report.figures = {
        "keys": keyspace,
        "batches": batches,
        "rows_per_batch": rows,
        "partitions": PARTITIONS,
        "seconds": seconds,
        "rows_applied": applied,
        "rows_per_s": rate,
        "all_seconds": timings,
        "read_seconds": read_s,
        "read_rows": read_rows,
        "snapshot_create_s": snapshot_s,
        "snapshot_rows": snapshot_rows,
        "setup_s": setup_s,
    }
    return report


main = entry_point(run, __doc__)

if __name__ == "__main__":
    main()
