"""The reader of ``bench.follower_tail``, run in its own process.

Usage: ``python -m bench._tail_observer <mode> <state_dir> <local_dir> <table> [poll_s]``

``mode`` is ``follow`` (``sparkiq.follow`` of the whole table), ``follow-subset``
(``sparkiq.follow`` with the ``where=`` filter and ``columns=`` projection below) or
``node`` (a plain :class:`sparkiq.Node` hosting every table). ``poll_s`` sets the poll
interval; without it the API's default is used.

Prints JSON lines on stdout: first ``{"ready": ..., "batch", "poll_interval", "api"}`` once
the reader has caught up with the changelog, then ``{"batch", "seen", "probe", "columns"}``
the first time each batch is visible (every followed partition applied it), with the
wall-clock time and the probe key's row read right after. Stops when stdin closes.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

import sparkiq
from sparkiq.changelog import Changelog

PROBE = "probe"
SUBSET_COLUMNS = ["n"]
SPIN_S = 0.0005


def keep(row: dict[str, Any]) -> bool:
    """The subset's filter: about half of the rows, and always the probe key."""
    return row["k"] == PROBE or int(row["n"]) % 2 == 0


def _emit(doc: dict[str, Any]) -> None:
    print(json.dumps(doc), flush=True)


def main(argv: list[str]) -> int:
    mode, state_dir, local_dir, table = argv[:4]
    options: dict[str, Any] = {} if len(argv) < 5 else {"poll_interval": float(argv[4])}
    head = max(Changelog(state_dir, table, read_only=True).committed_batch_ids(), default=-1)
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()

    if mode == "node":
        node = sparkiq.Node(state_dir, node_id="tail-observer", local_dir=local_dir, **options)
        node.start()
        replicas = node.replica(table).partitions.values()

        def batch_id() -> int:
            return min(r.batch_id for r in replicas)

        def get(key: str) -> dict[str, Any] | None:
            return node.get(table, key)

        close, poll_interval = node.stop, node.poll_interval
    else:
        subset: dict[str, Any] = (
            {"where": keep, "columns": SUBSET_COLUMNS} if mode == "follow-subset" else {}
        )
        follower = sparkiq.follow(state_dir, table, local_dir=local_dir, **subset, **options)

        def batch_id() -> int:
            return follower.batch_id

        get, close = follower.get, follower.close
        poll_interval = follower.poll_interval
    try:
        while batch_id() < head:
            if stop.wait(0.005):
                return 0
        seen = batch_id()
        _emit({"ready": True, "batch": seen, "poll_interval": poll_interval, "api": mode})
        while not stop.is_set():
            now_batch = batch_id()
            if now_batch != seen:
                now = time.time()
                row = get(PROBE)
                for batch in range(seen + 1, now_batch + 1):
                    _emit(
                        {
                            "batch": batch,
                            "seen": now,
                            "probe": None if row is None else row["n"],
                            "columns": None if row is None else sorted(row),
                        }
                    )
                seen = now_batch
            time.sleep(SPIN_S)
    finally:
        close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
