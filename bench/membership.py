"""Membership at scale: what heartbeats cost per node, and how fast a change is agreed on.

N members (4 to 100) of one cluster serve 10,000 partitions in all (4 tables of 2,500, one
standby each), with the production timings (heartbeat every 0.5 s, failure floor 3 s). They
run in this process (bench/_members.py: real coordinators, simulated hosting) over one
in-process transport; a first table checks that such members send the same heartbeats per
second as ``sparkiq serve`` processes (their ``sparkiq_heartbeats_total``).

Steady state, per member: heartbeat messages sent per second (requests and the replies it
gives), their bytes (packed documents), and CPU (the process's CPU-seconds over the window
divided by N: members share the process, so this includes their contention for it; on a
shared two-core machine CPU-seconds move less with load than wall time). Then three
changes, each while a client looks keys up through random members (100 a second): a member
joins; a member leaves (stops as a node does on shutdown: there is no leave message, so the
others learn it when their next heartbeat is refused, as from a process killed on a host that
is still up); a member is killed silently (stops sending and answers nothing, as a host that
crashed or was cut off: its silence is left to the failure detector). For each: the seconds
until every member's view is the new membership, the replica slots that move (the ideal is
1/N of them), the partitions members actually opened meanwhile, and the lookups that failed.

Run: ``python -m bench.membership [--quick | --smoke]``.
"""

from __future__ import annotations

import logging
import os
import random
import re
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bench import _common
from bench._changelog import open_table
from bench._common import Report, Scale, entry_point, polling_client, scratch_dir, seconds_until
from bench._gossip import GossipSim
from bench._members import CountingTransport, Placement, SimNode, assignment_seconds
from bench.http import _free_port, _stop, _wait
from sparkiq import KeyQuery, StateQueryRequest

#: The table of changes: one row per join, leave or kill.
CHANGE_COLUMNS = [
    "members",
    "change",
    "agreed after s",
    "replica slots moved",
    "partitions opened",
    "failed lookups",
]

INTERVAL = 0.5
FAILURE = 3.0
AGREE_TARGET_S = 10.0
#: The longest a change is waited for before it is reported as not agreed.
AGREE_LIMIT_S = 60.0


@dataclass
class Change:
    """One membership change: seconds to agreement (None: not within the limit), replica
    slots moved (by the assignment) and partitions opened, lookups made and failed."""

    agreed_s: float | None
    moved: int
    slots: int
    opened: int
    lookups: int = 0
    failed: int = 0
    failures: list[str] = field(default_factory=list)


class Cluster:
    """The members of one run, started one by one on the first one as seed."""

    def __init__(self, n: int, tables: dict[str, int], interval: float, failure: float) -> None:
        self.transport = CountingTransport()
        self.ids = [f"n{i}" for i in range(n + 1)]  # one more: the member that joins
        self.placement = Placement(self.ids, tables)
        self.placement.check(self.ids[:n])
        self.interval, self.failure = interval, failure
        self.nodes: dict[str, SimNode] = {}

    def add(self, node_id: str) -> SimNode:
        seeds = [] if node_id == self.ids[0] else [f"local://{self.ids[0]}"]
        node = SimNode(
            node_id,
            seeds,
            self.transport,
            self.placement,
            heartbeat_interval=self.interval,
            failure_timeout=self.failure,
        )
        self.nodes[node_id] = node
        return node.start()

    def remove(self, node_id: str) -> None:
        self.nodes.pop(node_id).stop()

    def agreed(self) -> bool:
        want = tuple(sorted(self.nodes))
        return all(n.coordinator.membership.live() == want for n in list(self.nodes.values()))

    def settled(self) -> bool:
        if not self.agreed():
            return False
        view = tuple(sorted(self.nodes))
        return all(
            n.hosted() == {t: set(p) for t, p in self.placement.hosted(view, i).items()}
            for i, n in list(self.nodes.items())
        )

    def wait(self, check: str, limit: float, since: float | None = None) -> float | None:
        """Seconds from ``since`` (default: now) until ``check`` holds; None after ``limit``."""
        return seconds_until(getattr(self, check), limit, since)

    def kill(self, node_id: str) -> None:
        self.nodes.pop(node_id).kill()

    def stop(self) -> None:
        for node_id in list(self.nodes):
            self.remove(node_id)


