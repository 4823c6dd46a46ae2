"""The apply loop of ``bench.versions`` alone, to profile: one partition, batch 0 loaded by
``first_batch``, the changed batches applied by ``later_batch`` (the frame a flame graph is
cut at), with or without versions, per CPU-second of this thread printed at the end.

    py-spy record -r 250 --native -f raw -o apply.txt -- \\
        python -m bench._versions_profile with 125000 20 3
    python -m bench._flame apply.txt --root later_batch -o docs/flames/versions-apply.svg
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import pyarrow as pa

from bench._changelog import open_table
from bench._common import scratch_dir
from bench.versions import _batches, _segments
from sparkiq.query.position import Position
from sparkiq.stores.history import DEFAULT_HISTORY
from sparkiq.stores.partition import PartitionStore
from sparkiq.stores.rocksdb import RocksDBStore

Segment = tuple[list[bytes], list[bytes | None], tuple[pa.Array, pa.Array]]


def _apply(store: PartitionStore, segment: Segment, batch_id: int) -> None:
    keys, values, columns = segment
    store.apply_changes(
        keys,
        values,
        batch_id,
        Position.from_map({"t": {0: batch_id}}),
        committed_at=time.time(),
        columns=columns,
    )


def _fresh(segment: Segment) -> Segment:
    """The segment with new lists read from its columns, as a replica reads them."""
    columns = segment[2]
    return columns[0].to_pylist(), columns[1].to_pylist(), columns


def first_batch(store: PartitionStore, segment: Segment) -> None:
    _apply(store, segment, 0)


def later_batch(store: PartitionStore, segment: Segment, batch_id: int) -> None:
    _apply(store, segment, batch_id)


def main(argv: list[str]) -> None:
    mode = argv[0] if argv else "with"  # with | without | both
    sizes = [int(a) for a in argv[1:]] + [125_000, 20, 3][len(argv[1:]) :]
    n_keys, n_batches, rounds = sizes[:3]
    with scratch_dir("versions-profile") as root:
        table = open_table(os.path.join(root, "one"), "t", 1)
        segments = _segments([b.get(0, {}) for b in _batches(table, n_keys, n_batches, seed=1)])
        rows = sum(len(keys) for keys, _, _ in segments[1:])
        rates: dict[str, list[float]] = {"with": [], "without": []}
        for round_ in range(rounds):
            for name, history in (("with", DEFAULT_HISTORY), ("without", None)):
                if mode not in ("both", name):
                    continue
                path = os.path.join(root, f"{name}-{round_}")
                store = PartitionStore("t", 0, table.manifest.schema, RocksDBStore(path), history)
                first_batch(store, _fresh(segments[0]))
                cpu = 0.0
                for batch_id, segment in enumerate(segments[1:], 1):
                    segment = _fresh(segment)
                    c0 = time.thread_time()
                    later_batch(store, segment, batch_id)
                    cpu += time.thread_time() - c0
                store.close()
                rates[name].append(rows / cpu)
        for name, values in rates.items():
            if values:
                print(f"{name} versions: {statistics.median(values):,.0f} rows per CPU-second")


if __name__ == "__main__":
    main(sys.argv[1:])
