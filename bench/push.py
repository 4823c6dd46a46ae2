"""Push query latency: from a batch's commit record being written to subscribers receiving
the change, with one subscriber and with 1,000 subscribers on one hub.

A table (8 partitions, 20,000 keys) is written by hand in this process: per step one
committed batch of 100 changed rows plus the row ``("probe", n=<batch id>)``, spaced by
random pauses of 50-100 ms so commits fall anywhere within the tail's poll interval.
Subscribers run on a :class:`~sparkiq.sql.push.SubscriptionHub` over the same ``state_dir``
(one tail thread for the table, however many subscribers), read one of two ways:

* **event loop** (how ``sparkiq serve`` sends push streams): every subscriber is a task on
  one asyncio loop awaiting ``poll_chunk_async`` and taking the NDJSON bytes its HTTP
  stream would send (``chunk.encoded(change_lines)``, the server's encoder); it notes when
  the chunk holding each batch arrives (every statement here matches the probe, and a batch
  arrives whole), and the probes are checked in the received changes after the run;
* **thread** (an in-process consumer): its own thread iterating the subscription change by
  change, noting when the probe change of each batch arrives.

Latency of a batch for a subscriber = when its consumer received the probe change - when
the writer's commit record write returned (both ``time.perf_counter()``, same process).
Setups:

* baseline, measured in the same run: 1 subscriber (one thread), the writer calls
  ``hub.notify()`` right after each commit (the in-process writer path: no poll wait);
* 1 subscriber, the hub's default 20 ms poll (a writer in another process);
* 1 subscriber and 1,000 subscribers (half ``SELECT *``, half with a WHERE and a
  projection) on an event loop, with ``notify()`` and with the poll;
* the same 1,000 subscribers with a thread each, with ``notify()`` and with the poll;
* 1,000 subscribers with a thread each whose WHERE keeps only the probe row: each consumer
  receives one change per batch, which separates waking 1,000 threads (sharing one
  interpreter) from iterating the changes.

Run: ``python -m bench.push [--quick | --smoke]``.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import threading
import time
from dataclasses import dataclass
from typing import Any

from bench._changelog import as_arrow, key_name, open_table
from bench._common import Report, Scale, entry_point, load_average, percentile, scratch_dir
from bench._flames import enabled as flames_enabled
from bench._flames import flame
from sparkiq.server.streams import change_lines
from sparkiq.sql.push import Chunk, Subscription, SubscriptionHub
from sparkiq.testing import TableWriter

TABLE = "bench"
PROBE = "probe"
KEYSPACE = 20_000
ROWS = 100
PAUSE_S = (0.05, 0.10)
SEEN_TIMEOUT_S = 60.0
STATEMENTS = (
    f"SELECT * FROM {TABLE} EMIT CHANGES",
    f"SELECT k, n FROM {TABLE} WHERE k = '{PROBE}' OR n < 500000 EMIT CHANGES",
)
SELECTIVE = (f"SELECT n FROM {TABLE} WHERE k = '{PROBE}' EMIT CHANGES",)


@dataclass(frozen=True)
class Setup:
    label: str
    subscribers: int
    notify: bool
    statements: tuple[str, ...] = STATEMENTS
    loop: bool = False  # consumed on one event loop, else a thread each


@dataclass
class Run:
    setup: Setup
    latency_ms: list[float]
    deliveries: int
    fan_out_s: float
    cpu_ms: float  # CPU of the whole process (writer, tail, consumers) per batch


def _consume(sub: Subscription, seen: dict[int, float], counter: list[int]) -> None:
    received = 0
    for change in sub:
        received += 1
        if change.key == PROBE:
            seen[change.batch_id] = time.perf_counter()
    counter.append(received)


async def _consume_chunks(
    sub: Subscription, seen: dict[int, float], chunks: list[Chunk], last: int
) -> None:
    """Take chunks as an HTTP push stream does (with the bytes it would send): a chunk holds
    whole batches, each with its probe (checked after the run, off the clock)."""
    while True:
        chunk = await sub.poll_chunk_async()
        if chunk is None:
            return
        chunk.encoded(change_lines)
        now = time.perf_counter()
        first, end = chunk.parts[0].changes[0].batch_id, chunk.parts[-1].changes[-1].batch_id
        for batch_id in range(first, end + 1):
            seen[batch_id] = now
        chunks.append(chunk)
        if end >= last:
            return


def _on_loop(subs: list[Subscription], seen: list[dict[int, float]], last: int) -> Any:
    """Start one event loop thread consuming every subscription; returns (thread, chunks)."""
    chunks: list[list[Chunk]] = [[] for _ in subs]

    async def main() -> None:
        await asyncio.gather(
            *(_consume_chunks(s, n, c, last) for s, n, c in zip(subs, seen, chunks, strict=True))
        )

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    return thread, chunks


def _check_probes(chunks: list[list[Chunk]], batches: range) -> int:
    """Every subscriber received every batch's probe, once: return the changes received."""
    total = 0
    for received in chunks:
        changes = [c for chunk in received for c in chunk.changes]
        probes = [c.batch_id for c in changes if c.key == PROBE]
        if probes != list(batches):
            raise RuntimeError(f"a subscriber received the probes of batches {probes}")
        total += len(changes)
    return total