class Lookups(threading.Thread):
    """Key lookups through random members, ``rate`` a second, until stopped."""

    def __init__(self, cluster: Cluster, rate: float, seed: int) -> None:
        super().__init__(daemon=True)
        self.cluster, self.rate, self.rng = cluster, rate, random.Random(seed)
        self.exclude: set[str] = set()
        self.made = self.failed = 0
        self.failures: list[str] = []
        self.halt = threading.Event()

    def run(self) -> None:
        placement = self.cluster.placement
        while not self.halt.wait(1 / self.rate):
            entry = [n for i, n in list(self.cluster.nodes.items()) if i not in self.exclude]
            node = self.rng.choice(entry)
            table, partition = self.rng.choice(placement.keys)
            request = (
                StateQueryRequest.in_store(table)
                .with_query(KeyQuery.with_key("k"))
                .with_partitions((partition,))
            )
            self.made += 1
            try:
                result = node.coordinator.router.route(request, [partition])
                answer = result.partition_results[partition]
                ok = answer.is_success and answer.result == {"table": table, "partition": partition}
                why = "" if ok else f"{answer.failure_reason}: {answer.failure_message}"
            except Exception as exc:  # counted, not hidden: a lookup that raised failed
                ok, why = False, f"{type(exc).__name__}: {exc}"
            if not ok:
                self.failed += 1
                self.failures.append(why)


def _change(cluster: Cluster, kind: str, node_id: str, scale: Scale) -> Change:
    before = tuple(sorted(cluster.nodes))
    after = tuple(sorted({*before, node_id} if kind == "join" else set(before) - {node_id}))
    moved = cluster.placement.moved(before, after)
    slots = len(cluster.placement.keys) * (1 + cluster.placement.standbys)
    lookups = Lookups(cluster, scale.pick(100.0, 100.0, 50.0), seed=len(before))
    if kind != "join":
        lookups.exclude.add(node_id)  # its clients are not the membership's to serve
    lookups.start()
    time.sleep(scale.pick(2.0, 1.0, 0.1))
    opened = {i: n.opened for i, n in cluster.nodes.items()}
    event = time.monotonic()  # a join's own start (meeting the cluster) counts too
    if kind == "join":
        cluster.add(node_id)
    elif kind == "leave":
        cluster.remove(node_id)
    else:
        cluster.kill(node_id)
    agreed = cluster.wait("agreed", AGREE_LIMIT_S, since=event)
    cluster.wait("settled", AGREE_LIMIT_S / 2)
    time.sleep(scale.pick(2.0, 1.0, 0.1))
    lookups.halt.set()
    lookups.join()
    return Change(
        agreed,
        moved,
        slots,
        sum(n.opened - opened.get(i, 0) for i, n in cluster.nodes.items()),
        lookups.made,
        lookups.failed,
        lookups.failures[:3],
    )


@dataclass
class Steady:
    messages_s: float
    kbytes_s: float
    cpu_ms_s: float
    busy_cores: float


def _steady(cluster: Cluster, window: float) -> Steady:
    n = len(cluster.nodes)
    messages, sizes = cluster.transport.snapshot()
    cpu, wall = time.process_time(), time.monotonic()
    time.sleep(window)
    messages2, sizes2 = cluster.transport.snapshot()
    cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    sent = sum(messages2.get(i, 0) - messages.get(i, 0) for i in cluster.nodes) / n / wall
    size = sum(sizes2.get(i, 0) - sizes.get(i, 0) for i in cluster.nodes) / n / wall
    return Steady(sent, size / 1024, cpu / n / wall * 1000, cpu / wall)


