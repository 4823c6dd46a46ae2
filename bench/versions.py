"""What keeping versions costs, and what reading one batch (or a past one) costs.

One partition of 125k keys (``k string``, ``n long``, ``total double``) in RocksDB, then 20
batches that each change 8% of it (10:2:1 updates, inserts, deletes), applied to a
:class:`~sparkiq.stores.partition.PartitionStore` with versions (five minutes of history)
and to one without, taking turns, as a replica applies a segment: keys and values as two
lists in key order, and the segment's two binary columns they were read from
(``PartitionStore.apply_changes``):

* apply throughput (rows of changes per second) with and without versions, and the floor:
  the same changes as bare rocksdict write batches (replica options, no position, no checks);
* ``get`` p50 of the same keys on both (point reads stay on RocksDB);
* bytes held per live row by the versions, and per version replaced within the history.

Then a node over 8 such partitions (1M rows, 20 batches kept) answers, taking turns:

* an all-partition aggregate: consistent columnar (``node.sql``), consistent per-partition
  fragments, and fragments that each read their partition's newest batch (no pinning: what
  reads spanning partitions did before, minus RocksDB decoding);
* a ``KeyQuery`` against the same key read ``as_of`` the newest batch (RocksDB answers) and
  ``as_of`` a batch 10 back (read from the versions), and a ``VersionedKeyQuery`` at that
  batch and a ``MultiVersionedKeyQuery`` over every retained version of the key.

Run: ``python -m bench.versions [--quick | --smoke]``.
"""

from __future__ import annotations

import gc
import os
import random
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa
from rocksdict import Rdict, WriteBatch

from bench._changelog import as_arrow, key_name, open_table
from bench._common import Report, Scale, entry_point, fmt_ratio, median, percentile, scratch_dir
from bench._flames import enabled as flames_enabled
from bench._flames import flame
from sparkiq import (
    KeyQuery,
    MultiVersionedKeyQuery,
    Node,
    StateQueryRequest,
    VersionedKeyQuery,
)
from sparkiq.query.position import Position
from sparkiq.serving.lookup import Lookup
from sparkiq.sql import SqlEngine
from sparkiq.stores.history import DEFAULT_HISTORY
from sparkiq.stores.partition import PartitionStore
from sparkiq.stores.rocksdb import RocksDBStore
from sparkiq.stores.rocksdb_options import store_options
from sparkiq.testing import TableWriter

RAW = "RocksDB write batches alone (floor)"
AGGREGATE = "SELECT count(*) AS c, sum(total) AS s, avg(n) AS a FROM t"


