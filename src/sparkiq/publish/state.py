"""A table's whole state at one batch, from its snapshots and the batches after them: what an
empty topic starts with when the table's first batches are gone (retention deleted them).

Publishing to a topic that holds nothing needs no tombstones for what came before, so the
table's rows at its newest batch ``B``, produced as one transaction whose records carry
batch ``B``, followed by every batch after ``B``, give a topic whose compacted content is
the table: the cheap correct way to start late. (A topic that already holds batches but
lacks some is another matter: the keys deleted in the missing batches would stay in it.)

Each partition's state at ``B`` is its newest snapshot at or before ``B`` plus the changes of
every batch after the snapshot up to ``B``, as replicas restore (``complete``-mode batches
replace the partition). Nothing is written: the changelog is opened read-only.
"""

from __future__ import annotations

from sparkiq.changelog import Changelog
from sparkiq.changelog.snapshot import latest_snapshot

__all__ = ["state_at"]


def state_at(changelog: Changelog, batch_id: int) -> list[tuple[list[bytes], list[bytes]]] | str:
    """Every row of the table after ``batch_id``, by partition (encoded keys, encoded rows);
    or, when it cannot be rebuilt, a sentence saying what is missing."""
    partitions = changelog.manifest().partitions
    out = []
    for partition in range(partitions):
        base = latest_snapshot(changelog, partition, at_most=batch_id)
        state: dict[bytes, bytes] = {}
        start = 0
        if base is not None:
            info, keys, values = base
            state = dict(zip(keys, values, strict=True))
            start = info.batch_id + 1
        for next_id in range(start, batch_id + 1):
            record = changelog.read_commit(next_id)
            if record is None:
                where = "no snapshot" if base is None else f"its snapshot at batch {start - 1}"
                return f"partition {partition} has {where} and batch {next_id} after it is gone"
            if record.mode == "complete":
                state.clear()
            keys, rows = changelog.read_segment(record, partition)
            for key, row in zip(keys, rows, strict=True):
                if row is None:
                    state.pop(key, None)
                else:
                    state[key] = row
        out.append((list(state), list(state.values())))
    return out