def _processes(n: int, window: float, root: str) -> tuple[float, float]:
    """Heartbeats sent per member per second by ``n`` ``sparkiq serve`` processes (from
    their /metrics) and by ``n`` in-process members, same timings, one small table."""
    state_dir = os.path.join(root, "processes")
    open_table(state_dir, "small", 8)
    ports = [_free_port() for _ in range(n)]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    procs = []
    for i in range(n):
        command = [
            sys.executable, "-m", "sparkiq.cli", "serve", "--state-dir", state_dir,
            "--node-id", f"n{i}", "--listen", f"127.0.0.1:{ports[i]}",
            "--peers", f"127.0.0.1:{ports[0]}" if i else "",
            "--heartbeat-interval", str(INTERVAL), "--failure-timeout", str(FAILURE),
            "--membership", "heartbeats",  # what this benchmark measures (not the default)
        ]  # fmt: skip
        procs.append(
            _common.start_python(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        )

    def sent() -> float:
        total = 0.0
        for url in urls:
            text = polling_client().get(f"{url}/metrics", timeout=10).text
            found = re.search(r'^sparkiq_heartbeats_total\{direction="sent"\} (\S+)$', text, re.M)
            if found is None:
                raise RuntimeError(f"{url}/metrics has no sparkiq_heartbeats_total")
            total += float(found.group(1))
        return total

    try:
        for url in urls:
            _wait(url, "/readyz", timeout=120)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # everyone sees everyone
            members = polling_client().get(f"{urls[-1]}/metrics", timeout=10).text
            if f"sparkiq_cluster_live_members {float(n)}" in members:
                break
            time.sleep(0.2)
        first, started = sent(), time.monotonic()
        time.sleep(window)
        from_processes = (sent() - first) / n / (time.monotonic() - started)
    finally:
        _stop(*procs)
    cluster = Cluster(n, {"small": 8}, INTERVAL, FAILURE)
    try:
        for node_id in cluster.ids[:n]:
            cluster.add(node_id)
        cluster.wait("settled", AGREE_LIMIT_S)
        beats = [sum(x.coordinator.heartbeats_sent for x in cluster.nodes.values())]
        started = time.monotonic()
        time.sleep(window)
        beats.append(sum(x.coordinator.heartbeats_sent for x in cluster.nodes.values()))
        in_process = (beats[1] - beats[0]) / n / (time.monotonic() - started)
    finally:
        cluster.stop()
    return from_processes, in_process


GOSSIP_COLUMNS = [
    "members (SWIM, simulated)",
    "messages/s per member",
    "bytes/s per member",
    "protocol CPU ms/s per member",
    "join agreed s",
    "leave agreed s",
    "kill: out of every view s",
    "kill: declared dead s",
]


def _gossip_row(n: int, period: float) -> list[str]:
    """The same sizes under SWIM gossip (bench/_gossip.py, no transport, no hosted state)."""
    sim = GossipSim(n, period=period, seed=n)
    periods = 40
    cpu = time.process_time()
    for _ in range(periods):
        sim.step()
    cpu = time.process_time() - cpu
    seconds = periods * period
    messages, sizes = sum(sim.messages.values()), sum(sim.bytes.values())
    everyone = set(sim.members)
    limit = int(AGREE_LIMIT_S / period)
    sim.join("joiner")
    join = sim.run_until_agreed(everyone | {"joiner"}, limit)
    sim.leave("joiner")
    leave = sim.run_until_agreed(everyone, limit)
    sim.kill("g1")
    out = sim.run_until_agreed(everyone - {"g1"}, limit)
    dead = sim.run_until_dead("g1", limit)
    dead = None if dead is None or out is None else out + dead

    def s(p: int | None) -> str:
        return _seconds(None if p is None else p * period)

    return [
        str(n),
        f"{messages / n / seconds:.1f}",
        f"{sizes / n / seconds:,.0f}",
        f"{cpu / n / seconds * 1000:.3f}",
        s(join),
        s(leave),
        s(out),
        s(dead),
    ]


HTTP_COLUMNS = [
    "members",
    "partitions per heartbeat",
    "HTTP round trip CPU us: v1",
    "v2",
    "all-to-all CPU ms/s per member: v1",
    "v2",
]


def _http_rows(
    sizes: Sequence[int], partitions: int, interval: float, count: int
) -> list[list[str]]:
    """CPU of one heartbeat round trip over HTTP on loopback (both sides, in this process:
    signing aside, what two nodes spend) with the hosted state of one member of each size,
    in format versions 1 and 2; and what all-to-all costs a member from it: it takes part
    in 2 (N - 1) / interval round trips a second, bearing half of each."""
    from sparkiq import Node
    from sparkiq.cluster.membership import Membership
    from sparkiq.cluster.transport import HttpTransport

    rows = []
    with scratch_dir("membership-http") as root:
        open_table(root, "small", 4)
        node = Node(
            root,
            node_id="server",
            listen="127.0.0.1:0",
            peers=[],
            store="memory",
            membership="heartbeats",  # what this benchmark measures (not the default)
        )
        node.start()
        transport = HttpTransport(node_id="client")
        try:
            assert node.url is not None
            for n in sizes:
                per_member = 2 * partitions // n
                hosted = {
                    f"t{t}": {p: (17, "live", 0) for p in range(per_member // 4)} for t in range(4)
                }
                sender = Membership("client", "http://127.0.0.1:1", [])
                cpu = []
                for groups in (False, True):
                    doc = sender.heartbeat_doc(hosted, groups=groups)
                    transport.heartbeat(node.url, doc)  # the connection, warm
                    started = time.process_time()
                    for _ in range(count):
                        transport.heartbeat(node.url, doc)
                    cpu.append((time.process_time() - started) / count)
                rows.append(
                    [
                        str(n),
                        f"{per_member:,}",
                        f"{cpu[0] * 1e6:,.0f}",
                        f"{cpu[1] * 1e6:,.0f}",
                        f"{(n - 1) / interval * cpu[0] * 1000:,.1f}",
                        f"{(n - 1) / interval * cpu[1] * 1000:,.1f}",
                    ]
                )
        finally:
            transport.close()
            node.stop()
    return rows


def _seconds(value: float | None) -> str:
    return f"{value:.1f}" if value is not None else f">{AGREE_LIMIT_S:.0f}"


def run(scale: Scale = Scale.FULL) -> Report:
    quiet = logging.getLogger("sparkiq")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # 100 members log every change of every view
    try:
        return _run(scale)
    finally:
        quiet.setLevel(level)


def _run(scale: Scale) -> Report:
    sizes: Sequence[int] = scale.pick((4, 10, 25, 50, 100), (4, 10, 25), (3,))
    partitions = scale.pick(10_000, 10_000, 40)
    tables = {f"t{i}": partitions // 4 for i in range(4)}
    window = scale.pick(10.0, 5.0, 0.3)
    interval, failure = scale.pick((INTERVAL, FAILURE), (INTERVAL, FAILURE), (0.1, 1.0))
    report = Report(
        name="membership",
        title="Membership: heartbeat cost per node and agreement after a change",
        measures=(
            f"N in-process members (real coordinators, simulated hosting) serving "
            f"{partitions:,} partitions (4 tables, 1 standby), heartbeat {interval:g} s, "
            f"failure floor {failure:g} s: per member, heartbeat messages and bytes sent per "
            f"second and CPU over {window:g} s; then a join, a leave and a kill under 100 "
            "lookups/s: seconds until every member agrees, replica slots moved, lookups failed"
        ),
        baseline="the 10-member row: per-member cost should stay within 2x of it up to 100",
        target=(
            f"per-member messages and CPU flat within 2x from 10 to 100 members; agreement "
            f"<= {AGREE_TARGET_S:.0f} s; 0 failed lookups during a planned join or leave"
        ),
        columns=[
            "members",
            "partitions per member",
            "messages/s per member: due",
            "sent",
            "KB/s per member",
            "CPU ms/s per member",
            "process CPU (cores)",
            "assignment CPU s per view",
        ],
        scale=scale,
    )
    changes_rows: list[list[str]] = []
    figures: dict[str, Any] = {}
    for n in sizes:
        cluster = Cluster(n, tables, interval, failure)
        try:
            for node_id in cluster.ids[:n]:
                cluster.add(node_id)
            if cluster.wait("settled", 120) is None:
                report.notes.append(f"{n} members did not settle in 120 s; measured as they were")
            steady = _steady(cluster, window)
            if steady.messages_s < 0.7 * 2 * (n - 1) / interval:
                report.notes.append(
                    f"{n} members: this process sent {steady.messages_s:.0f} of the "
                    f"{2 * (n - 1) / interval:.0f} messages/s per member due: it is saturated "
                    f"({steady.busy_cores:.2f} cores busy, one Python interpreter for all), so "
                    "members stall and views flap; its CPU per member is a share of what one "
                    "process could give, not what a member needs"
                )
            view = cluster.ids[:n]
            assign = assignment_seconds(view, tables, view[-1])
            report.rows.append(
                [
                    str(n),
                    f"{partitions * 2 / n:,.0f}",
                    f"{2 * (n - 1) / interval:,.0f}",
                    f"{steady.messages_s:,.1f}",
                    f"{steady.kbytes_s:,.1f}",
                    f"{steady.cpu_ms_s:,.1f}",
                    f"{steady.busy_cores:.2f}",
                    f"{assign:.2f}",
                ]
            )
            figures[str(n)] = {
                "due_s": 2 * (n - 1) / interval,
                "saturated": float(steady.messages_s < 0.7 * 2 * (n - 1) / interval),
                "messages_s": steady.messages_s,
                "kbytes_s": steady.kbytes_s,
                "cpu_ms_s": steady.cpu_ms_s,
                "busy_cores": steady.busy_cores,
                "assignment_s": assign,
            }
            joiner = cluster.ids[n]
            for kind, victim in (("join", joiner), ("leave", joiner), ("kill", cluster.ids[1])):
                change = _change(cluster, kind, victim, scale)
                ideal = change.slots / (n + 1 if kind != "kill" else n)
                changes_rows.append(
                    [
                        str(n),
                        kind,
                        _seconds(change.agreed_s),
                        f"{change.moved:,} ({change.moved / ideal:.2f}x ideal)",
                        f"{change.opened:,}",
                        f"{change.failed}/{change.lookups}",
                    ]
                )
                figures[str(n)][f"{kind}_agreed_s"] = change.agreed_s
                figures[str(n)][f"{kind}_failed"] = change.failed
                if change.failures:
                    report.console.append(f"{n} {kind}: failures {change.failures}")
        finally:
            cluster.stop()
    report.more_tables.append(
        (
            CHANGE_COLUMNS,
            changes_rows,
        )
    )
    gossip_rows = [_gossip_row(n, interval) for n in sizes]
    report.more_tables.append((GOSSIP_COLUMNS, gossip_rows))
    http_sizes = scale.pick((4, 10, 25, 50, 100), (4, 10, 25, 50, 100), (3,))
    http_rows = _http_rows(http_sizes, partitions, interval, scale.pick(300, 100, 5))
    report.more_tables.append((HTTP_COLUMNS, http_rows))
    figures["gossip"] = {row[0]: _number(row[1]) for row in gossip_rows}
    figures["gossip_slowest_s"] = {
        "agreed": max(_number(x) for row in gossip_rows for x in row[4:7]),
        "dead": max(_number(row[7]) for row in gossip_rows),
    }
    figures["http_v1_ms"] = {row[0]: _number(row[4]) for row in http_rows}
    figures["http_v2_ms"] = {row[0]: _number(row[5]) for row in http_rows}
    with scratch_dir("membership") as root:
        count = scale.pick(4, 4, 2)
        processes, in_process = _processes(count, scale.pick(10.0, 5.0, 0.5), root)
    report.more_tables.append(
        (
            ["members", "heartbeats/s per member: processes", "in-process members"],
            [[str(count), f"{processes:.2f}", f"{in_process:.2f}"]],
        )
    )
    figures["processes"] = {"processes": processes, "in_process": in_process}
    report.figures["by_members"] = figures
    report.readings.extend(_readings(figures, sizes))
    return report


def _number(text: str) -> float:
    """A table cell as a number (``>60``, a limit not reached, as infinity)."""
    return float("inf") if text.startswith(">") else float(text.replace(",", ""))


def _growth(by_size: dict[str, float | None], low: str, high: str) -> str:
    a, b = by_size.get(low), by_size.get(high)
    if not a or not b:
        return "n/a"
    growth = b / a
    return f"{growth:.1f}x (target <= 2x: {'met' if growth <= 2 else 'missed'})"


def _readings(figures: dict[str, Any], sizes: Sequence[int]) -> list[str]:
    out = []
    low, high = str(min(10, sizes[-1])), str(sizes[-1])
    ok = [str(n) for n in sizes if not figures[str(n)]["saturated"]]
    busy = [str(n) for n in sizes if figures[str(n)]["saturated"]]
    if low != high:
        due = {n: figures[n]["due_s"] for n in map(str, sizes)}
        out.append(
            f"all-to-all: messages per member grow {_growth(due, low, high)} from {low} to "
            f"{high} members (2 (N - 1) per interval, by design)"
        )
        out.append(
            f"all-to-all: CPU per member from measured HTTP round trips grows "
            f"{_growth(figures['http_v2_ms'], low, high)} in format 2 "
            f"({figures['http_v2_ms'][low]:.1f} to {figures['http_v2_ms'][high]:.1f} ms/s; "
            f"format 1: {figures['http_v1_ms'][low]:.1f} to {figures['http_v1_ms'][high]:.1f})"
        )
        out.append(
            f"SWIM (simulated): messages per member grow {_growth(figures['gossip'], low, high)}"
        )
    for label, group in (("in-process members that kept up", ok), ("saturated", busy)):
        if not group:
            continue
        times = [figures[n].get(f"{k}_agreed_s") for n in group for k in ("join", "leave", "kill")]
        slowest = max(t if t is not None else float("inf") for t in times)
        failed = sum(
            int(figures[n].get(f"{k}_failed") or 0) for n in group for k in ("join", "leave")
        )
        shown = f"{slowest:.1f} s" if slowest != float("inf") else f"over {AGREE_LIMIT_S:.0f} s"
        out.append(
            f"{label} ({', '.join(group)} members): slowest agreement {shown} (target <= "
            f"{AGREE_TARGET_S:.0f} s: {'met' if slowest <= AGREE_TARGET_S else 'missed'}); "
            f"failed lookups during planned joins and leaves: {failed} (target 0)"
        )
    g = figures["gossip_slowest_s"]
    out.append(
        f"SWIM (simulated): slowest agreement {g['agreed']:.1f} s, a killed member declared dead "
        f"everywhere within {g['dead']:.1f} s (target <= {AGREE_TARGET_S:.0f} s)"
    )
    p = figures["processes"]
    out.append(
        f"heartbeats/s per member: {p['processes']:.2f} as processes, "
        f"{p['in_process']:.2f} in process"
    )
    return out


main = entry_point(run, __doc__)

if __name__ == "__main__":
    main()
