"""Membership by gossip as processes: ``sparkiq serve --membership gossip`` on this host,
against the in-process members of bench/membership_gossip.py at the same size and table.

bench/membership_gossip.py measures up to 100 members in one process (real coordinators and
SWIM loops over a counting in-process transport, simulated hosting). This checks it against
the real thing: N ``sparkiq serve`` processes (bench/_serve_cluster.py), started a little
apart on the first as seed, hosting a real table (``t``, RocksDB replicas, one standby), over
HTTP on 127.0.0.1. Once every process agrees and hosts its partitions, and a quiet period
later (after a start every member's record is new and spreads to all, several times over),
per process over a window: messages sent (probes and probe requests, and the acks it gave)
and their bytes per second from its own ``/metrics``, CPU from ``/proc/<pid>/stat``, private
memory. N in-process members over the same table give the same two figures, measured as
long after they settled. Then, on the processes, a join, a planned leave (SIGTERM) and a
``kill -9``, each while a client looks keys up through a random live process (``GET
/stores/t/keys/{key}``, every answer checked against the row written; a joiner from when
it answers HTTP, as a load balancer's health check would let it): seconds until every
process's live view (its ``/metadata``) is the new membership, replica slots moved (the
ideal is 1/N of them), partitions the processes opened (their logs), lookups failed.

A size whose processes would not fit in this host's available memory (the private memory
of a member of the size before times N, with a margin) or would take more than
:data:`CPU_SHARE` of its cores at rest (the CPU of a member of the size before times N) is
left out, with a note: 100 processes on a shared two-core host flapped (views dropping
members, partitions reopened) rather than settled.

Run: ``python -m bench.membership_processes [--quick | --smoke]``.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Sequence
from typing import Any

import httpx

from bench._changelog import SCHEMA_JSON, key_name
from bench._common import Report, Scale, entry_point, load_average, scratch_dir
from bench._members import Placement
from bench._serve_cluster import ServeCluster, Traffic, available_mb
from bench.membership import AGREE_LIMIT_S, AGREE_TARGET_S, FAILURE, INTERVAL, Change, _steady
from bench.membership_gossip import CHANGE_COLUMNS, GossipCluster, change_row
from sparkiq.testing import write_table

#: Keys in the table (each partition holds some).
KEYS = 2_000
#: Memory kept free besides the processes (MB): the benchmark, the other users of the host.
RESERVE_MB = 3_000
#: The most of this host's cores N processes may take at rest: past it they starve each
#: other (and whoever shares the host) as soon as anything changes, and views flap.
CPU_SHARE = 0.4


class Lookups(threading.Thread):
    """Key lookups through random live processes, ``rate`` a second, each answer checked."""

    def __init__(self, cluster: ServeCluster, rate: float, exclude: set[str], seed: int):
        super().__init__(daemon=True)
        self.cluster, self.rate, self.exclude = cluster, rate, exclude
        self.rng = random.Random(seed)
        self.made = self.failed = 0
        self.failures: list[str] = []
        self.halt = threading.Event()

    def run(self) -> None:
        with httpx.Client(timeout=10) as http:
            while not self.halt.wait(1 / self.rate):
                entry = [m for i, m in list(self.cluster.members.items()) if i not in self.exclude]
                member = self.rng.choice(entry)
                i = self.rng.randrange(KEYS)
                self.made += 1
                try:
                    response = http.get(f"{member.url}/stores/t/keys/{key_name(i)}")
                    ok = response.status_code == 200 and response.json()["row"]["n"] == i
                    why = "" if ok else f"{response.status_code}: {response.text[:200]}"
                except (httpx.HTTPError, ValueError, KeyError) as exc:
                    ok, why = False, f"{type(exc).__name__}: {exc}"
                if not ok:
                    self.failed += 1
                    self.failures.append(f"{member.node_id}: {why}")


def _change(
    cluster: ServeCluster, placement: Placement, kind: str, node_id: str, scale: Scale
) -> Change:
    before = tuple(sorted(cluster.members))
    after = tuple(sorted({*before, node_id} if kind == "join" else set(before) - {node_id}))
    # a leaving member's clients are not ours to serve; a joiner takes clients once it serves
    exclude = {node_id}
    lookups = Lookups(cluster, scale.pick(50.0, 50.0, 20.0), exclude, seed=len(before))
    lookups.start()
    time.sleep(scale.pick(2.0, 1.0, 0.1))
    opened = sum(m.opened() for m in cluster.members.values())
    if kind == "join":
        # from when the joiner serves: an interpreter's start is not membership's
        joiner = cluster.start(node_id)
        cluster.wait_answering(joiner, 120)
        exclude.discard(node_id)
    elif kind == "leave":
        cluster.leave(node_id)
    else:
        cluster.kill(node_id)
    event = time.monotonic()
    agreed = cluster.wait("agreed", AGREE_LIMIT_S, since=event)
    cluster.wait("ready", AGREE_LIMIT_S)
    time.sleep(scale.pick(2.0, 1.0, 0.1))
    lookups.halt.set()
    lookups.join()
    opened_after = sum(m.opened() for i, m in cluster.members.items() if i in after)
    if kind != "join":
        opened -= cluster.gone[-1].opened()
    return Change(
        agreed,
        placement.moved(before, after),
        len(placement.keys) * (1 + placement.standbys),
        opened_after - opened,
        lookups.made,
        lookups.failed,
        lookups.failures[:3],
    )


def _steady_processes(cluster: ServeCluster, window: float) -> dict[str, float]:
    """Per process over ``window`` s: messages/s, KB/s, CPU ms/s (mean and max), private MB;
    and the times a process saw a member leave its live view meanwhile (none left)."""
    drops = sum(m.drops() for m in cluster.members.values())
    first, started = cluster.traffic(), time.monotonic()
    time.sleep(window)
    last = cluster.traffic()
    drops = sum(m.drops() for m in cluster.members.values()) - drops
    wall = time.monotonic() - started
    both = [(first[i], last[i]) for i in first if i in last]

    def rate(pick: Any) -> list[float]:
        return [(pick(b) - pick(a)) / wall for a, b in both]

    def messages(t: Traffic) -> float:
        return t.messages

    def sizes(t: Traffic) -> float:
        return t.bytes

    def cpu(t: Traffic) -> float:
        return t.cpu_s

    cpus = [c * 1000 for c in rate(cpu)]
    private = [m.private_mb() for m in cluster.members.values()]
    return {
        "messages_s": sum(rate(messages)) / len(both),
        "kbytes_s": sum(rate(sizes)) / len(both) / 1024,
        "cpu_ms_s": sum(cpus) / len(cpus),
        "cpu_ms_s_max": max(cpus),
        "busy_cores": sum(cpus) / 1000,
        "private_mb": sum(private) / len(private),
        "view_drops": drops,
    }


def _in_process(
    n: int, partitions: int, window: float, quiet: float, interval: float, failure: float
) -> Any:
    """bench/membership_gossip.py's members at the same size and table, no new batches (the
    processes' table gets none either), measured ``quiet`` s after they settled."""
    cluster = GossipCluster(n, {"t": partitions}, interval, failure)
    cluster.batch_every = None
    try:
        for node_id in cluster.ids[:n]:
            cluster.add(node_id)
        cluster.wait("settled", 180)
        time.sleep(quiet)
        return _steady(cluster, window)
    finally:
        cluster.stop()