def _measure(table: TableWriter, setup: Setup, first_batch: int, steps: int) -> Run:
    rng = random.Random(setup.subscribers * 7 + setup.notify)
    names = [key_name(i) for i in range(KEYSPACE)]
    hub = SubscriptionHub(table.changelog.state_dir)
    statements = setup.statements
    subs = [hub.subscribe(statements[i % len(statements)]) for i in range(setup.subscribers)]
    seen: list[dict[int, float]] = [{} for _ in subs]
    counts: list[int] = []
    chunks: list[list[Chunk]] = []
    if setup.loop:
        loop_thread, chunks = _on_loop(subs, seen, first_batch + steps - 1)
        threads = [loop_thread]
    else:
        threads = [
            threading.Thread(target=_consume, args=(sub, s, counts), daemon=True)
            for sub, s in zip(subs, seen, strict=True)
        ]
        for thread in threads:
            thread.start()
    written: dict[int, float] = {}
    started = time.perf_counter()
    cpu_started = time.process_time()
    try:
        for step in range(steps):
            time.sleep(rng.uniform(*PAUSE_S))
            batch_id = first_batch + step
            keys = [names[i] for i in rng.sample(range(KEYSPACE), ROWS)] + [PROBE]
            ns = [rng.randrange(1_000_000) for _ in range(ROWS)] + [batch_id]
            table.write(as_arrow(keys, ns, [1.0] * len(keys)), batch_id=batch_id)
            written[batch_id] = time.perf_counter()
            if setup.notify:
                hub.notify(TABLE)
        deadline = time.monotonic() + SEEN_TIMEOUT_S
        while any(len(s) < steps for s in seen):
            if time.monotonic() > deadline:
                missing = sum(steps - len(s) for s in seen)
                raise RuntimeError(f"{setup.label}: {missing} probe changes never arrived")
            time.sleep(0.01)
        elapsed = time.perf_counter() - started
        cpu_ms = (time.process_time() - cpu_started) * 1000 / steps
    finally:
        for sub in subs:
            sub.close()
        for thread in threads:
            thread.join(10)
        hub.close()
    if setup.loop:
        counts.append(_check_probes(chunks, range(first_batch, first_batch + steps)))
    latency = [(s[b] - written[b]) * 1000 for s in seen for b in written]
    return Run(setup, latency, sum(counts), elapsed, cpu_ms)


