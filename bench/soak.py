"""Soak: a writer, three ``sparkiq serve`` nodes, client load and a fault every minute, for
``--minutes`` (default 30), with every answer checked and the nodes' resources sampled.

It drives :class:`tests.faults.harness.FaultCluster` (a writer process committing a
deterministic table every 0.2 s, nodes reached only through TCP proxies, each node's
changelog storage able to fail, node n2's replicas on a small tmpfs). Each minute three
recorded client sessions run; 20 s in, the next fault of :data:`SCHEDULE` is injected, held
and healed; at the minute's end the minute's history goes to the checker
(:mod:`tests.faults.checker`) and is dropped, so the soak's own memory stays flat. At the end
the whole changelog is checked (every batch committed once, with the model's changes).

Every 10 s it samples each node's resident memory, threads and open file descriptors from
``/proc``. A node restarted by a fault starts a new incarnation; the slope per hour is a
least-squares fit over each node's longest incarnation, after a warm-up (the table's history
window, 60 s here, fills the replicas' versions first).

Run: ``python -m bench.soak [--minutes N]`` (``--quick``: 3 minutes, ``--smoke``: one, the
shortest that injects a fault). ``make bench`` does not run it; ``python -m bench.run_all
--only soak`` does (30 minutes, 3 with ``--quick``).
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench._common import (
    Report,
    Scale,
    add_scale_arguments,
    markdown_table,
    polling_client,
    scale_of,
    scratch_dir,
)

DEFAULT_MINUTES = 30.0
QUICK_MINUTES = 3.0
SMOKE_MINUTES = 1.0  # each minute injects one fault at FAULT_AT and checks it to its end
SAMPLE_EVERY = 10.0
FAULT_AT = 20.0  # seconds into each minute
HISTORY_S = 60.0


@dataclass
class Sample:
    at: float
    pid: int
    rss_mb: float
    threads: int
    fds: int
    #: MB by part, when /metrics answered: RocksDB's shared memory, the C allocator's
    #: chunks in use and the freed ones it keeps, Arrow's pool (see MEMORY_PARTS)
    parts: dict[str, float] = field(default_factory=dict)


def _sample(pid: int) -> tuple[float, int, int] | None:
    try:
        rss = threads = 0
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1])
                elif line.startswith("Threads:"):
                    threads = int(line.split()[1])
        return rss / 1024, threads, len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, ValueError):
        return None


#: The parts of a node's memory its /metrics reports. RocksDB's memory is allocated through
#: malloc, so it is inside "malloc_in_use": the report shows "in use besides RocksDB" and
#: "rest", the RSS less in use, free-held and Arrow (Python's small-object arenas, thread
#: stacks, code; negative drift when freed pages are no longer resident).
MEMORY_PARTS = ("malloc_in_use", "malloc_free_held", "arrow", "rocksdb")


def _memory_parts_mb(url: str) -> dict[str, float]:
    """The parts of a node's memory, in MB: RocksDB's block cache and memtables (bounded,
    filling as data arrives) and what ``sparkiq_process_memory_bytes`` reports, so that
    growth can be told apart from a leak. Empty when the node did not answer."""
    gauges = node_gauges(url, timeout=2.0)
    process = gauges.get("sparkiq_process_memory_bytes", {})
    rocksdb = gauges.get("sparkiq_rocksdb_memory_bytes", {})
    if not process:
        return {}
    parts = {part: process[part] / 2**20 for part in MEMORY_PARTS if part in process}
    parts["rocksdb"] = sum(rocksdb.values()) / 2**20
    return parts


class Sampler(threading.Thread):
    """Samples every node's RSS, threads and fds every ``SAMPLE_EVERY`` s, and its memory by
    part from ``/metrics`` (absent while the node is stopped or cut off)."""

    def __init__(
        self, pids: Callable[[], dict[str, int]], urls: Callable[[], dict[str, str]]
    ) -> None:
        super().__init__(daemon=True, name="soak-sampler")
        self.pids = pids
        self.urls = urls
        self.samples: dict[str, list[Sample]] = {}
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.is_set():
            now = time.monotonic()
            urls = self.urls()
            for node, pid in self.pids().items():
                got = _sample(pid)
                if got is not None:
                    parts = _memory_parts_mb(urls[node]) if node in urls else {}
                    self.samples.setdefault(node, []).append(Sample(now, pid, *got, parts))
            self.stop_event.wait(SAMPLE_EVERY)


def slope_per_hour(points: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of ``(seconds, value)`` points, per hour (0 for fewer than 2)."""
    if len(points) < 2:
        return 0.0
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    if var == 0:
        return 0.0
    return sum((t - mean_t) * (v - mean_v) for t, v in points) / var * 3600


