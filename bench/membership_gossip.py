"""Membership by gossip (``membership="gossip"``), measured on real coordinators.

The same N in-process members as bench/membership.py (real coordinators -- here the SWIM
loop of sparkiq.cluster.swim_loop and the view of sparkiq.cluster.swim, hosted state as
versioned records -- with simulated hosting, over a counting in-process transport), at
10,000 partitions, every partition reporting a new batch every second (a member's record
then takes a new version every ``batch_refresh``, 10 periods): per member, messages and
bytes sent per second and CPU over a window, and how old the hosted records held of the
others are (the owner's version minus the one held: versions are microseconds of the wall
clock, so this is how much newer the owner's state is); then a join, a planned leave and a
kill under 100 lookups/s: seconds until every member's live view agrees, replica slots moved
(the ideal is 1/N of them), partitions opened, lookups failed.
bench/membership.py's first table is the same measure under all-to-all heartbeats.

Run: ``python -m bench.membership_gossip [--quick | --smoke]``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from bench._common import Report, Scale, entry_point
from bench._members import SimNode
from bench.membership import (
    AGREE_LIMIT_S,
    AGREE_TARGET_S,
    CHANGE_COLUMNS,
    FAILURE,
    INTERVAL,
    Change,
    Cluster,
    _change,
    _growth,
    _seconds,
    _steady,
)
from sparkiq.cluster.swim import GossipMembership

#: Every member's partitions report a new batch this often (s): hosted records keep changing.
BATCH_EVERY = 1.0


class GossipCluster(Cluster):
    """bench/membership.py's cluster with every member on gossip."""

    #: Every member's partitions report a new batch this often (None: never).
    batch_every: float | None = BATCH_EVERY

    def add(self, node_id: str) -> SimNode:
        seeds = [] if node_id == self.ids[0] else [f"local://{self.ids[0]}"]
        node = SimNode(
            node_id,
            seeds,
            self.transport,
            self.placement,
            heartbeat_interval=self.interval,
            failure_timeout=self.failure,
            membership="gossip",
            batch_every=self.batch_every,
        )
        self.nodes[node_id] = node
        return node.start()


def run(scale: Scale = Scale.FULL) -> Report:
    quiet = logging.getLogger("sparkiq")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # 100 members log every change of every view
    try:
        return _run(scale)
    finally:
        quiet.setLevel(level)


