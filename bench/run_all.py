"""Run every benchmark and rewrite ``docs/benchmarks.md`` with the figures.

``python -m bench.run_all`` (what ``make bench`` runs) takes about fifteen minutes on two
cores (the Spark Connect comparison alone about six). ``--quick`` runs smaller versions in
about five and, being less precise, leaves the docs alone unless ``--write-docs`` is given;
so does ``--only`` (a subset: with ``--write-docs`` its sections replace theirs, the others
stay). A benchmark that fails keeps its last section. ``--smoke`` runs the smallest
version of each, whose figures mean nothing: it checks that every benchmark still runs, and
never writes the docs (tests/test_bench_smoke.py smoke-runs each benchmark in CI).
``--json PATH`` also saves every figure as JSON.
"""

from __future__ import annotations

import argparse
import datetime as dt
import inspect
import json
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from bench import (
    apply,
    arrow,
    attach,
    checkpoint_decode,
    failover,
    flight,
    follower_tail,
    freshness,
    fuzz,
    http,
    lookup,
    membership,
    membership_gossip,
    membership_processes,
    pgwire,
    push,
    realtime,
    restore,
    ryw_latency,
    sink,
    sink_connect,
    soak,
    sql_scan,
    statestore,
    versions,
)
from bench._common import (
    Report,
    Scale,
    add_scale_arguments,
    code_version,
    load_average,
    machine,
    scale_of,
)
from bench._flames import flames_of

#: In running order: the benchmarks without Spark first, then those sharing one session
#: (their ``run`` takes ``spark=``; sink_connect starts its sessions in child processes).
BENCHMARKS: dict[str, Callable[[Scale], Report]] = {
    "lookup": lookup.run,
    "http": http.run,
    "failover": failover.run,
    "membership": membership.run,
    "membership_gossip": membership_gossip.run,
    "membership_processes": membership_processes.run,
    "sql_scan": sql_scan.run,
    "versions": versions.run,
    "pgwire": pgwire.run,
    "arrow": arrow.run,
    "flight": flight.run,
    "push": push.run,
    "apply": apply.run,
    "restore": restore.run,
    "follower_tail": follower_tail.run,
    "statestore": statestore.run,
    "checkpoint_decode": checkpoint_decode.run,
    "sink": sink.run,
    "sink_connect": sink_connect.run,
    "attach": attach.run,
    "freshness": freshness.run,
    "ryw_latency": ryw_latency.run,
    "realtime": realtime.run,
    "fuzz": fuzz.run,
}

#: Run only when named in ``--only``: ``make bench`` leaves them out (the soak takes 30 min).
ON_REQUEST: dict[str, Callable[[Scale], Report]] = {
    "soak": soak.run,
}


def uses_spark(run: Callable[..., Report]) -> bool:
    """Whether a benchmark runs on this process's SparkSession: it then takes ``spark=``."""
    return "spark" in inspect.signature(run).parameters


DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs")