@dataclass
class FaultTally:
    count: int = 0
    ops: int = 0
    failed: int = 0
    worst_gap: float = 0.0
    worst_client_gap: float = 0.0
    slowest: float = 0.0
    failed_after: int = 0
    unsettled: int = 0  # times the cluster was not whole and ready within the settle bound
    errors: set[str] = field(default_factory=set)


def schedule(cluster: Any, spare: int | None = None) -> list[tuple[str, Callable[[int], Any]]]:
    """The faults, in turn; each takes the minute's number (to rotate its victim). Node
    ``spare``, if given, is never killed: its one incarnation lasts the whole run, so its
    memory is fitted over all of it (the other faults still reach it)."""
    from tests.faults.faultfs import Faults

    killed = [i for i in range(3) if i != spare]

    def turn(minute: int) -> int:
        """How many times this minute's fault came before (its victims rotate by it: with
        two nodes to kill, ``minute % 2`` picked the same one every ten minutes)."""
        return minute // len(faults)

    faults: list[tuple[str, Callable[[int], Any]]] = [
        ("kill -9 + restart",
         lambda m: cluster.kill_node(killed[turn(m) % len(killed)], hold=3.0)),
        ("SIGSTOP 5 s", lambda m: cluster.pause_node(m % 3, hold=5.0)),
        ("partition (blackhole) 5 s", lambda m: cluster.isolate_node(m % 3, "blackhole", 5.0)),
        ("changelog store fails under nodes",
         lambda m: cluster.store_faults(Faults(fail_reads=0.3, fail_lists=0.3, delay=0.01), 5.0)),
        ("writer kill -9 x2", lambda m: cluster.kill_writer(times=2)),
        ("network delay 0.2 s", lambda m: cluster.slow_network(0.2, hold=5.0)),
        ("writer's store fails, partial writes",
         lambda m: cluster.store_faults(Faults(fail_writes=0.2, partial_writes=0.3), 5.0,
                                        writer=True)),
        ("partition (drop) 5 s", lambda m: cluster.isolate_node(m % 3, "drop", 5.0)),
        ("partition one way (blackhole) 5 s",
         lambda m: cluster.isolate_node(m % 3, "blackhole", 5.0, one_way=True)),
    ]  # fmt: skip
    if not cluster.disk_error:
        faults.append(("full disk under n2", lambda m: cluster.full_disk(2, hold=5.0)))
    return faults