def run(scale: Scale = Scale.FULL) -> Report:
    logs = logging.getLogger("sparkiq")
    level = logs.level
    logs.setLevel(logging.ERROR)  # the in-process members log every change of every view
    try:
        with scratch_dir("membership-processes") as root:
            return _run(scale, root)
    finally:
        logs.setLevel(level)


def _run(scale: Scale, root: str) -> Report:
    # smoke: two members (and the joiner) still go through the join, the leave and the kill
    sizes: Sequence[int] = scale.pick((10, 25, 50, 100), (10, 25), (2,))
    partitions = scale.pick(200, 100, 8)
    window = scale.pick(10.0, 5.0, 0.5)
    stagger = scale.pick(0.5, 0.5, 0.0)
    # after a start every member's record is new and travels to all, several times over: the
    # steady state is measured once that has passed (a new record a change, after that)
    # (at 50 processes that took about a minute: 1.5 s a member, 30 s at least)
    quiet_least, quiet_per_member = scale.pick((30.0, 1.5), (10.0, 1.5), (0.0, 0.0))
    interval, failure = scale.pick((INTERVAL, FAILURE), (INTERVAL, FAILURE), (0.2, 1.0))
    report = Report(
        name="membership_processes",
        title="Membership by gossip as processes: sparkiq serve vs in-process members",
        measures=(
            f"N `sparkiq serve --membership gossip` processes on this host hosting a real "
            f"table of {partitions:,} partitions (RocksDB, 1 standby), period {interval:g} s, "
            f"failure floor {failure:g} s: per process, messages and bytes sent per second "
            f"(its /metrics) and CPU (/proc) over {window:g} s, {quiet_per_member:g} s a member "
            f"({quiet_least:g} s at least) after all agreed "
            "and hosted what they are assigned; N in-process members "
            "(bench/membership_gossip.py) over the same table; then a join, a planned leave "
            "(SIGTERM) and a kill -9 under lookups through random live processes: seconds until "
            "every process's live view agrees, replica slots moved, lookups failed"
        ),
        baseline="the in-process members at the same N (messages and bytes per member)",
        target=(
            f"processes send what in-process members do (messages, bytes); per-process "
            f"messages and CPU flat within 2x from 10 up; agreement <= {AGREE_TARGET_S:.0f} s; "
            "0 failed lookups during a planned join or leave"
        ),
        columns=[
            "members",
            "partitions per member",
            "messages/s per member: processes",
            "in-process",
            "KB/s per member: processes",
            "in-process",
            "CPU ms/s per process: mean / max",
            "all processes' CPU (cores)",
            "private MB per process",
            "live-view drops in the window",
        ],
        scale=scale,
    )
    state_dir = os.path.join(root, "state")
    rows = [{"k": key_name(i), "n": i, "total": float(i)} for i in range(KEYS)]
    write_table(state_dir, "t", rows, key="k", schema=SCHEMA_JSON, partitions=partitions)
    changes_rows: list[list[str]] = []
    figures: dict[str, Any] = {}
    private_mb = at_rest_ms = 0.0
    for n in sizes:
        if private_mb and (n + 1) * private_mb * 1.3 + RESERVE_MB > available_mb():
            report.notes.append(
                f"{n} processes left out: {n + 1} of {private_mb:.0f} MB each would not fit in the "
                f"{available_mb():,.0f} MB available (with {RESERVE_MB:,} MB kept free)"
            )
            continue
        cores = os.cpu_count() or 1
        if at_rest_ms and n * at_rest_ms / 1000 > CPU_SHARE * cores:
            report.notes.append(
                f"{n} processes left out: at {at_rest_ms:.1f} ms/s each at rest (the size "
                f"before) they would take {n * at_rest_ms / 1000:.1f} of this host's {cores} "
                f"cores before any change, more than {CPU_SHARE:.0%} of them"
            )
            continue
        quiet = max(quiet_least, quiet_per_member * n)
        log_dir = os.path.join(root, f"logs-{n}")
        os.makedirs(log_dir)
        ids = [f"n{i}" for i in range(n + 1)]  # one more: the process that joins
        placement = Placement(ids, {"t": partitions})
        cluster = ServeCluster(state_dir, log_dir, interval=interval, failure=failure)
        try:
            started = time.monotonic()
            cluster.wait_answering(cluster.start(ids[0]), 120)
            for node_id in ids[1:n]:
                cluster.start(node_id)
                time.sleep(stagger)  # n interpreters starting at once would starve each other
            if cluster.wait("agreed", 300) is None or cluster.wait("ready", 300) is None:
                members = cluster.members.values()
                report.notes.append(
                    f"{n} processes did not settle in 300 s ({sum(m.drops() for m in members):,} "
                    f"live-view drops, {sum(m.opened() for m in members):,} partitions opened "
                    f"for {2 * partitions:,} replicas); measured as they were"
                )
            settle_s = time.monotonic() - started
            time.sleep(quiet)
            steady = _steady_processes(cluster, window)
            figure: dict[str, Any] = {**steady, "settle_s": settle_s}
            for kind, victim in (("join", ids[n]), ("leave", ids[n]), ("kill", ids[1])):
                change = _change(cluster, placement, kind, victim, scale)
                changes_rows.append(change_row(n, kind, change))
                figure[f"{kind}_agreed_s"] = change.agreed_s
                figure[f"{kind}_failed"] = change.failed
                figure[f"{kind}_lookups"] = change.lookups
                if change.failures:
                    report.console.append(f"{n} {kind}: failures {change.failures}")
        finally:
            cluster.stop()
        private_mb = max(private_mb, steady["private_mb"])
        at_rest_ms = steady["cpu_ms_s"]
        # the processes stopped first: in-process members get the host they had
        local = _in_process(n, partitions, window, quiet, interval, failure)
        figure["in_process_messages_s"] = local.messages_s
        figure["in_process_kbytes_s"] = local.kbytes_s
        figures[str(n)] = figure
        report.rows.append(
            [
                str(n),
                f"{partitions * 2 / n:,.0f}",
                f"{steady['messages_s']:.2f}",
                f"{local.messages_s:.2f}",
                f"{steady['kbytes_s']:.2f}",
                f"{local.kbytes_s:.2f}",
                f"{steady['cpu_ms_s']:.1f} / {steady['cpu_ms_s_max']:.1f}",
                f"{steady['busy_cores']:.2f}",
                f"{steady['private_mb']:.0f}",
                f"{steady['view_drops']:.0f}",
            ]
        )
    report.more_tables.append((CHANGE_COLUMNS, changes_rows))
    report.figures["by_members"] = figures
    report.readings.extend(_readings(figures))
    report.notes.append(f"load average at the end: {load_average()}")
    return report