#: What each section says whatever the figures are: how to read them.
CONTEXT = {
    "lookup": (
        "`node.get` runs the table's key path, compiled once per table "
        "(`schema/keypath.py`: the key validated, its partition computed with Spark's "
        "Murmur3, its bytes encoded, each once), reads RocksDB with the encoded key under "
        "the partition's sequence counter and decodes the row with the schema's compiled "
        "decoder; a KeyQuery also builds the request and result objects. The floor does "
        "only the RocksDB read, so the ratio is the price of everything sparkiq adds in "
        "Python. What is left (the run's breakdown, `python -m bench.lookup --profile`): "
        "on the one-string key, the Rdict.get on the partition's database (~1 us here, a "
        "little above the floor's one plain database), the key path ~0.45 us (mmh3 itself "
        "~0.03 us; the rest is Python calls and the checks that keep a bad key's error), "
        "the row's dict ~0.15 us and about five Python frames of 50-100 ns: the 1.5x target "
        "leaves ~0.5 us for all of it, less than the key path and the decode alone, so it "
        "is out of reach of Python. A KeyQuery adds what its API asks for: the caller builds "
        "three frozen objects (request, query, store name) and reads two (the results), "
        "each field set through its slot; 2.5x would leave no room for them. The composite "
        "key's row holds a timestamp, which PySpark's conversion (`datetime.fromtimestamp` "
        "in local time) makes ~1 us of the lookup by itself; its first key column's Spark "
        "hash (a string of two bytes) needs a correction of the Murmur3 tail that costs "
        "~1 us in Python and is memoized per value. On a shared machine the absolute "
        "figures move between runs, the floor with them; the ratio to the floor moves much "
        "less."
    ),
    "apply": (
        "A replica verifies each segment's SHA-256 before applying it, decodes it with "
        "pyarrow, and writes it with the new position in one RocksDB write batch (write-ahead "
        "log, no fsync). The raw floor starts from bytes already in memory and writes no "
        "position. Replicas' RocksDB options (small write buffers under one shared memtable "
        "budget, flushed by background threads on the other core) make writes cheaper than "
        "rocksdict's defaults (one large memtable per database)."
    ),
    "restore": (
        "A fresh node restores each partition from its newest snapshot whose descriptor and "
        "data verify (read, SHA-256, Arrow decode), written to RocksDB in one write batch that "
        "replaces the partition, then applies the later batches as it tails; without a "
        "snapshot it replays every batch ever committed, so its time follows the table's "
        "history, not its size. The restored replicas are compared (every key and row) "
        "before any figure is reported. Snapshots are built from the previous snapshot plus "
        "the segments since, in Python, with no replica (the writer runs that as a Spark job)."
    ),
    "follower_tail": (
        "A follower, like an external node, learns of a commit at its next poll, then reads, "
        "verifies and applies the batch's segments; a `where=` filter decodes every changed "
        "row and calls the filter in Python, a `columns=` projection re-encodes the kept "
        "values. The wait for the next poll is uniform over the interval, so p50 and p90 of "
        "30 batches move by several milliseconds between runs; the mean minus half the "
        "interval is the steadier measure of what the reader itself adds. Writer and readers "
        "share the same two cores."
    ),
    "statestore": (
        "Spark's state reader plans and runs a batch job that loads the state files of "
        "every shuffle partition of the checkpoint; `App.get` reads one key from a local "
        "RocksDB replica. The reader is Spark's supported way to look at streaming state; "
        "it is not built for point lookups, which is the gap sparkiq fills."
    ),
    "sink": (
        "With sparkiq, each micro-batch also tags rows with their partition (Spark's own "
        "hash), then, by default, a batch whose table's previous batch had at most 50,000 "
        "rows is collected as Arrow (one Spark job, which evaluates the batch as the "
        "baseline's noop write does) and the driver encodes and writes one segment per "
        "partition and the commit record: no Python stage runs in Spark. Written by tasks "
        "(the first batch of a query, a large batch, or SPARKIQ_SINK_WRITE=tasks), each "
        "task encodes and writes its partitions' segments on the executors (an Arrow Python "
        "task, file fsync): with 4 partitions (the aggregation's state partitions) the batch "
        "is already in the table's partitions and each task of its last stage writes its own "
        "partition's segment, after checking every row's tag; with 8, the rows are shuffled "
        "into write tasks first. The local node applies each batch meanwhile, on the same "
        "two cores. The phases come from the sink's DEBUG record of each batch: job is the "
        "Spark job (and, by default, the driver's writing), prepare the commit check, offset "
        "log and plan, commit the commit record's write; tasks_* are summed over whoever "
        "wrote the segments, and tasks_receive of a batch written in place includes the "
        "stateful stage itself. The App without its local node runs the same sink, commit "
        "watcher and writer status thread with no node applying batches: the difference from "
        "the default is the serving node's share. The second table splits each sink's batch "
        "by phase (Spark's phases outside addBatch; addBatch inside the foreachBatch function "
        "and around it, i.e. Spark calling Python through py4j), the third its CPU time per "
        "batch (this process, the App's driver threads in it, the JVM)."
    ),
    "freshness": (
        "`committed_at` is taken just before the commit record is written, so the record's "
        "write (fsync, rename) is part of every figure; it is shown on its own as the floor. "
        "The local node is woken by the App's commit watcher, which polls the changelog every "
        "poll interval on the driver (the sink may run in another process: Spark Connect); "
        "the external node finds the record at its next poll. Each adds up to one poll "
        "interval, on average half of it. Both then read, verify and apply the batch's "
        "segments."
    ),
    "ryw_latency": (
        "The bounded read is answered once a committed batch has read the record: the node "
        "turns the acknowledgement's offset into the first batch whose Kafka end offsets "
        "pass it, waiting for the writer's commit if none has yet. A record sent just after "
        "a micro-batch started waits for the whole next trigger interval, so the spread of "
        "both reads is about one interval; the unbounded read polls every millisecond, which "
        "a real client would not. Broker, Spark, the node and the producer share the two cores."
    ),
    "realtime": (
        "Both modes run the same pipeline over the same broker, one after the other (a "
        "real-time query holds a task slot per task of every stage for as long as it runs). "
        "In real-time mode a total reaches the output topic as its order is processed, and "
        "the follower's consumer applies it as soon as it is fetched; in micro-batches a "
        "send waits for the running batch to end, the next batch to read it and the sink to "
        "commit. The broker's round trip is the floor of both. Spark's streaming shuffle "
        "flushes every 5 ms in this session (its default, 50 ms, adds about 40 ms)."
    ),
    "http": (
        "Server and load generator share the two cores, so each figure is also bounded by the "
        "generator's own cost; the floor, measured in the same run with the same generator "
        "and uvicorn settings, shows where that bound is. The node answers a lookup of a "
        "partition it holds caught up on the event loop (no thread hop); a forwarded lookup "
        "runs on a worker thread and crosses the node protocol to the other node over a "
        "pooled keep-alive connection. A SQL key lookup whose plan is cached and whose keys "
        "the node reads itself is answered on the event loop too (`Node.sql_here`: no DuckDB, "
        "no thread hop); anything else runs on a worker thread. What is left (py-spy on the "
        "server under the closed loop): uvicorn's two socket writes per answer (headers, "
        "then body), which the floor pays as well, are a third of the server's samples; of "
        "sparkiq's own part, the key path and read (see the in-process section), the JSON "
        "answer (orjson), the route, the Prometheus counters (three labelled children a "
        "request, each taking a lock) and the host check; a SQL lookup adds its statement's "
        "shape scan and plan binding (~20 us in Python). The `sparkiq serve` node is also "
        "clustered (it listens), so its membership and tailer threads take the GIL now and "
        "then; the floor has no other thread."
    ),
    "failover": (
        "A router that cannot connect to a node marks it suspect at once and asks the next "
        "replica, so failover does not wait for the heartbeat failure window (1.5 s here); "
        "the figure is mostly the time until the client's next query for that partition "
        "(random keys at a few hundred queries per second). Failed answers count requests that "
        "returned a failure after the kill; wrong answers count rows that disagree with the "
        "position they were served at (each batch sets every key to its batch id)."
    ),
    "membership": (
        "All members run in one Python process on a shared two-core machine, so the first "
        "table holds only while that process keeps up: past about 25 members all-to-all "
        "heartbeats (every member to every other, 2 (N - 1) / 0.5 s messages a member) need "
        "more CPU than one interpreter has, the members stall, views flap and partitions move "
        "back and forth; the rows say so. The HTTP table measures what one heartbeat round trip "
        "costs two nodes and from it what all-to-all costs a member at each size, which one "
        "process cannot show. The SWIM rows are the gossip state machine of "
        "`cluster/gossip.py` simulated period by period, without transport or hosted state: "
        "each member probes one other a period, so its messages do not grow with N. A leave "
        "and a kill differ in how the others learn it: a refused heartbeat (a process gone "
        "from a host still up) is suspected at once, silence waits for the failure detector."
    ),
    "membership_gossip": (
        'The same in-process members as the membership benchmark, on `membership="gossip"`: '
        "each member probes one other a period and answers the probes of others, so it sends "
        "about 4 messages a second at a 0.5 s period whatever N. Simulated hosting reports a "
        "new batch on every partition every second; a member's hosted record takes a new "
        "version for batches alone at most every 10 periods (5 s; at once when partitions or "
        "states change) and travels pushed (at most 8 records a message) and pulled when its "
        "owner is probed. The record age is how much newer the owner's version is than the "
        "one held: at 100 members batches are up to about 40 s stale at some members (mean 4 "
        "s), by design (routing reads which partitions are live, not batches; a handoff that "
        "waits on a batch asks the member for it). CPU per member falls with N because each "
        "member hosts fewer partitions, so its records shrink. A killed member answers "
        "nothing: it is suspected (out of every live view) after a probe and its indirect "
        "probes time out. Replica slots moved per change are the rendezvous assignment's (1/N"
        " of the 20,000 slots is the ideal), and the partitions members opened meanwhile "
        "match them: no member opened a partition it then gave back."
    ),
    "membership_processes": (
        "Each member here is a `sparkiq serve` process with an HTTP server, RocksDB replicas "
        "of its share of the table and the gossip loop, on one shared two-core host; the "
        "in-process members are bench/membership_gossip.py's over the same table. Messages "
        "count the same thing on both sides (requests sent and acks given); bytes are the "
        "packed messages without HTTP headers, and a process's URL (`http://127.0.0.1:port`, "
        "in every message and every membership update) is 12 bytes longer than an in-process "
        "member's (`local://nX`): in a quiet cluster a message is about 80 bytes, so that "
        "alone is about 15%. After a start every member's record is new and is pushed to "
        "every member several times over, which takes longer the larger N; the window starts "
        "after a quiet period, and the live-view drops column says whether processes were "
        "suspecting each other meanwhile (an overloaded host makes probes time out). "
        "Private memory is what a process holds alone; its resident size also counts the "
        "libraries' pages, which all members share. A join is timed from when the joiner "
        "answers HTTP (an interpreter's start is not membership's), a leave from its SIGTERM, "
        "a kill from its SIGKILL."
    ),
    "sql_scan": (
        "The floor is DuckDB over the same rows in a native in-memory DuckDB table. A node "
        "hosting every partition runs the statement once in DuckDB over the partitions' Arrow "
        "versions at one batch, registered without copying (the columnar path); the "
        "fragment path is what a cluster uses for partitions on other nodes: each node runs "
        "the statement's fragment (a filter, a top-N, a partial aggregate) once over all its "
        "partitions, answered in Arrow, and the node asked runs the final statement over "
        "them. The two-node line is that path for real: two nodes on 127.0.0.1, each "
        "hosting half the partitions and no standby, the second answering over HTTP; both "
        "share the two cores with the load of the first. "
        "Before versions, every scan first read RocksDB and decoded MessagePack rows to "
        "Arrow (the last scan line). A SQL key lookup with a plain column list never reaches "
        "DuckDB: its plan is cached by statement shape and it runs one KeyQuery."
    ),
    "versions": (
        "Every replica applies each batch to its Arrow versions (decode, stamp replaced rows, "
        "append a chunk) before its RocksDB write, on the same thread; point reads stay on "
        "RocksDB. The unpinned aggregate reads each partition at its own newest batch, which "
        "is what reads spanning partitions did before, except that it too reads versions "
        "rather than decoding RocksDB. A key read at a past batch scans the partition's key "
        "column in its versions."
    ),
    "fuzz": (
        "Generated SQL (a grammar of typed expressions, joins, grouping and edge-value "
        "literals, one statement in three damaged at the token level) and schemathesis' "
        "requests for every operation of /openapi.json, valid and invalid, all with the "
        "token, one at a time. Every generated statement the node answers is compared with "
        "DuckDB over the ground truth. The lookup client shares the two cores with the "
        "fuzzing client and the node, so its p99 under fuzzing also measures that contention."
    ),
    "pgwire": (
        "The same SQL key lookup three ways, one round trip at a time. REST hops from the "
        "event loop to the SQL thread pool and back and encodes JSON; psycopg's extended "
        "protocol sends Parse/Bind/Describe/Execute/Sync in one write, the simple protocol "
        "one Query message. In the closed loop the REST GET is answered on the node's event "
        "loop; a Postgres connection waits between rounds in the listener's reactor (one "
        "thread, one epoll over the idle connections), which answers a prepared key lookup "
        "from its cached plan (`Node.sql_here`, no DuckDB) and writes the answer itself, "
        "without waking the connection's thread. A profile of the node under the closed "
        "loop (py-spy, samples holding the interpreter lock) puts about 45% of a lookup in "
        "the SQL engine's key lookup, the path REST SQL takes too (bound text to shape to "
        "template, key access, the RocksDB read, rows as dicts), and the rest in the "
        "protocol's Python (framing and decoding Bind, binding the parameter as a literal, "
        "encoding the DataRow, cancel bookkeeping), no function above 7%. What is left to "
        "take: binding a prepared lookup's values straight into its plan (no text, no "
        "shape_of), and rows as tuples rather than dicts."
    ),
    "arrow": (
        "Every method first computes the result in the node (`node.sql`: read the "
        "partitions, run the statement in DuckDB, turn its answer into Python rows), which is "
        "most of the time; the rest is how the result travels. JSON encodes the rows with "
        "orjson and the caller parses text (decimals and timestamps arrive as strings). The "
        "Arrow answer turns the rows into typed columns (about what JSON's encoding costs), "
        "writes them as IPC record batches, and the caller reads them with no per-value "
        "work: half the bytes, and a `Client` or pandas caller gets typed data without "
        "building a Python value per cell. The SQL engine hands over Python rows today; once "
        "it hands over DuckDB's Arrow result, the Arrow answer can skip the rows and the "
        "conversion both."
    ),
    "flight": (
        "Every method first computes the result in the node (`node.sql`), most of the "
        "time; the rest is how it travels. Flight SQL and REST Arrow both turn the rows into "
        "typed Arrow columns and send IPC record batches (Flight over gRPC, with a "
        "GetFlightInfo round trip before the DoGet); the caller does no per-value work. The "
        "Postgres endpoint sends each value as text in a DataRow message and psycopg builds "
        "a Python tuple per row, a Python object per value."
    ),
    "sink_connect": (
        "A `foreachBatch` function under Connect runs in a Python process the server starts, "
        "and the DataFrame work it asks for goes back to the server over gRPC: by default "
        "sparkiq's sink collects the tagged batch as Arrow (an AnalyzePlan round trip for its "
        "schema, then one ExecutePlan), the baseline runs one `noop` write; the commit-record "
        "check, the offset log, the segments and the commit record are file operations in "
        "that Python process. Each child process holds one kind of session (PySpark cannot "
        "hold a classic and a Connect session in one process) and measures both sinks there "
        "after a warm-up run; session start-up is not part of any figure."
    ),
    "soak": (
        "A writer process commits a deterministic table every 0.2 s through sparkiq's own "
        "changelog writer (segments, then the commit record), three `sparkiq serve` nodes "
        "reach each other and their clients only through TCP proxies, and three client "
        "sessions read keys, all-partition ranges and SQL aggregates with monotonic bounds. "
        "Each minute one fault is injected in turn (kill -9 and restart, SIGSTOP, a "
        "partition by blackhole or by dropped connections, a slow network, a changelog store "
        "failing under the nodes or failing and tearing writes under the writer, the writer "
        "killed inside batches, a full disk under a replica), and the minute's answers are "
        "checked against the model's table at the batch each was served at "
        "(`tests/faults/checker.py`). A failed answer while a fault holds is unavailability; "
        "a wrong one is an anomaly. Resource slopes start after the 60 s history window has "
        "filled the replicas' versions. The soak runs only on request (`python -m bench.soak "
        "--minutes 30`; `--spare-node 0` keeps one node's incarnation for the whole run), and "
        "`python -m bench.run_all --only soak --write-docs` rewrites this section, which "
        "`make bench` keeps as it is. Its detailed log (each minute's fault and answers, "
        "memory by window, threads by pool, errors) is its console output and `--json`; "
        "`--samples FILE` writes every resource sample."
    ),
    "push": (
        "Latency is from just before the commit record is written to the subscriber "
        "receiving the probe row (on an event loop: with the NDJSON bytes its HTTP stream "
        "would send). With `notify()` the writer wakes the hub at once (the in-process App "
        "does); otherwise the hub finds the commit at its next poll. The tail decodes each "
        "batch once and evaluates it once per statement into a shared list of changes, "
        "handed to each subscription by reference (subscriptions of one statement that "
        "started at the same batch also share their WHERE state); each list's NDJSON lines "
        "are encoded once for every stream that sends them, and event-loop consumers are "
        "woken with one call into their loop per batch. A thread per consumer costs a GIL "
        "hand-off per thread per batch and iterates its changes in Python, which is why "
        "`sparkiq serve` awaits its push streams on the event loop. Full garbage "
        "collections of the process (tens of ms with 1,000 subscriptions) show in the p99."
    ),
}