def _batches(
    table: TableWriter, n_keys: int, n_batches: int, seed: int
) -> list[dict[int, dict[bytes, bytes | None]]]:
    """Batch 0 inserts ``n_keys`` keys; later batches change 8% (10:2:1 kinds)."""
    rng = random.Random(seed)
    live = [key_name(i) for i in range(n_keys)]
    next_key = n_keys
    out = [
        table.changes(
            as_arrow(live, [rng.randrange(10_000) for _ in live], [rng.random() for _ in live])
        )
    ]
    per_batch = n_keys * 8 // 100
    for _ in range(1, n_batches):
        updated = rng.sample(live, per_batch * 10 // 13)
        inserted = [key_name(next_key + i) for i in range(per_batch * 2 // 13)]
        next_key += len(inserted)
        changed = set(updated)  # built once: inside the comprehension it made this quadratic
        deleted = rng.sample([k for k in live if k not in changed], per_batch // 13)
        keys = updated + inserted
        changes = table.changes(
            as_arrow(keys, [rng.randrange(10_000) for _ in keys], [rng.random() for _ in keys])
        )
        for key in deleted:
            encoded = table.key_codec.encode(table.key_codec.to_internal(key))
            changes.setdefault(table.partition_of(key), {})[encoded] = None
        gone = set(deleted)
        live = [k for k in live if k not in gone] + inserted
        out.append(changes)
    return out


Segment = tuple[list[bytes], list[bytes | None], tuple[pa.Array, pa.Array]]


def _segments(batches: list[dict[bytes, bytes | None]]) -> list[Segment]:
    """Each batch's changes as a replica reads them from its segment: keys and values as
    two lists, in key order, and the segment's key and value columns."""
    out: list[Segment] = []
    for changes in batches:
        keys = sorted(changes)
        values = [changes[k] for k in keys]
        out.append((keys, values, (pa.array(keys, pa.binary()), pa.array(values, pa.binary()))))
    return out


def _apply_all(store: PartitionStore, segments: list[Segment]) -> tuple[float, float]:
    """Seconds, wall clock and CPU of this thread, to apply every batch after the first (as
    ``PartitionReplica.apply`` calls it: with lists it has just read from the segment's
    columns, so their objects are new, not hashed yet, and in cache)."""
    wall = cpu = 0.0
    for batch_id, (_, _, columns) in enumerate(segments):
        keys, values = columns[0].to_pylist(), columns[1].to_pylist()
        position = Position.from_map({"t": {0: batch_id}})
        t0, c0 = time.perf_counter(), time.thread_time()
        store.apply_changes(
            keys, values, batch_id, position, committed_at=time.time(), columns=columns
        )
        if batch_id:
            wall += time.perf_counter() - t0
            cpu += time.thread_time() - c0
    return wall, cpu


def _raw_write_all(path: str, segments: list[Segment]) -> tuple[float, float]:
    """The floor: the same changes as rocksdict ``WriteBatch``es into a database opened
    with the replicas' options, no position, no checks; seconds as :func:`_apply_all`."""
    options = store_options(create=True)
    db = Rdict(path, options, column_families={"default": options})
    wall = cpu = 0.0
    try:
        for batch_id, (_, _, columns) in enumerate(segments):
            keys, values = columns[0].to_pylist(), columns[1].to_pylist()  # as _apply_all
            t0, c0 = time.perf_counter(), time.thread_time()
            batch = WriteBatch(raw_mode=True)
            put, delete = batch.put, batch.delete
            for key, value in zip(keys, values, strict=True):
                if value is None:
                    delete(key)
                else:
                    put(key, value)
            db.write(batch)
            if batch_id:
                wall += time.perf_counter() - t0
                cpu += time.thread_time() - c0
    finally:
        db.close()
    return wall, cpu


def _per_call_us(fn: Callable[[Any], Any], args: list[Any]) -> list[float]:
    clock = time.perf_counter_ns
    out = []
    for arg in args:
        t0 = clock()
        fn(arg)
        out.append((clock() - t0) / 1000)
    return out


def _timed(fn: Callable[[], Any]) -> float:
    gc.collect()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


class _Unpinned:
    """The node as a source that reads each partition at its own newest batch."""

    def __init__(self, lookup: Lookup) -> None:
        self.tables = lookup.tables
        self.schema = lookup.schema
        self.partition_count = lookup.partition_count
        self.query = lookup.query_local


class _Fragments(_Unpinned):
    def __init__(self, lookup: Lookup) -> None:
        super().__init__(lookup)
        self.query = lookup.query


def run(scale: Scale = Scale.FULL) -> Report:
    n_keys = scale.pick(125_000, 40_000, 1_000)
    n_batches = scale.pick(20, 8, 3)
    rounds = scale.pick(5, 3, 1)
    apply_rounds = scale.pick(3, 2, 1)
    n_gets, n_key_reads = scale.pick((20_000, 2_000), (20_000, 2_000), (200, 20))
    report = Report(
        name="versions",
        title="Versions: consistent reads, AS OF, and their cost",
        measures=(
            f"apply throughput (wall clock, and per CPU-second of the applying thread) and get "
            f"p50 on one partition of {n_keys:,} keys with and without versions ({n_batches} "
            f"batches changing 8% each, applied in key order as segments are, with the segment's "
            "columns and lists read from them just before each batch, as a replica does); "
            "memory of the versions; on 8 "
            f"partitions ({8 * n_keys:,} keys): an all-partition aggregate consistent and not, "
            "and a key read at the newest and at a past batch"
        ),
        baseline=(
            "the same store without versions; the same aggregate without pinning one batch; "
            "a plain KeyQuery"
        ),
        target="apply >= 300k rows/s with versions; get p50 <= 10 us",
        columns=["measure", "method", "value", "vs baseline"],
        scale=scale,
    )
    with scratch_dir("versions") as root:
        table = open_table(os.path.join(root, "one"), "t", 1)
        segments = _segments([b.get(0, {}) for b in _batches(table, n_keys, n_batches, seed=1)])
        rows = sum(len(keys) for keys, _, _ in segments[1:])
        rates: dict[str, list[float]] = {"with versions": [], "without versions": [], RAW: []}
        cpu_rates: dict[str, list[float]] = {name: [] for name in rates}
        stores = {}
        for round_ in range(apply_rounds):  # the three take turns: drift hits them alike
            for name, history in (("with versions", DEFAULT_HISTORY), ("without versions", None)):
                path = os.path.join(root, f"p-{name.split()[0]}-{round_}")
                store = PartitionStore("t", 0, table.manifest.schema, RocksDBStore(path), history)
                wall, cpu = _apply_all(store, segments)
                rates[name].append(rows / wall)
                cpu_rates[name].append(rows / cpu)
                if name in stores:
                    stores[name].close()
                stores[name] = store
            wall, cpu = _raw_write_all(os.path.join(root, f"raw-{round_}"), segments)
            rates[RAW].append(rows / wall)
            cpu_rates[RAW].append(rows / cpu)
        if flames_enabled():  # a pass of its own, the figures' runs left unsampled
            path = os.path.join(root, "p-flame")
            store = PartitionStore(
                "t", 0, table.manifest.schema, RocksDBStore(path), DEFAULT_HISTORY
            )
            with flame("versions-apply", native=True):  # RocksDB's write is native code
                _apply_all(store, segments)
            store.close()
        with_rate, without_rate = median(rates["with versions"]), median(rates["without versions"])
        raw_rate = median(rates[RAW])
        cpu_rate = {name: median(values) for name, values in cpu_rates.items()}
        report.rows.append(
            [
                "apply",
                "with versions",
                f"{with_rate:,.0f} rows/s",
                fmt_ratio(with_rate / without_rate),
            ]
        )
        report.rows.append(["apply", "without versions", f"{without_rate:,.0f} rows/s", "1.0x"])
        report.rows.append(
            ["apply", RAW, f"{raw_rate:,.0f} rows/s", fmt_ratio(raw_rate / without_rate)]
        )
        # per CPU-second of the applying thread: what a core would do with nothing else to
        # run (RocksDB's background flushes run on other threads and are not counted)
        for name, rate in cpu_rate.items():
            report.rows.append(
                [
                    "apply, per CPU-second of the applying thread",
                    name,
                    f"{rate:,.0f} rows/s",
                    fmt_ratio(rate / cpu_rate["without versions"]),
                ]
            )
        rng = random.Random(4)
        probe = [
            table.key_codec.to_internal(key_name(rng.randrange(n_keys))) for _ in range(n_gets)
        ]
        gets: dict[str, list[float]] = {}
        for start in range(0, len(probe), 2_000):
            for name, store in stores.items():
                gets.setdefault(name, []).extend(
                    _per_call_us(store.get, probe[start : start + 2_000])
                )
        get_with, get_without = (
            percentile(gets["with versions"], 50),
            percentile(gets["without versions"], 50),
        )
        report.rows.append(
            ["get p50", "with versions", f"{get_with:.2f} us", fmt_ratio(get_with / get_without)]
        )
        report.rows.append(["get p50", "without versions", f"{get_without:.2f} us", "1.0x"])
        versions = stores["with versions"].versions
        assert versions is not None
        live = versions.version(versions.newest).table().num_rows
        held = versions.stored_rows()
        per_live = versions.nbytes() / live
        per_stored = versions.nbytes() / held
        report.rows.append(["memory", "versions, per live row", f"{per_live:.0f} B", "-"])
        report.rows.append(
            [
                "memory",
                f"versions, {held - live:,} past versions kept",
                f"{per_stored:.0f} B per stored row",
                "-",
            ]
        )
        for store in stores.values():
            store.close()

        state_dir = os.path.join(root, "eight")
        eight = open_table(state_dir, "t", 8)
        for batch_id, changes in enumerate(_batches(eight, 8 * n_keys, n_batches, seed=2)):
            eight.write_changes(batch_id=batch_id, changes=changes)
        node = Node(state_dir)
        try:
            node.refresh_tables()
            node.poll_once()
            lookup = node._lookup
            engines = {
                "consistent, columnar": SqlEngine(lookup),
                "consistent, per-partition fragments": SqlEngine(_Fragments(lookup)),  # type: ignore[arg-type]
                "per-partition, each at its newest": SqlEngine(_Unpinned(lookup)),  # type: ignore[arg-type]
            }
            agg: dict[str, list[float]] = {}
            for _ in range(rounds):
                for name, engine in engines.items():
                    agg.setdefault(name, []).append(_timed(lambda e=engine: e.execute(AGGREGATE)))  # type: ignore[misc]
            base = median(agg["per-partition, each at its newest"])
            for name in engines:
                value = median(agg[name])
                report.rows.append(
                    [
                        "all-partition aggregate",
                        name,
                        f"{value * 1000:,.1f} ms",
                        fmt_ratio(value / base),
                    ]
                )
            newest = n_batches - 1
            keys = [key_name(rng.randrange(8 * n_keys // 2)) for _ in range(n_key_reads)]
            request = StateQueryRequest.in_store("t")
            kinds: dict[str, Callable[[str], Any]] = {
                "KeyQuery": lambda k: node.query(request.with_query(KeyQuery.with_key(k))),
                "KeyQuery as_of newest": lambda k: node.query(
                    request.with_query(KeyQuery.with_key(k)).as_of(newest)
                ),
                "KeyQuery as_of 10 back": lambda k: node.query(
                    request.with_query(KeyQuery.with_key(k)).as_of(max(0, newest - 10))
                ),
                "VersionedKeyQuery as_of 10 back": lambda k: node.query(
                    request.with_query(VersionedKeyQuery.with_key(k).as_of(max(0, newest - 10)))
                ),
                "MultiVersionedKeyQuery, all kept": lambda k: node.query(
                    request.with_query(MultiVersionedKeyQuery.with_key(k))
                ),
            }
            lat: dict[str, list[float]] = {}
            for start in range(0, len(keys), 200):
                for name, fn in kinds.items():
                    lat.setdefault(name, []).extend(_per_call_us(fn, keys[start : start + 200]))
            plain = percentile(lat["KeyQuery"], 50)
            for name in kinds:
                value = percentile(lat[name], 50)
                report.rows.append(
                    ["key read p50", name, f"{value:,.1f} us", fmt_ratio(value / plain)]
                )
        finally:
            node.stop()
        report.readings.append(
            f"apply {with_rate:,.0f} rows/s with versions vs {without_rate:,.0f} without "
            f"and {raw_rate:,.0f} for bare RocksDB write batches (target >= 300k); per "
            f"CPU-second of the applying thread {cpu_rate['with versions']:,.0f} with versions "
            f"vs {cpu_rate['without versions']:,.0f} without; "
            f"get p50 {get_with:.2f} us vs {get_without:.2f} us; versions hold "
            f"{per_live:.0f} B per live row; a consistent all-partition aggregate "
            f"{median(agg['consistent, columnar']) * 1000:,.1f} ms vs "
            f"{base * 1000:,.1f} ms unpinned per partition; a key read 10 batches back "
            f"{percentile(lat['KeyQuery as_of 10 back'], 50):,.0f} us vs {plain:.1f} us "
            "for a KeyQuery"
        )
        report.figures.update(
            {
                "apply_rows_per_s": {"with": with_rate, "without": without_rate, "raw": raw_rate},
                "apply_rows_per_cpu_s": cpu_rate,
                "get_p50_us": {"with": get_with, "without": get_without},
                "bytes_per_live_row": per_live,
                "bytes_per_stored_row": per_stored,
                "aggregate_ms": {k: median(v) * 1000 for k, v in agg.items()},
                "key_p50_us": {k: percentile(v, 50) for k, v in lat.items()},
            }
        )
    return report


main = entry_point(run, __doc__)

if __name__ == "__main__":
    main()