def soak(minutes: float, root: str, spare: int | None = None) -> dict[str, Any]:
    from tests.faults.checker import check_changelog, check_history, windows
    from tests.faults.harness import FaultCluster
    from tests.faults.model import Model

    from sparkiq.stores.history import History

    cluster = FaultCluster(
        Path(root), 3, writer_interval=0.2, disk_node=2, load_pause=0.01,
        history=History(seconds=HISTORY_S),
    )  # fmt: skip
    model = Model()
    tallies: dict[str, FaultTally] = {}
    anomalies: list[str] = []
    total_ops = 0
    with cluster:
        sampler = Sampler(
            lambda: dict(cluster.pids), lambda: {n.node_id: n.url for n in cluster.nodes}
        )
        sampler.start()
        began = time.monotonic()
        faults = schedule(cluster, spare)
        minute = 0
        while time.monotonic() - began < minutes * 60 - 1:
            slot = began + minute * 60
            cluster.start_load()
            time.sleep(max(0.0, slot + FAULT_AT - time.monotonic()))
            name, inject = faults[minute % len(faults)]
            tally = tallies.setdefault(name, FaultTally())
            try:
                fault = inject(minute)
            except AssertionError as exc:  # not whole again in time: reported, and on we go
                tally.count += 1
                tally.unsettled += 1
                ops = cluster.stop_load()
                total_ops += len(ops)
                anomalies += [str(a) for a in check_history(ops, model, cluster.head())]
                print(f"minute {minute + 1}: {name} did not settle: {exc}", flush=True)
                minute += 1
                continue
            time.sleep(max(5.0, slot + 60 - time.monotonic()))
            ops = cluster.stop_load()
            total_ops += len(ops)
            anomalies += [str(a) for a in check_history(ops, model, cluster.head())]
            (window,) = windows(ops, [fault])
            tally.count += 1
            tally.ops += window.ops
            tally.failed += window.failed
            tally.worst_gap = max(tally.worst_gap, window.longest_gap)
            tally.worst_client_gap = max(tally.worst_client_gap, window.client_gap)
            tally.slowest = max(tally.slowest, window.slowest)
            tally.failed_after += window.failed_after_settle
            tally.errors.update(e[:120] for e in window.errors)
            print(f"minute {minute + 1}: {window}; {len(anomalies)} anomalies so far", flush=True)
            minute += 1
        sampler.stop_event.set()
        sampler.join()
        gauges = {n.node_id: node_gauges(n.url) for n in cluster.nodes}
        head, changelog_anomalies = check_changelog(cluster.state_dir)
        anomalies += [str(a) for a in changelog_anomalies]
        mid_batch = f"{cluster.mid_batch_kills} of {cluster.writer_kills}"
    return {
        "minutes": (time.monotonic() - began) / 60,
        "ops": total_ops,
        "batches": head + 1,
        "anomalies": anomalies,
        "tallies": tallies,
        "samples": sampler.samples,
        "writer_kills_mid_batch": mid_batch,
        "disk": cluster.disk_error or "tmpfs mounted",
        "gauges": gauges,
    }


def node_gauges(url: str, timeout: float = 10.0) -> dict[str, dict[str, float]]:
    """A node's labelled gauges of interest from its ``/metrics``: threads by pool and each
    pool's bound, RocksDB's shared memory by part and its bound."""
    import httpx

    wanted = (
        "sparkiq_threads",
        "sparkiq_thread_pool_limit",
        "sparkiq_rocksdb_memory_bytes",
        "sparkiq_rocksdb_memory_limit_bytes",
        "sparkiq_process_memory_bytes",
    )
    try:
        text = polling_client().get(f"{url}/metrics", timeout=timeout).text
    except httpx.HTTPError:
        return {}
    gauges: dict[str, dict[str, float]] = {name: {} for name in wanted}
    for line in text.splitlines():
        name, _, rest = line.partition("{")
        if name in gauges:
            gauges[name][rest.split('"')[1]] = float(line.rsplit(" ", 1)[1])
    return gauges


def resources(samples: dict[str, list[Sample]], warmup: float) -> list[list[str]]:
    """Per node: its longest incarnation's first and last sample and slopes per hour."""
    rows = []
    for node in sorted(samples):
        by_pid: dict[int, list[Sample]] = {}
        for sample in samples[node]:
            by_pid.setdefault(sample.pid, []).append(sample)
        longest = max(by_pid.values(), key=lambda s: s[-1].at - s[0].at)
        start = longest[0].at + warmup
        steady = [s for s in longest if s.at >= start] or longest[-2:]
        hours = (longest[-1].at - longest[0].at) / 3600

        def fit(attr: str, steady: list[Sample] = steady) -> float:
            return slope_per_hour([(s.at, float(getattr(s, attr))) for s in steady])

        first, last = steady[0], steady[-1]
        known = [s for s in steady if s.parts]

        def part_slope(
            value: Callable[[dict[str, float]], float], known: list[Sample] = known
        ) -> float:
            return slope_per_hour([(s.at, value(s.parts)) for s in known])

        by_part = {
            "rocksdb": part_slope(lambda p: p.get("rocksdb", 0.0)),
            "in use besides rocksdb": part_slope(
                lambda p: p.get("malloc_in_use", 0.0) - p.get("rocksdb", 0.0)
            ),
            "free held": part_slope(lambda p: p.get("malloc_free_held", 0.0)),
            "arrow": part_slope(lambda p: p.get("arrow", 0.0)),
        }
        by_part["rest"] = slope_per_hour([
            (s.at, s.rss_mb - sum(s.parts.get(p, 0.0) for p in MEMORY_PARTS[:3])) for s in known
        ])  # fmt: skip
        # the second half alone: memory filling toward a bound flattens, a leak does not
        late = [s for s in steady if s.at >= (steady[0].at + steady[-1].at) / 2]
        by_part["in use besides rocksdb, 2nd half"] = part_slope(
            lambda p: p.get("malloc_in_use", 0.0) - p.get("rocksdb", 0.0),
            [s for s in late if s.parts],
        )
        rows.append([
            node, str(len(by_pid)), f"{hours * 60:.1f} min",
            f"{first.rss_mb:.0f} -> {last.rss_mb:.0f} MB", f"{fit('rss_mb'):+.1f} MB/h",
            f"{fit('rss_mb', late):+.1f} MB/h",
            ", ".join(f"{part} {slope:+.0f}" for part, slope in by_part.items()),
            f"{first.threads} -> {last.threads}", f"{fit('threads'):+.1f}/h",
            f"{first.fds} -> {last.fds}", f"{fit('fds'):+.1f}/h",
        ])  # fmt: skip
    return rows


