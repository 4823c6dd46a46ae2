"""A table with a history window, written batch by batch, and a plain-Python model of every
key's versions: the ground truth of the versioned key query tests.

The model knows nothing of the stores: it keeps the table's state after every batch and
derives a key's versions as maximal runs of batches with the same row, clipped to the window
``[oldest, seen_at]`` -- what ``VersionedKeyQuery`` / ``MultiVersionedKeyQuery`` document.
"""

from __future__ import annotations

import datetime as dt
import random
import time
from dataclasses import dataclass, field
from typing import Any

from sparkiq import VersionedRecord
from sparkiq.changelog import Changelog, TableManifest
from sparkiq.schema.types import TableSchema
from sparkiq.stores.history import History
from tests.changelog.helpers import SCHEMA_JSON, write_batch

KEYS = [f"k{i:02d}" for i in range(24)]


def make_history_table(
    state_dir: str, history: History, name: str = "t", partitions: int = 4
) -> Changelog:
    """A string-keyed ``(k, n)`` table that keeps ``history``."""
    schema = TableSchema.from_spark_json(SCHEMA_JSON, ["k"], None)
    manifest = TableManifest(
        name=name, schema=schema, partitions=partitions, output_mode="update", history=history
    )
    changelog = Changelog(state_dir, name)
    manifest.ensure_written(changelog.storage, changelog.manifest_path)
    return changelog


@dataclass
class Model:
    """The table's state after each batch, and each batch's commit time."""

    states: list[dict[str, dict[str, Any]]] = field(default_factory=list)
    committed_at: list[float] = field(default_factory=list)

    @property
    def newest(self) -> int:
        return len(self.states) - 1

    def write(self, changelog: Changelog, rows: dict[str, int | None]) -> None:
        """Write the next batch and record it (commit times strictly grow)."""
        batch_id = len(self.states)
        if self.committed_at:  # distinct commit times, a millisecond apart at least
            while time.time() < self.committed_at[-1] + 0.002:
                time.sleep(0.001)
        record = write_batch(changelog, batch_id, rows)
        state = dict(self.states[-1]) if self.states else {}
        for key, n in rows.items():
            if n is None:
                state.pop(key, None)
            else:
                state[key] = {"k": key, "n": n}
        self.states.append(state)
        self.committed_at.append(record.committed_at)

    def write_random(self, changelog: Changelog, count: int, rng: random.Random) -> None:
        """``count`` batches of updates, deletions and rewrites of an equal row."""
        for _ in range(count):
            rows: dict[str, int | None] = {}
            current = self.states[-1] if self.states else {}
            for key in rng.sample(KEYS, rng.randint(1, 8)):
                roll = rng.random()
                if roll < 0.2:
                    rows[key] = None
                elif roll < 0.4 and key in current:
                    rows[key] = current[key]["n"]  # the same row again: no new version
                else:
                    rows[key] = rng.randint(0, 5)
            self.write(changelog, rows)

    def time_of(self, batch_id: int) -> dt.datetime:
        return dt.datetime.fromtimestamp(self.committed_at[batch_id], dt.UTC)

    def between(self, batch_id: int) -> dt.datetime:
        """A time after batch ``batch_id`` was committed and before the next one was."""
        later = (
            self.committed_at[batch_id + 1]
            if batch_id < self.newest
            else self.committed_at[batch_id] + 1
        )
        return dt.datetime.fromtimestamp((self.committed_at[batch_id] + later) / 2, dt.UTC)

    def versions(self, key: str, oldest: int, seen_at: int | None = None) -> list[VersionedRecord]:
        """``key``'s versions within ``[oldest, seen_at]``, ascending."""
        last = self.newest if seen_at is None else seen_at
        runs: list[list[Any]] = []  # [valid_from, valid_to or None, row]
        for batch_id in range(oldest, last + 1):
            row = self.states[batch_id].get(key)
            if runs and runs[-1][1] is None and runs[-1][2] != row:
                runs[-1][1] = batch_id
            if row is not None and (not runs or runs[-1][1] is not None):
                runs.append([batch_id, None, row])
        return [
            VersionedRecord(
                row,
                start,
                end,
                self.time_of(start),
                None if end is None else self.time_of(end),
            )
            for start, end, row in runs
        ]

    def version_at(
        self, key: str, oldest: int, batch_id: int, seen_at: int | None = None
    ) -> VersionedRecord | None:
        for record in self.versions(key, oldest, seen_at):
            if record.valid_from <= batch_id and (
                record.valid_to is None or batch_id < record.valid_to
            ):
                return record
        return None