def _run(scale: Scale) -> Report:
    sizes: Sequence[int] = scale.pick((10, 25, 50, 100), (10, 25), (3,))
    partitions = scale.pick(10_000, 10_000, 40)
    tables = {f"t{i}": partitions // 4 for i in range(4)}
    window = scale.pick(10.0, 5.0, 1.0)
    interval, failure = scale.pick((INTERVAL, FAILURE), (INTERVAL, FAILURE), (0.1, 1.0))
    report = Report(
        name="membership_gossip",
        title="Membership by gossip: cost per node and agreement after a change",
        measures=(
            f"N in-process members on gossip (real coordinators and SWIM loops, simulated "
            f"hosting) serving {partitions:,} partitions (4 tables, 1 standby), period "
            f"{interval:g} s, failure floor {failure:g} s, a new batch on every partition every "
            f"{BATCH_EVERY:g} s: per member, messages and bytes sent "
            f"per second and CPU over {window:g} s; then a join, a leave and a kill under 100 "
            "lookups/s: seconds until every member's live view agrees, replica slots moved, "
            "lookups failed"
        ),
        baseline="the 10-member row: per-member cost should stay within 2x of it up to 100",
        target=(
            f"per-member messages and CPU flat within 2x from 10 to 100 members; agreement "
            f"<= {AGREE_TARGET_S:.0f} s; 0 failed lookups during a planned join or leave"
        ),
        columns=[
            "members",
            "partitions per member",
            "messages/s per member",
            "KB/s per member",
            "CPU ms/s per member",
            "process CPU (cores)",
            "hosted record age s: mean / max",
        ],
        scale=scale,
    )
    figures: dict[str, Any] = {}
    changes_rows: list[list[str]] = []
    for n in sizes:
        cluster = GossipCluster(n, tables, interval, failure)
        try:
            for node_id in cluster.ids[:n]:
                cluster.add(node_id)
            if cluster.wait("settled", 180) is None:
                report.notes.append(f"{n} members did not settle in 180 s; measured as they were")
            steady = _steady(cluster, window)
            lag_mean, lag_max = _record_lag(cluster)
            row = [
                str(n),
                f"{partitions * 2 / n:,.0f}",
                f"{steady.messages_s:,.1f}",
                f"{steady.kbytes_s:,.1f}",
                f"{steady.cpu_ms_s:,.1f}",
                f"{steady.busy_cores:.2f}",
                f"{lag_mean:.1f} / {lag_max:.1f}",
            ]
            figure: dict[str, Any] = {
                "messages_s": steady.messages_s,
                "kbytes_s": steady.kbytes_s,
                "cpu_ms_s": steady.cpu_ms_s,
                "busy_cores": steady.busy_cores,
                "record_lag_mean_s": lag_mean,
                "record_lag_max_s": lag_max,
            }
            joiner = cluster.ids[n]
            for kind, victim in (("join", joiner), ("leave", joiner), ("kill", cluster.ids[1])):
                change = _change(cluster, kind, victim, scale)
                changes_rows.append(change_row(n, kind, change))
                figure[f"{kind}_agreed_s"] = change.agreed_s
                figure[f"{kind}_failed"] = change.failed
                figure[f"{kind}_moved_x_ideal"] = moved_x_ideal(n, kind, change)
                if change.failures:
                    report.console.append(f"{n} {kind}: failures {change.failures}")
            report.rows.append(row)
            figures[str(n)] = figure
        finally:
            cluster.stop()
    report.more_tables.append((CHANGE_COLUMNS, changes_rows))
    report.figures["by_members"] = figures
    report.readings.extend(_readings(figures, sizes))
    return report


def moved_x_ideal(n: int, kind: str, change: Change) -> float:
    """Replica slots moved over the ideal: 1/N of them, N the members with the joiner (join,
    leave) or before the kill."""
    return change.moved / (change.slots / (n + 1 if kind != "kill" else n))


def change_row(n: int, kind: str, change: Change) -> list[str]:
    """A row of :data:`CHANGE_COLUMNS`."""
    return [
        str(n),
        kind,
        _seconds(change.agreed_s),
        f"{change.moved:,} ({moved_x_ideal(n, kind, change):.2f}x ideal)",
        f"{change.opened:,}",
        f"{change.failed}/{change.lookups}",
    ]


def _record_lag(cluster: Cluster) -> tuple[float, float]:
    """Mean and largest age (s) of the hosted records members hold of each other now."""
    views = {}
    for node_id, node in list(cluster.nodes.items()):
        view = node.coordinator.membership
        assert isinstance(view, GossipMembership)
        views[node_id] = view
    own = {i: v.hosted_version(i) for i, v in views.items()}
    lags = [
        max(0, own[other] - view.hosted_version(other)) / 1e6
        for i, view in views.items()
        for other in views
        if other != i
    ]
    return (sum(lags) / len(lags), max(lags)) if lags else (0.0, 0.0)


def _readings(figures: dict[str, Any], sizes: Sequence[int]) -> list[str]:
    low, high = str(sizes[0]), str(sizes[-1])
    out = []
    if low != high:
        for key, what in (("messages_s", "messages"), ("cpu_ms_s", "CPU")):
            by_size = {n: figures[n][key] for n in figures}
            out.append(
                f"gossip: {what} per member grow {_growth(by_size, low, high)} from {low} to "
                f"{high} members ({by_size[low]:.1f} to {by_size[high]:.1f})"
            )
    times = [figures[n].get(f"{k}_agreed_s") for n in figures for k in ("join", "leave", "kill")]
    slowest = max(t if t is not None else float("inf") for t in times)
    shown = f"{slowest:.1f} s" if slowest != float("inf") else f"over {AGREE_LIMIT_S:.0f} s"
    planned = sum(int(figures[n][f"{k}_failed"] or 0) for n in figures for k in ("join", "leave"))
    out.append(
        f"gossip: slowest agreement {shown} (target <= {AGREE_TARGET_S:.0f} s: "
        f"{'met' if slowest <= AGREE_TARGET_S else 'missed'}); failed lookups during planned "
        f"joins and leaves: {planned} (target 0)"
    )
    moved = [figures[n][f"{k}_moved_x_ideal"] for n in figures for k in ("join", "leave", "kill")]
    out.append(
        f"gossip: replica slots moved per change {min(moved):.2f}x to {max(moved):.2f}x the "
        "ideal (1/N of them)"
    )
    lags = [figures[n]["record_lag_max_s"] for n in figures]
    out.append(f"gossip: hosted records held of others at most {max(lags):.1f} s old")
    return out


main = entry_point(run, __doc__)

if __name__ == "__main__":
    main()