#: The resource table's columns (one row per node, from :func:`resources`).
RESOURCE_COLUMNS = [
    "node",
    "incarnations",
    "longest",
    "RSS",
    "RSS slope",
    "RSS slope, 2nd half",
    "slope by part, MB/h",
    "threads",
    "threads slope",
    "fds",
    "fds slope",
]

#: The fault table's columns (one row per fault, from :func:`fault_rows`).
FAULT_COLUMNS = [
    "fault",
    "times",
    "failed while it held",
    "longest gap, all sessions",
    "longest gap, one session",
    "slowest answer",
    "failures after it settled",
]


def fault_rows(tallies: dict[str, FaultTally]) -> list[list[str]]:
    """Per fault: how often it was injected, the operations that failed while it held, the
    longest time without an answer, and failures once it had settled."""
    return [
        [
            name + (f" (did not settle x{t.unsettled})" if t.unsettled else ""),
            str(t.count),
            f"{t.failed:,}/{t.ops:,}",
            f"{t.worst_gap:.2f} s",
            f"{t.worst_client_gap:.2f} s",
            f"{t.slowest:.2f} s",
            str(t.failed_after),
        ]
        for name, t in tallies.items()
    ]


#: The memory-by-window table's columns (:func:`memory_windows`; the console only).
WINDOW_COLUMNS = [
    "node",
    "minutes",
    "RSS MB",
    "in use besides RocksDB",
    "RocksDB",
    "allocator's free, held",
    "threads",
    "fds",
]


def _mean(values: Sequence[float]) -> str:
    return f"{sum(values) / len(values):.1f}" if values else "-"