#: What was learnt of each benchmark's path (profiles, what changed, what is left), one
#: Markdown file a benchmark, written under its section after CONTEXT: prose a rerun keeps.
NOTES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "notes")


def _notes(name: str) -> str:
    """``bench/notes/<name>.md``, or nothing."""
    try:
        with open(os.path.join(NOTES, f"{name}.md")) as handle:
            return handle.read().strip()
    except FileNotFoundError:
        return ""


def _docs(reports: list[Report], failures: dict[str, str], info: dict[str, Any]) -> str:
    m = info["machine"]
    lines = [
        "# Benchmarks",
        "",
        "Benchmarks of sparkiq in-process (an `App` or `Node`, changelog and replicas on "
        "local disk), over HTTP (`sparkiq serve` processes and a load generator on 127.0.0.1) "
        "and of its SQL engine. Each lives in `bench/` and prints its table when run alone "
        f"(`.venv/bin/python -m bench.{next(iter(BENCHMARKS))}`, "
        + ", ".join(f"`bench.{name}`" for name in list(BENCHMARKS)[1:])
        + "; `--quick` for a smaller run).",
        "",
        "Reproduce all of them with `make bench` (`python -m bench.run_all`), which rewrites "
        "this page. The machines these run on are shared and noisy: every figure is a "
        "median or a percentile, every benchmark compares against a baseline measured in the "
        "same run, and no timing is asserted anywhere. Compare ratios across machines, not "
        "absolute times.",
        "",
        "`make test` runs every benchmark in its smallest form (`--smoke`: tiny data, one "
        "round; `tests/test_bench_smoke.py`), so a benchmark that no longer runs fails CI; "
        "`python -m bench.run_all --smoke` does the same by hand in a few minutes. Smoke "
        "figures mean nothing and are never written here.",
        "",
        "`--flames` (on `make bench` or any one benchmark) runs each measured phase once more "
        "under py-spy and draws its flame graph into `docs/flames/`; the sections link them. "
        "They show where a path's CPU time goes, which is what the profile notes of each "
        "section read from. Those notes (what was profiled, changed, and is left) live in "
        "`bench/notes/<benchmark>.md` and every rewrite of this page keeps them.",
        "",
        f"**Last run:** {info['date']} ({info['scale']} run, "
        f"{info['duration_s'] / 60:.1f} min), sparkiq {info['code']}  ",
        f"**Machine:** {m['cpu']}, {m['cores']} cores, {m['ram']} RAM, {m['os']}  ",
        f"**Software:** Python {m['python']}, pyspark {m['pyspark']}, rocksdict "
        f"{m['rocksdict']}, pyarrow {m['pyarrow']}, {m['java']}  ",
        f"**Load average (1, 5, 15 min):** {info['load_before']} before, "
        f"{info['load_after']} after",
        "",
        "## Summary",
        "",
    ]
    for report in reports:
        lines += [f"- **{report.title}** - {r}" for r in report.readings]
    for name, error in failures.items():
        lines.append(f"- **{name}** - FAILED in this run: {error}")
    for report in reports:
        lines += [
            "",
            f"## {report.title}",
            "",
            f"Module: `bench/{report.name}.py`",
            "",
            f"- **Measured:** {report.measures}.",
            f"- **Baseline:** {report.baseline}.",
            f"- **Target:** {report.target}.",
            "",
            report.tables(),
            "",
        ]
        lines += [f"**Reading:** {r}" + "  " for r in report.readings]
        if report.notes:
            lines += ["", *[f"_Note:_ {n}" for n in report.notes]]
        if report.name in CONTEXT:
            lines += ["", CONTEXT[report.name]]
        notes = _notes(report.name)
        if notes:
            lines += ["", notes]
        flames = flames_of(report.name)
        if flames:
            links = ", ".join(f"[{p.stem}](flames/{p.name})" for p in flames)
            lines += [
                "",
                f"Flame graphs of the measured phases (py-spy, `--flames`; open one in a "
                f"browser to zoom and search): {links}.",
            ]
    lines.append("")
    return "\n".join(lines)


