"""The writer process: commits the batches of :mod:`tests.faults.model` as the sink does.

``python -m tests.faults.writer STATE_DIR [--control FILE] [--interval S] [--seed N]``

It writes through sparkiq's own changelog code (``tests.changelog.helpers.write_rows``: one
segment per partition, keys partitioned as Spark does, then the commit record), not through
Spark: a Spark pipeline would spend tens of seconds starting per restart and would make
"killed at a random point of a batch" a matter of JVM timing. The sink's contract is the same
here: a batch is visible only once its commit record exists, and a batch that did not
commit is written again, byte for byte, by the next attempt (Spark re-runs it).

Every :data:`SNAPSHOT_EVERY` batches it snapshots every partition, as an ``App`` does by
default, so a replica restored late in a long run starts from a snapshot rather than replaying
the whole history (which grows by 300-600 batches a minute here). A snapshot that fails is
left to the next one, as the App's maintenance does; it never makes a batch run again.

On start it resumes after the newest committed batch, so ``kill -9`` at any point (between
segments, inside a torn upload, before or after the commit record) and a restart must leave
every batch committed exactly once with exactly the model's changes. With ``--control`` its
storage is a :class:`~tests.faults.faultfs.FaultyFileSystem`; a failed write makes it retry
the same batch, as a failed micro-batch does.
"""

from __future__ import annotations

import argparse
import sys
import time

from sparkiq.changelog import Changelog
from sparkiq.changelog.snapshot import write_snapshot
from sparkiq.errors import ChangelogError
from tests.changelog.helpers import write_batch
from tests.faults.faultfs import faulty_storage
from tests.faults.model import PARTITIONS, TABLE, changes

#: The App's default ``snapshot_every``.
SNAPSHOT_EVERY = 100


def resume_point(changelog: Changelog) -> int:
    while True:
        try:
            ids = changelog.committed_batch_ids()
            return ids[-1] + 1 if ids else 0
        except (ChangelogError, OSError):
            time.sleep(0.02)


def run(state_dir: str, control: str | None, interval: float, seed: int) -> None:
    changelog = Changelog(state_dir, TABLE)
    changelog.manifest()
    if control:
        changelog.storage = faulty_storage(state_dir, control, seed)
    batch_id = resume_point(changelog)
    print(f"writer resumes at batch {batch_id}", flush=True)
    while True:
        started = time.monotonic()
        try:
            write_batch(changelog, batch_id, changes(batch_id))
        except (ChangelogError, OSError) as exc:
            print(f"batch {batch_id} failed, retrying: {exc}", flush=True)
            time.sleep(0.02)
            continue
        batch_id += 1
        if batch_id % SNAPSHOT_EVERY == 0:
            snapshot(changelog, batch_id - 1)
        time.sleep(max(0.0, interval - (time.monotonic() - started)))


def snapshot(changelog: Changelog, batch_id: int) -> None:
    for partition in range(PARTITIONS):
        try:
            write_snapshot(changelog, partition, batch_id)
        except (ChangelogError, OSError) as exc:
            print(f"snapshot of {partition} at batch {batch_id} failed: {exc}", flush=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="tests.faults.writer")
    parser.add_argument("state_dir")
    parser.add_argument("--control")
    parser.add_argument("--interval", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    run(args.state_dir, args.control, args.interval, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