def _readings(figures: dict[str, Any]) -> list[str]:
    if not figures:
        return ["no size fitted this host"]
    out = []
    ratios = [
        f"{n}: {f['messages_s'] / f['in_process_messages_s']:.2f}x messages, "
        f"{f['kbytes_s'] / f['in_process_kbytes_s']:.2f}x bytes"
        for n, f in figures.items()
        if f["in_process_messages_s"] and f["in_process_kbytes_s"]
    ]
    out.append("processes vs in-process members per member: " + "; ".join(ratios))
    sizes = list(figures)
    low, high = sizes[0], sizes[-1]
    if low != high:
        for key, what in (("messages_s", "messages"), ("cpu_ms_s", "CPU")):
            a, b = figures[low][key], figures[high][key]
            growth = b / a if a else float("inf")
            out.append(
                f"processes: {what} per process grow {growth:.1f}x (target <= 2x: "
                f"{'met' if growth <= 2 else 'missed'}) from {low} to {high} ({a:.1f} to {b:.1f})"
            )
    times = [figures[n].get(f"{k}_agreed_s") for n in figures for k in ("join", "leave", "kill")]
    slowest = max(t if t is not None else float("inf") for t in times)
    shown = f"{slowest:.1f} s" if slowest != float("inf") else f"over {AGREE_LIMIT_S:.0f} s"
    planned = sum(int(figures[n][f"{k}_failed"] or 0) for n in figures for k in ("join", "leave"))
    killed = sum(int(figures[n]["kill_failed"] or 0) for n in figures)
    asked = sum(int(figures[n]["kill_lookups"] or 0) for n in figures)
    out.append(
        f"processes: slowest agreement {shown} (target <= {AGREE_TARGET_S:.0f} s: "
        f"{'met' if slowest <= AGREE_TARGET_S else 'missed'}); failed lookups during planned "
        f"joins and leaves: {planned} (target 0), during kills: {killed} of {asked}"
    )
    return out


main = entry_point(run, __doc__)

if __name__ == "__main__":
    main()