def run(scale: Scale = Scale.FULL) -> Report:
    steps = scale.pick(30, 12, 2)
    many = scale.pick(1_000, 1_000, 10)
    setups = [
        Setup("1 subscriber, notify() after commit", 1, True),
        Setup("1 subscriber, 20 ms poll", 1, False),
        Setup("1 subscriber, event loop, notify()", 1, True, loop=True),
        Setup(f"{many:,} subscribers, event loop, notify()", many, True, loop=True),
        Setup(f"{many:,} subscribers, event loop, 20 ms poll", many, False, loop=True),
        Setup(f"{many:,} subscribers, a thread each, notify()", many, True),
        Setup(f"{many:,} subscribers, a thread each, 20 ms poll", many, False),
        Setup(
            f"{many:,} subscribers, a thread each, WHERE k = probe, notify()", many, True, SELECTIVE
        ),
    ]
    report = Report(
        name="push",
        title="Push query latency: commit to subscriber",
        measures=(
            f"per committed batch ({steps} per setup, {ROWS} changed rows + 1 probe, 50-100 ms "
            "apart), the time from the commit record's write returning until a subscriber's "
            "consumer receives the batch's probe change; and the process's CPU time per batch "
            "(writer, tail and consumers: it barely depends on how busy the machine is)"
        ),
        baseline="1 subscriber with the writer calling hub.notify() after each commit",
        target=(
            "1,000 subscribers on an event loop: p50 <= 20 ms with notify(); with a poll, "
            "about half the poll interval more"
        ),
        columns=[
            "setup",
            "samples",
            "p50 ms",
            "p99 ms",
            "max ms",
            "mean ms",
            "p50 vs base",
            "CPU ms/batch",
        ],
        scale=scale,
    )
    runs: list[Run] = []
    with scratch_dir("push") as root:
        table = open_table(root, TABLE)
        table.write(as_arrow([PROBE], [0], [0.0]), batch_id=0)
        next_batch = 1
        for setup in setups:
            runs.append(_measure(table, setup, next_batch, steps))
            next_batch += steps
        if flames_enabled():  # a pass of its own, the figures' runs left unsampled
            with flame("push-event-loop"):
                _measure(table, setups[3], next_batch, steps)
    base = percentile(runs[0].latency_ms, 50)
    for r in runs:
        p50 = percentile(r.latency_ms, 50)
        report.rows.append(
            [
                r.setup.label,
                str(len(r.latency_ms)),
                f"{p50:.1f}",
                f"{percentile(r.latency_ms, 99):.1f}",
                f"{max(r.latency_ms):.1f}",
                f"{statistics.fmean(r.latency_ms):.1f}",
                "1.0x (baseline)" if r is runs[0] else f"{p50 / base:.2f}x",
                f"{r.cpu_ms:.1f}",
            ]
        )
        report.readings.append(
            f"{r.setup.label}: p50 {p50:.1f} ms, p99 {percentile(r.latency_ms, 99):.1f} ms; "
            f"{r.deliveries:,} changes delivered ({r.deliveries / r.fan_out_s:,.0f}/s over the "
            "run)"
        )
    report.notes = [
        "one tail thread per table serves every subscriber; event-loop consumers are tasks "
        "of one asyncio loop (as HTTP push streams), the others one thread each",
        "with a poll, the tail waits on average half its 20 ms interval for a new commit",
        f"load average after the run: {load_average()} (other work on the machine adds to "
        "the 1,000-subscriber setups; 1,000 consumer threads add to the load average "
        "themselves)",
    ]
    report.figures = {
        "latency_ms": {r.setup.label: r.latency_ms for r in runs},
        "p50_ms": {r.setup.label: percentile(r.latency_ms, 50) for r in runs},
        "p99_ms": {r.setup.label: percentile(r.latency_ms, 99) for r in runs},
        "cpu_ms_per_batch": {r.setup.label: r.cpu_ms for r in runs},
    }
    return report


main = entry_point(run, __doc__)

if __name__ == "__main__":
    main()