def memory_windows(samples: dict[str, list[Sample]], window_s: float) -> list[list[str]]:
    """Each node's longest incarnation, averaged over windows of ``window_s`` seconds: the
    soak's detailed memory log, printed with its report (the docs keep the slopes)."""
    rows = []
    for node in sorted(samples):
        by_pid: dict[int, list[Sample]] = {}
        for sample in samples[node]:
            by_pid.setdefault(sample.pid, []).append(sample)
        longest = max(by_pid.values(), key=lambda s: s[-1].at - s[0].at)
        windows: dict[int, list[Sample]] = {}
        for sample in longest:
            windows.setdefault(int((sample.at - longest[0].at) // window_s), []).append(sample)
        minutes = window_s / 60
        for index, taken in sorted(windows.items()):
            parts = [s.parts for s in taken if s.parts]
            rows.append([
                node, f"{index * minutes:g}-{(index + 1) * minutes:g}",
                _mean([s.rss_mb for s in taken]),
                _mean([p.get("malloc_in_use", 0.0) - p.get("rocksdb", 0.0) for p in parts]),
                _mean([p.get("rocksdb", 0.0) for p in parts]),
                _mean([p.get("malloc_free_held", 0.0) for p in parts]),
                _mean([s.threads for s in taken]), _mean([s.fds for s in taken]),
            ])  # fmt: skip
    return rows


def write_samples(samples: dict[str, list[Sample]], path: str) -> None:
    """Every sample as a JSON line (node, seconds, pid, RSS, threads, fds, parts in MB)."""
    import json

    with open(path, "w") as handle:
        for node, taken in sorted(samples.items()):
            for sample in taken:
                handle.write(json.dumps({"node": node, **vars(sample)}) + "\n")


def run(
    scale: Scale = Scale.FULL,
    minutes: float | None = None,
    spare: int | None = None,
    samples_path: str | None = None,
) -> Report:
    minutes = minutes or scale.pick(DEFAULT_MINUTES, QUICK_MINUTES, SMOKE_MINUTES)
    with scratch_dir("soak") as root:
        found = soak(minutes, root, spare)
    if samples_path is not None:
        write_samples(found["samples"], samples_path)
    report = Report(
        name="soak",
        title=f"Soak: {minutes:g} minutes, a fault every minute",
        measures="every client answer checked against the model; per fault, the operations "
        "that failed while it held and the longest time without an answer; every node's RSS, "
        "threads and open fds every 10 s",
        baseline="each node's own figures after warm-up (the table's 60 s history filled)",
        target="0 anomalies; 0 failures once a fault settled; no session without an answer "
        "for more than 2 s under a node fault; memory, threads and fds flat",
        columns=FAULT_COLUMNS,
        scale=scale,
    )
    tallies: dict[str, FaultTally] = found["tallies"]
    anomalies: list[str] = found["anomalies"]
    report.rows = fault_rows(tallies)
    warmup = min(HISTORY_S + 30, minutes * 60 / 3)
    report.more_tables.append((RESOURCE_COLUMNS, resources(found["samples"], warmup)))
    report.readings.append(
        f"{found['ops']:,} client operations over {found['minutes']:.1f} min and "
        f"{found['batches']:,} batches: {len(anomalies)} anomalies"
        + (f" (first: {anomalies[0]})" if anomalies else "")
        + f", {sum(t.failed_after for t in tallies.values())} failures once a fault settled"
    )
    report.notes.append(
        f"writer kills inside a batch: {found['writer_kills_mid_batch']}; replica disk: "
        f"{found['disk']}; slopes are least-squares fits over each node's longest "
        f"incarnation after {warmup:.0f} s of warm-up"
    )
    # The detailed log goes to the console (and --json), not to the docs: the memory of
    # each node by window, threads by pool and RocksDB's memory at the end, the errors seen.
    window_s = 300.0 if minutes <= 60 else 900.0
    windows = memory_windows(found["samples"], window_s)
    report.console.append(f"memory by {window_s / 60:g}-minute window (MB, averages):")
    report.console += markdown_table(WINDOW_COLUMNS, windows).splitlines()
    for node, gauges in found["gauges"].items():
        pools, limits = (
            gauges.get("sparkiq_threads", {}),
            gauges.get("sparkiq_thread_pool_limit", {}),
        )
        biggest = sorted(pools.items(), key=lambda p: -p[1])[:6]
        report.console.append(
            f"{node} threads at the end by pool (of its bound): "
            + ", ".join(
                f"{name} {count:.0f}" + (f"/{limits[name]:.0f}" if name in limits else "")
                for name, count in biggest
            )
        )
        used = gauges.get("sparkiq_rocksdb_memory_bytes", {})
        bound = gauges.get("sparkiq_rocksdb_memory_limit_bytes", {})
        report.console.append(
            f"{node} RocksDB memory at the end: "
            + ", ".join(
                f"{part} {used[part] / 2**20:.0f}/{bound[part] / 2**20:.0f} MB"
                for part in sorted(used)
            )
        )
    report.console += [e for t in tallies.values() for e in sorted(t.errors)][:10]
    report.figures = {
        "anomalies": anomalies[:50],
        "ops": found["ops"],
        "faults": {n: vars(t) | {"errors": sorted(t.errors)} for n, t in tallies.items()},
        "memory_windows": {"columns": WINDOW_COLUMNS, "rows": windows},
    }
    return report


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    add_scale_arguments(parser)
    parser.add_argument("--minutes", type=float, help=f"default {DEFAULT_MINUTES:g}")
    parser.add_argument(
        "--spare-node",
        type=int,
        choices=(0, 1),
        help="never kill -9 this node, so one incarnation spans the run (n2's disk fills)",
    )
    parser.add_argument("--samples", help="write every resource sample to this file (JSON lines)")
    args = parser.parse_args(argv)
    report = run(scale_of(args), args.minutes, args.spare_node, args.samples)
    report.print()
    return report.as_dict()


if __name__ == "__main__":
    main()
