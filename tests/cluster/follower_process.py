"""A follower run as its own process, for kill-and-restart tests.

Usage: python -m tests.cluster.follower_process <state_dir> <local_dir> <target_batch> <out>

Follows table ``w`` (see tests/changelog/helpers.py) with the subset below, printing
``at <batch> <head>`` whenever the batch every followed partition has applied changes
(``head``: the newest batch committed when the process started). Once it has applied
``target_batch`` it writes its state to ``<out>`` (JSON, see :func:`dump`) and exits 0.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import sparkiq
from sparkiq import RangeQuery, StateQueryRequest
from sparkiq.changelog import Changelog

TABLE = "w"
PARTITIONS = [0, 1, 3]
COLUMNS = ["n", "info"]


def keep(row: dict[str, Any]) -> bool:
    """The subset's filter: a key enters and leaves it as its ``n`` changes."""
    return int(row["n"]) % 3 != 0 and row["tag"] != "green"


def follow(state_dir: str, local_dir: str) -> sparkiq.Follower:
    return sparkiq.follow(
        state_dir,
        TABLE,
        partitions=PARTITIONS,
        where=keep,
        columns=COLUMNS,
        local_dir=local_dir,
        poll_interval=0.005,
    )


def dump(follower: sparkiq.Follower) -> dict[str, Any]:
    """Every key -> row of the follower and its position, as JSON-compatible values."""
    result = follower.query(
        StateQueryRequest.in_store(TABLE).with_query(RangeQuery.with_no_bounds())
    )
    rows: dict[str, Any] = {}
    for partition in PARTITIONS:
        partial = result.partition_results[partition]
        assert partial.is_success, partial
        rows.update(dict(partial.result))
    doc = {"rows": rows, "position": follower.position.to_token(), "batch": follower.batch_id}
    return json.loads(json.dumps(doc, default=str, sort_keys=True))  # type: ignore[no-any-return]


def main() -> int:
    state_dir, local_dir, target, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    head = max(Changelog(state_dir, TABLE, read_only=True).committed_batch_ids(), default=-1)
    with follow(state_dir, local_dir) as follower:
        seen = None
        while True:
            batch = follower.batch_id
            if batch != seen:
                print(f"at {batch} {head}", flush=True)
                seen = batch
            if batch >= target:
                break
            time.sleep(0.002)
        doc = dump(follower)
    with open(f"{out}.tmp", "w") as handle:
        json.dump(doc, handle)
    os.replace(f"{out}.tmp", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
