"""Sink overhead per micro-batch: a streaming aggregation with and without sparkiq.

The same query - ``groupBy("k").agg(count, sum)`` over a file source that takes one file of
10k rows (keys drawn from 10k) per micro-batch - runs to these sinks on one local[2] session:

* baseline - ``foreachBatch`` that only evaluates the batch
  (``df.write.format("noop").mode("overwrite").save()``: Spark 4 needs a stateful batch
  fully evaluated, so an empty function is not an option);
* :class:`sparkiq.App` materializing it as it runs by default, with as many partitions as
  the aggregation's state (4, the session's shuffle partitions): a batch whose table's
  previous batch was small (all of them here but the first) is collected as Arrow and
  written on the driver, with no Python stage in Spark; its local node applies each batch
  in the same process meanwhile;
* the same App started without its local node (``start(local_node=False)``): the sink, the
  commit watcher and the writer status thread, without a node applying each batch on the
  same two cores; the difference between the two is the serving node's cost, the
  difference from the baseline the sink's own;
* the same App with its segments written by tasks (``SPARKIQ_SINK_WRITE=tasks``): with 4
  partitions the batch already sits in the table's partitions, so each task of the batch's
  last stage encodes and writes its partition's segment where it is (no shuffle); with 8
  (another count than the state's) the sink tags rows with their partition and shuffles
  them into write tasks first (the general path).

The sink's own phases (its ``DEBUG`` log record of each batch: the Spark job, the write
tasks' receive / encode / write / verify time, the driver's checks and commit record) are
collected from the ``sparkiq.sink`` logger; under Spark Connect the sink runs in the
server's Python process, so there are none.

Per-batch durations come from ``query.recentProgress`` (``durationMs.triggerExecution``, the
whole micro-batch, and ``durationMs.addBatch``, the sink's part), leaving out the first
batches of each run (warm-up). A second table splits each sink's batch by phase: Spark's
other ``durationMs`` phases (``latestOffset``, ``queryPlanning``, ``walCommit``,
``commitOffsets``: outside ``addBatch``), and ``addBatch`` into the time inside the
``foreachBatch`` function (the baseline's ``noop`` write timed around it; the App's from its
sink's phases) and the rest (Spark calling the Python function and back through py4j). A
third gives each sink's CPU time per batch: this process's, the App's driver threads' in it
(local node, commit watcher, writer status) and the JVM's (:mod:`bench._batch_cost`).

Full and quick runs have three rounds, each starting with the next sink, after a run of the
baseline whose figures are left out (:func:`warm_up`: a fresh JVM runs its first query
slower). :func:`in_turns` is that method; ``bench.sink_connect`` measures with it too.

With ``--connect`` the same runs go through Spark Connect: a local Connect server (its own
JVM, ``local[2]``, the same settings) runs the queries, and each ``foreachBatch`` call runs
in a Python process the server starts, which drives the batch through the server again.

Run: ``python -m bench.sink [--quick | --smoke] [--connect]``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from bench._batch_cost import (
    CALL_PHASES,
    CPU_COLUMNS,
    INSIDE,
    PHASE_COLUMNS,
    cpu_table,
    phase_table,
    process_cpu_ms,
    progress_field,
    spark_phases,
    thread_cpu_ms,
)
from bench._common import (
    Report,
    Scale,
    add_scale_arguments,
    median,
    scale_of,
    scratch_dir,
    spark_session,
    write_json_rows,
)
from bench._flames import enabled as flames_enabled
from bench._flames import flame
from sparkiq import App
from sparkiq.changelog import Changelog
from sparkiq.spark.sink import WRITE_ENV

TABLE = "sinkbench"
#: The table's partitions when its batches are written in place: the session's
#: ``spark.sql.shuffle.partitions`` (bench._common's session), the aggregation state's count.
IN_PLACE_PARTITIONS = 4
#: Another count: the general path (tag, shuffle, write).
SHUFFLED_PARTITIONS = 8
BASELINE = "baseline (noop)"
DRIVER = f"sparkiq App, the default ({IN_PLACE_PARTITIONS} partitions)"
NO_NODE = f"sparkiq App, the default, no local node ({IN_PLACE_PARTITIONS} partitions)"
IN_PLACE = f"sparkiq App, tasks in place ({IN_PLACE_PARTITIONS} partitions)"
SHUFFLED = f"sparkiq App, tasks shuffled ({SHUFFLED_PARTITIONS} partitions)"
SHORT = {
    DRIVER: "default",
    NO_NODE: "default, no local node",
    IN_PLACE: "tasks in place",
    SHUFFLED: "tasks shuffled",
}
#: Each App run: its table's partitions, its folder, ``SPARKIQ_SINK_WRITE`` (None: unset)
#: and whether the App starts its local node.
APP_RUNS = {
    DRIVER: (IN_PLACE_PARTITIONS, "app4", None, True),
    NO_NODE: (IN_PLACE_PARTITIONS, "app4-no-node", None, False),
    IN_PLACE: (IN_PLACE_PARTITIONS, "tasks4", "tasks", True),
    SHUFFLED: (SHUFFLED_PARTITIONS, "tasks8", "tasks", True),
}
WARMUP_BATCHES = 2
ROWS_PER_FILE = 10_000
KEYSPACE = 10_000


def warmup_batches(scale: Scale) -> int:
    """First batches of a run left out of its figures: WARMUP_BATCHES, but a smoke run
    measures its one batch."""
    return scale.pick(WARMUP_BATCHES, WARMUP_BATCHES, 0)


def rows_per_file(scale: Scale) -> int:
    """Rows in each input file (one micro-batch): ROWS_PER_FILE but in a smoke run."""
    return scale.pick(ROWS_PER_FILE, ROWS_PER_FILE, 200)


def write_input(source: str, batches: int, rng: random.Random, rows: int = ROWS_PER_FILE) -> str:
    """``batches`` JSON files of ``rows`` ``(key, n)`` rows over KEYSPACE keys in the new
    folder ``source``, one file per micro-batch (the input every sink benchmark reads).
    Every file holds ``key-000000`` (the key the runs check)."""
    os.makedirs(source)
    for index in range(batches):
        drawn = [("key-000000", rng.randrange(100))]
        drawn += [
            (f"key-{rng.randrange(KEYSPACE):06d}", rng.randrange(100)) for _ in range(rows - 1)
        ]
        write_json_rows(source, index, drawn)
    return source


def _evaluate_only(df: Any, batch_id: int) -> None:
    df.write.format("noop").mode("overwrite").save()


class _TimedBaseline:
    """The baseline's ``foreachBatch`` function, timing its ``noop`` write by batch id (a
    classic session only: under Spark Connect the function runs in another process)."""

    def __init__(self) -> None:
        self.inside_ms: dict[int, float] = {}

    def __call__(self, df: Any, batch_id: int) -> None:
        started = time.perf_counter()
        _evaluate_only(df, batch_id)
        self.inside_ms[batch_id] = 1e3 * (time.perf_counter() - started)


def _durations(progress: Sequence[Any]) -> list[tuple[int, int, int]]:
    """``(batch id, triggerExecution ms, addBatch ms)`` of batches that had input."""
    out = []
    for p in progress:
        if not progress_field(p, "numInputRows"):
            continue
        duration = progress_field(p, "durationMs")
        out.append(
            (
                int(progress_field(p, "batchId")),
                int(duration["triggerExecution"]),
                int(duration.get("addBatch", 0)),
            )
        )
    return sorted(out)


def _aggregation(spark: Any, source: str) -> Any:
    from pyspark.sql import functions as F

    df = spark.readStream.schema("k string, v long").option("maxFilesPerTrigger", 1).json(source)
    return df.groupBy("k").agg(F.count("*").alias("n"), F.sum("v").alias("total"))


def _run_baseline(
    spark: Any,
    source: str,
    root: str,
    function: Callable[[Any, int], None] = _evaluate_only,
    seen: dict[int, dict[str, int]] | None = None,
) -> list[tuple[int, int, int]]:
    """A run of the baseline (``function``: its ``foreachBatch`` function); ``seen`` gets
    every ``durationMs`` phase of its batches (:func:`spark_phases`)."""
    query = (
        _aggregation(spark, source)
        .writeStream.outputMode("update")
        .option("checkpointLocation", os.path.join(root, "checkpoint"))
        .foreachBatch(function)
        .start()
    )
    try:
        query.processAllAvailable()
        if seen is not None:
            seen.update(spark_phases(query.recentProgress))
        return _durations(query.recentProgress)
    finally:
        query.stop()


def _run_app(
    spark: Any,
    source: str,
    root: str,
    partitions: int = IN_PLACE_PARTITIONS,
    write: str | None = None,
    local_node: bool = True,
    seen: dict[int, dict[str, int]] | None = None,
    threads: dict[str, float] | None = None,
) -> list[tuple[int, int, int]]:
    """A run of the App; ``write``: ``SPARKIQ_SINK_WRITE`` where it starts (None: unset,
    small batches on the driver); ``local_node``: start the App with its local node;
    ``seen`` gets every ``durationMs`` phase of its batches (:func:`spark_phases`),
    ``threads`` the CPU time its driver threads used (:func:`thread_cpu_ms`)."""
    app = App(spark, state_dir=os.path.join(root, "state"), name="bench")
    app.materialize(TABLE, _aggregation(spark, source), key="k", partitions=partitions)
    before = os.environ.pop(WRITE_ENV, None)
    if write is not None:
        os.environ[WRITE_ENV] = write
    try:
        app.start(local_node=local_node)  # the sink reads the variable when its query starts
    finally:
        os.environ.pop(WRITE_ENV, None)
        if before is not None:
            os.environ[WRITE_ENV] = before
    try:
        app.process_all_available()
        progress = app.tables[TABLE].query.recentProgress
        if local_node:
            assert app.get(TABLE, "key-000000") is not None
        else:  # the batches are committed all the same
            assert Changelog(app.state_dir, TABLE).committed_batch_ids()
        if seen is not None:
            seen.update(spark_phases(progress))
        if threads is not None:  # while they run: they end with the App
            threads.update(thread_cpu_ms())
        return _durations(progress)
    finally:
        app.stop()


#: A run: ``(spark, source, root)`` -> its ``(batch id, triggerExecution ms, addBatch ms)``.
Run = Callable[[Any, str, str], list[tuple[int, int, int]]]


#: :func:`in_turns`'s entry for the warm-up run's durations (not a sink: left out of figures).
WARM_UP = "warm-up run of the baseline (left out)"


def warm_up(spark: Any, source: str, root: str) -> list[tuple[int, int, int]]:
    """Run the baseline query over every input file once; its durations, which no figure
    counts.

    A fresh JVM (the local session's or a Connect server's) runs its first streaming query's
    batches a third slower or more than later ones (class loading, JIT compilation, the
    first Python workers): without this, whichever run comes first in a process is charged
    for it. ``bench.sink_connect`` used to run its baseline first in a fresh process, and the
    App came out up to 100 ms a batch below it (bench/notes/sink_connect.md)."""
    return _run_baseline(spark, source, os.path.join(root, "warm-up"))


def in_turns(
    spark: Any,
    source: str,
    root: str,
    runs: Mapping[str, Run],
    rounds: int,
    batches: int,
    warmup: int,
) -> dict[str, list[tuple[int, int, int]]]:
    """Each of ``runs`` ``rounds`` times on ``spark``, after :func:`warm_up`; each round
    starts with the next run (on a shared machine a run's place in the round - load
    drifting, the previous query's clean-up - weighs more than the sink). Each run must see
    ``batches`` batches with input; the durations of those from batch ``warmup`` on, by run,
    and the warm-up run's under :data:`WARM_UP` (to show what it absorbed).
    """
    names = list(runs)
    found: dict[str, list[tuple[int, int, int]]] = {name: [] for name in names}
    found[WARM_UP] = [d for d in warm_up(spark, source, root) if d[0] >= warmup]
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            durations = runs[name](spark, source, os.path.join(root, f"{_folder(name)}-{r}"))
            if len(durations) != batches:
                raise RuntimeError(f"{name} ran {len(durations)} batches with input, not {batches}")
            found[name] += [d for d in durations if d[0] >= warmup]
    return found


def _folder(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name).strip("-")


class _PhaseLog(logging.Handler):
    """Collects the phases the sink logs for each batch (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.batches: dict[int, dict[str, float]] = {}

    def emit(self, record: logging.LogRecord) -> None:
        phases = getattr(record, "sparkiq_sink_phases", None)
        if phases is not None:
            self.batches[int(getattr(record, "sparkiq_batch_id", -1))] = dict(phases)

    @contextlib.contextmanager
    def listening(self) -> Iterator[dict[int, dict[str, float]]]:
        """The phases of each batch the sink logs meanwhile, by batch id."""
        logger = logging.getLogger("sparkiq.sink")
        level = logger.level
        self.batches = {}
        logger.addHandler(self)
        logger.setLevel(logging.DEBUG)
        try:
            yield self.batches
        finally:
            logger.removeHandler(self)
            logger.setLevel(level)


@contextlib.contextmanager
def _session(connect: bool, given: Any = None) -> Iterator[Any]:
    """The classic session (``given``, or the local one), or a Spark Connect session to a
    local Connect server."""
    if not connect:
        yield given if given is not None else spark_session()
        return
    from sparkiq.testing import connect_server
    from sparkiq.testing import spark_session as test_session

    with connect_server() as address:
        session = test_session("sparkiq-bench", remote=address)
        try:
            yield session
        finally:
            session.stop()


def run(scale: Scale = Scale.FULL, connect: bool = False, spark: Any = None) -> Report:
    """``spark``: the classic session to run on (default: the local one of
    :func:`spark_session`); ``connect`` starts a Connect server and its own session instead."""
    if connect and spark is not None:
        raise ValueError("connect=True runs on a Spark Connect session of its own: no spark=")
    batches = scale.pick(12, 8, 1)
    # three: each round starts with the next sink, and every sink runs early and late
    rounds = scale.pick(3, 3, 1)
    rows, warmup = rows_per_file(scale), warmup_batches(scale)
    report = Report(
        name="sink_connect" if connect else "sink",
        title="Sink overhead per micro-batch" + (" under Spark Connect" if connect else ""),
        measures=(
            "duration of one micro-batch of a streaming aggregation (file source, one file of "
            f"{rows:,} rows per batch, keys drawn from {KEYSPACE:,}, local[2], 4 shuffle "
            + ("partitions, through a local Spark Connect server" if connect else "partitions")
            + f"), from `recentProgress`; {batches - warmup} batches per run "
            f"after {warmup} warm-up batches, {rounds} run(s) per sink, each round starting "
            "with the next sink, after a warm-up run of the baseline left out"
        ),
        baseline=(
            "the same query with `foreachBatch` that only evaluates the batch "
            '(`df.write.format("noop")`)'
        ),
        target="<= 1.1x the baseline's micro-batch duration, as sparkiq runs by default (issue 28)",
        columns=["sink", "batches", "triggerExecution median ms", "addBatch median ms"],
        scale=scale,
    )
    rng = random.Random(9)
    phases: dict[str, list[dict[str, float]]] = {name: [] for name in APP_RUNS}
    # each measured batch's figures by sink: Spark's phases and the time in the function
    batch_phases: dict[str, list[dict[str, float]]] = {name: [] for name in (BASELINE, *APP_RUNS)}
    # CPU time per batch of each run, by sink (a classic session: Connect's run elsewhere)
    cpu: dict[str, list[dict[str, float]]] = {name: [] for name in (BASELINE, *APP_RUNS)}
    handler = _PhaseLog()

    def measured_cpu(
        name: str, spark: Any, run: Callable[[dict[str, float]], list[tuple[int, int, int]]]
    ) -> list[tuple[int, int, int]]:
        """``run(threads)``'s result, its CPU time per batch (with ``threads``, the App's
        threads' figures, filled in by ``run``) kept under ``name``."""
        threads: dict[str, float] = {}
        before = {} if connect else process_cpu_ms(spark)
        found = run(threads)
        after = {} if connect else process_cpu_ms(spark)
        used = {k: after[k] - before[k] for k in before if k in after}
        if used and found:
            cpu[name].append({k: v / len(found) for k, v in {**used, **threads}.items()})
        return found

    def kept(name: str, seen: dict[int, dict[str, int]], inside: dict[int, float]) -> None:
        for batch_id, durations in sorted(seen.items()):
            if batch_id >= warmup:
                batch_phases[name].append({**durations, INSIDE: inside.get(batch_id, float("nan"))})

    def app_run(name: str) -> Run:
        count, _, write, local_node = APP_RUNS[name]

        def one(spark: Any, source: str, root: str) -> list[tuple[int, int, int]]:
            seen: dict[int, dict[str, int]] = {}
            with handler.listening() as logged:
                found = measured_cpu(
                    name,
                    spark,
                    lambda threads: _run_app(
                        spark, source, root, count, write, local_node, seen, threads
                    ),
                )
            phases[name] += [logged[b] for b in sorted(logged) if b >= warmup]
            kept(name, seen, {b: sum(p[k] for k in CALL_PHASES) for b, p in logged.items()})
            return found

        return one

    def baseline_run(spark: Any, source: str, root: str) -> list[tuple[int, int, int]]:
        seen: dict[int, dict[str, int]] = {}
        # classic: the function runs here, so it can time its write (Connect: elsewhere)
        function = _evaluate_only if connect else _TimedBaseline()
        found = measured_cpu(
            BASELINE, spark, lambda _: _run_baseline(spark, source, root, function, seen)
        )
        kept(BASELINE, seen, getattr(function, "inside_ms", {}))
        return found

    runs: dict[str, Run] = {BASELINE: baseline_run}
    runs.update({name: app_run(name) for name in APP_RUNS})
    with scratch_dir("sink") as root, _session(connect, spark) as spark:
        source = write_input(os.path.join(root, "in"), batches, rng, rows)
        results = in_turns(spark, source, root, runs, rounds, batches, warmup)
        warm = results.pop(WARM_UP)
        if flames_enabled() and not connect:  # a pass of its own, the figures' left unsampled
            count, folder, write, local_node = APP_RUNS[DRIVER]
            with flame("sink-default"):
                _run_app(
                    spark, source, os.path.join(root, f"{folder}-flame"), count, write, local_node
                )

    medians = {
        name: (median([d[1] for d in found]), median([d[2] for d in found]))
        for name, found in results.items()
    }
    for name, (trigger, add) in medians.items():
        report.rows.append([name, str(len(results[name])), f"{trigger:,.0f}", f"{add:,.0f}"])
    base_t, base_a = medians[BASELINE]
    for name in APP_RUNS:
        app_t, app_a = medians[name]
        report.rows.append(
            [
                f"difference ({SHORT[name]} - baseline)",
                "",
                f"{app_t - base_t:+,.0f} ({app_t / base_t:.2f}x)",
                f"{app_a - base_a:+,.0f} ({app_a / base_a:.2f}x)",
            ]
        )
    (app_t, app_a), (bare_t, _), (tasks_t, _), (shuffled_t, _) = (
        medians[name] for name in APP_RUNS
    )
    report.readings = [
        f"materializing with sparkiq adds {app_t - base_t:+,.0f} ms per micro-batch "
        f"({app_t / base_t:.2f}x the evaluate-only batch, {app_t:,.0f} vs {base_t:,.0f} ms) as "
        f"it runs by default (batches of {rows:,} rows written on the driver); the sink's own "
        f"part (addBatch) goes from {base_a:,.0f} to {app_a:,.0f} ms. Without the App's local "
        f"node {bare_t:,.0f} ms ({bare_t - base_t:+,.0f}, {bare_t / base_t:.2f}x): the node "
        f"applying each batch on the same two cores accounts for {app_t - bare_t:+,.0f}. "
        f"Written by tasks: {tasks_t:,.0f} ms in place ({tasks_t / base_t:.2f}x), "
        f"{shuffled_t:,.0f} ms after a shuffle to {SHUFFLED_PARTITIONS} partitions "
        f"({shuffled_t / base_t:.2f}x)."
    ]
    table = phase_table(batch_phases)
    report.more_tables.append((PHASE_COLUMNS, [[name, *row] for name, row in table.items()]))
    cpu_rows = cpu_table(cpu)
    if cpu_rows:
        report.more_tables.append((CPU_COLUMNS, [[name, *row] for name, row in cpu_rows.items()]))
    phase_medians = {
        name: {k: median([b[k] for b in logged]) for k in logged[0]}
        for name, logged in phases.items()
        if logged
    }
    if phase_medians:
        report.readings.append(
            "the sink's phases, median ms per batch (tasks_*: summed over its write tasks): "
            + "; ".join(
                f"{SHORT[name]}: "
                + ", ".join(f"{k.removesuffix('_ms')} {v:.1f}" for k, v in found.items())
                for name, found in phase_medians.items()
            )
        )
    if warm:  # printed only: what the warm-up run, first in the session, took
        report.console.append(
            f"{WARM_UP}: triggerExecution median {median([d[1] for d in warm]):,.0f} ms, "
            f"addBatch {median([d[2] for d in warm]):,.0f} ms"
        )
    report.figures = {
        "median_trigger_ms": {n: m[0] for n, m in medians.items()},
        "median_add_batch_ms": {n: m[1] for n, m in medians.items()},
        "sink_phases_median_ms": phase_medians,
        "batch_phases_median_ms": table,
        "cpu_ms_per_batch": cpu_rows,
        "all_batches": results,
        "all_batch_phases": batch_phases,
    }
    return report


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Parse ``--quick`` or ``--smoke`` and ``--connect``, run, print the report, return its
    figures."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").strip().splitlines()[0])
    add_scale_arguments(parser)
    parser.add_argument("--connect", action="store_true", help="run through Spark Connect")
    args = parser.parse_args(argv)
    report = run(scale_of(args), args.connect)
    report.print()
    return report.as_dict()


if __name__ == "__main__":
    main()