def _kept_sections(path: str, names: Sequence[str]) -> list[tuple[list[str], str]]:
    """The sections (and summary lines) of benchmarks ``names`` (ones this run did not
    rewrite), from the page being rewritten: a 30-minute soak's findings outlive ``make
    bench``, and ``--only http --write-docs`` rewrites the HTTP section alone."""
    if not names or not os.path.exists(path):
        return []
    with open(path) as handle:
        text = handle.read()
    sections = text.split("\n## ")
    summary = next((s for s in sections if s.startswith("Summary")), "")
    kept = []
    for section in sections[1:]:
        if not any(f"Module: `bench/{name}.py`" in section for name in names):
            continue
        title = section.splitlines()[0]
        bullets = [line for line in summary.splitlines() if line.startswith(f"- **{title}**")]
        kept.append((bullets, "## " + section.rstrip() + "\n"))
    return kept


def _with_kept(page: str, kept: list[tuple[list[str], str]]) -> str:
    """``page`` with the kept sections at its end and their lines in its summary."""
    if not kept:
        return page
    head, sep, rest = page.partition("\n## Summary\n\n")
    bullets = "".join(line + "\n" for lines, _ in kept for line in lines)
    return head + sep + bullets + rest.rstrip("\n") + "\n\n" + "\n".join(s for _, s in kept)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    add_scale_arguments(parser)
    parser.add_argument(
        "--only",
        default="",
        help=f"comma-separated subset of {', '.join(BENCHMARKS)}; also "
        f"{', '.join(ON_REQUEST)} (not run otherwise)",
    )
    parser.add_argument(
        "--write-docs",
        action="store_true",
        help="rewrite docs/benchmarks.md even for --quick or --only runs",
    )
    parser.add_argument("--json", metavar="PATH", help="also save every figure as JSON here")
    args = parser.parse_args(argv)
    scale = scale_of(args)
    if scale is Scale.SMOKE and args.write_docs:
        parser.error("--smoke figures mean nothing: they are never written to the docs")
    names = [n.strip() for n in args.only.split(",") if n.strip()] or list(BENCHMARKS)
    every = BENCHMARKS | ON_REQUEST
    unknown = sorted(set(names) - set(every))
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; choose from {list(every)}")

    info: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "scale": scale.value,
        "machine": machine(),
        "code": code_version(),
        "load_before": load_average(),
    }
    started = time.monotonic()
    reports: list[Report] = []
    failures: dict[str, str] = {}
    try:
        for name in names:
            t0 = time.monotonic()
            print(f"\n### {name} ...", flush=True)
            try:
                report = every[name](scale)
            except Exception as exc:
                traceback.print_exc()
                failures[name] = f"{type(exc).__name__}: {exc}"
                continue
            report.print()
            print(f"({name} took {time.monotonic() - t0:.0f} s)", flush=True)
            reports.append(report)
    finally:
        if any(uses_spark(every[n]) for n in names):
            from pyspark.sql import SparkSession

            session = SparkSession.getActiveSession()
            if session is not None:
                session.stop()
    info["duration_s"] = time.monotonic() - started
    info["load_after"] = load_average()
    if code_version() != info["code"]:
        info["code"] += f" at the start, {code_version()} at the end (code changed mid-run)"

    if (scale is Scale.FULL and names == list(BENCHMARKS)) or args.write_docs:
        os.makedirs(DOCS, exist_ok=True)
        path = os.path.join(DOCS, "benchmarks.md")
        # sections this run did not rewrite stay: on-request ones (the soak), those of a
        # partial run's other benchmarks, and a failed benchmark's last good one
        stale = [n for n in every if n not in names or n in failures]
        kept = _kept_sections(path, stale)
        with open(path, "w") as handle:
            handle.write(_with_kept(_docs(reports, failures, info), kept))
        print(f"\nwrote {path}")
    else:
        print(
            f"\ndocs/benchmarks.md left unchanged ({scale.value} or partial run; "
            "--write-docs forces but for --smoke)"
        )
    results = {"info": info, "failures": failures, **{r.name: r.as_dict() for r in reports}}
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=2, default=str)
    print(f"total {info['duration_s'] / 60:.1f} min")
    if failures:
        print(f"FAILED: {', '.join(failures)}", file=sys.stderr)
        raise SystemExit(1)
    return results


if __name__ == "__main__":
    main()
