"""What ``sparkiq status`` shows: the tables of a state directory (batches kept, snapshots,
their writers and Kafka positions), the tables of attached checkpoints, and every node's
partitions as its ``status.json`` has them -- with a node that stopped or went silent said
to be so, never shown live.

Read from files alone (the changelog, checkpoints, each node's local directory): it works
with every node down, which is when it is needed most.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

__all__ = ["STALE_STATUS_SECONDS", "node_docs", "node_headline", "status_text", "watch_status"]

_NODE_ROW = "{:<24} {:>4} {:<9} {:>7} {:>5} {:>10} {:>12} {:>6}"


def watch_status(
    state_dir: str, local_dirs: list[str] | None, every: float, checkpoints: dict[str, str]
) -> int:
    """``sparkiq status --watch``: the status every ``every`` seconds until Ctrl-C."""
    if every <= 0:
        print("sparkiq status: --watch takes a positive number of seconds", file=sys.stderr)
        return 2
    try:
        if sys.stdout.isatty():
            from rich.console import Group, RenderableType
            from rich.live import Live
            from rich.text import Text

            from sparkiq.output import restore_bars

            with Live(auto_refresh=False, transient=False) as live:
                while True:
                    stamp = time.strftime("%H:%M:%S")
                    text = watched_text(state_dir, local_dirs, checkpoints)
                    parts: list[RenderableType] = [Text(text)]
                    for local_dir, doc in node_docs(state_dir, local_dirs):
                        if doc is None or node_headline(doc, local_dir, time.time())[1]:
                            continue  # no status, or a node gone: nothing is restoring
                        bars = restore_bars(doc.get("partitions", []))
                        if bars is not None:  # restores in progress: a bar each
                            parts += [Text(f"\nnode {doc.get('node_id')!r} restoring"), bars]
                    parts.append(Text(f"\n{stamp}, every {every:g} s; Ctrl-C stops"))
                    live.update(Group(*parts))
                    live.refresh()
                    time.sleep(every)
        while True:  # not a terminal: nothing to redraw, each update follows the last
            print(f"-- {time.strftime('%H:%M:%S')}", flush=True)
            print(watched_text(state_dir, local_dirs, checkpoints) + "\n", flush=True)
            time.sleep(every)
    except KeyboardInterrupt:
        return 0


def watched_text(state_dir: str, local_dirs: list[str] | None, checkpoints: dict[str, str]) -> str:
    """One ``--watch`` update; a checkpoint that became unreadable is shown, not raised."""
    from sparkiq.errors import SparkiqError

    try:
        return status_text(state_dir, local_dirs, checkpoints)[1]
    except SparkiqError as exc:
        return f"sparkiq status: {exc.message}"


def status_text(
    state_dir: str, local_dirs: list[str] | None, checkpoints: dict[str, str] | None = None
) -> tuple[int, str]:
    """The status report and the exit code that goes with it (1: no tables and no node).

    Tables are the state_dir's materialized ones, then those served from ``checkpoints``
    (``{name: uri}``, as ``sparkiq serve --checkpoint``); a checkpoint that cannot be read
    raises :class:`~sparkiq.errors.SparkiqError`."""
    lines: list[str] = []
    add = lines.append

    from sparkiq.changelog import Changelog, list_tables
    from sparkiq.changelog.snapshot import snapshot_summary
    from sparkiq.checkpoint.source import CheckpointCatalog
    from sparkiq.serving.kafka_lag import committed_lines, kafka_lines
    from sparkiq.serving.writer_view import read_view, writer_lines
    from sparkiq.topics.lag import topic_lines

    tables = list_tables(state_dir)
    attached = [CheckpointCatalog(uri, name) for name, uri in (checkpoints or {}).items()]
    nodes = node_docs(state_dir, local_dirs)
    none = (
        f"no sparkiq tables in {state_dir!r} (for the tables of a Spark checkpoint: "
        "--checkpoint NAME=URI)"
    )
    if not tables and not attached and not nodes:
        return 1, none
    if tables or attached:
        add(
            f"{'table':<24} {'parts':>5} {'key':<20} {'batches kept':>14} {'newest':>7} "
            f"{'snapshot':>9}"
        )
    else:  # only nodes: they may serve checkpoints this command was not told of
        add(none)

    def table_line(
        name: str, partitions: int, key: str, batches: list[int], snapshots: list[int | None]
    ) -> None:
        kept = f"{batches[0]}..{batches[-1]}" if batches else "-"
        known = [s for s in snapshots if s is not None]  # "-" unless every partition has one
        snapshot = str(min(known)) if known and len(known) == len(snapshots) else "-"
        newest = batches[-1] if batches else "-"
        add(f"{name:<24} {partitions:>5} {key:<20} {kept:>14} {newest!s:>7} {snapshot:>9}")

    for name in tables:
        changelog = Changelog(state_dir, name)
        manifest = changelog.manifest()
        key = ",".join(manifest.key_columns) + (
            f" [{manifest.window_column}]" if manifest.window_column else ""
        )
        summary = snapshot_summary(changelog, manifest.partitions)
        batches = changelog.committed_batch_ids()
        table_line(name, manifest.partitions, key, batches, list(summary.values()))
        newest = changelog.read_commit(batches[-1]) if batches else None
        if newest is not None:  # what the writer read of each Kafka topic, by its newest batch
            lines.extend(committed_lines(newest.position, newest.batch_id))
        lines.extend(writer_lines(read_view(state_dir, name, time.time())))
    for catalog in attached:
        names = catalog.names()
        for name in names:
            # batches kept: the commits Spark's maintenance has not deleted yet; snapshot:
            # the oldest of the partitions' newest Spark snapshots
            source = catalog.open(name)
            manifest = source.manifest()
            newest_snapshots: list[int | None] = []
            for partition in range(manifest.partitions):
                found = source.snapshots(partition)
                newest_snapshots.append(found[-1].batch_id if found else None)
            key = ",".join(manifest.key_columns)
            table_line(
                name, manifest.partitions, key, source.committed_batch_ids(), newest_snapshots
            )
        shown = ", ".join(names) if names else "no state stores yet"
        add(f"  {catalog.name}: checkpoint {catalog.uri} ({shown})")
    for local_dir, doc in nodes:
        if doc is None:
            add(f"\nnode at {local_dir}: no status.json (never started, or not a node)")
            continue
        headline, gone = node_headline(doc, local_dir, time.time())
        add(headline)
        header = ("table", "part", "state", "batch", "lag", "rows", "applied", "ETA")
        add("  " + _NODE_ROW.format(*header))
        for p in doc.get("partitions", []):
            eta = "-" if p.get("eta_seconds") is None or gone else f"{p['eta_seconds']:.0f}s"
            rows = "-" if p.get("rows") is None else p["rows"]
            state = gone or p["state"]  # what a node that is gone last said is not current
            fields = (p["table"], p["partition"], state, p["batch_id"], p["lag_batches"])
            add("  " + _NODE_ROW.format(*fields, rows, p["restored_rows"], eta))
            if p.get("error"):
                add(f"      error: {p['error']}")
        kafka = kafka_lines(doc.get("kafka") or [], doc.get("kafka_bootstrap"), time.time())
        lines.extend("  " + line for line in kafka)
        lines.extend("  " + line for line in topic_lines(doc.get("topics") or []))
    return 0, "\n".join(lines)


#: A running node rewrites its status.json every second or two; one older than this is from
#: a node that was killed, is paused or cannot write (generous: a loaded machine is late).
STALE_STATUS_SECONDS = 30.0


def node_headline(doc: dict[str, Any], local_dir: str, now: float) -> tuple[str, str]:
    """The line heading a node's partitions, and the state to show them in when the node is
    gone ("stopped", "stale"; empty while it runs)."""
    name = f"node {doc.get('node_id')!r} ({local_dir})"
    stopped_at = doc.get("stopped_at")
    if stopped_at is not None:
        return f"\n{name}: STOPPED {now - float(stopped_at):.0f} s ago; as it left them:", "stopped"
    age = now - float(doc.get("updated_at", 0))
    if age > STALE_STATUS_SECONDS:
        return (
            f"\n{name}: NOT UPDATED for {age:.0f} s (a running node updates it every second or "
            "two: killed, paused, or unable to write its local directory?); as it last said:",
            "stale",
        )
    return f"\n{name}, updated {age:.0f} s ago", ""


def node_docs(
    state_dir: str, local_dirs: list[str] | None
) -> list[tuple[str, dict[str, Any] | None]]:
    """Per node local directory (given, or every one under ``<state_dir>/replicas``), its
    ``status.json`` (see ``Hosting.write_status_file``), or None when it has none."""
    if local_dirs is None and "://" not in state_dir:
        root = os.path.join(os.path.abspath(state_dir), "replicas")
        local_dirs = (
            [os.path.join(root, d) for d in sorted(os.listdir(root))] if os.path.isdir(root) else []
        )
    out: list[tuple[str, dict[str, Any] | None]] = []
    for local_dir in local_dirs or []:
        try:
            with open(os.path.join(local_dir, "status.json")) as handle:
                doc = json.load(handle)
        except (OSError, ValueError):
            doc = None
        out.append((local_dir, doc if isinstance(doc, dict) else None))
    return out
