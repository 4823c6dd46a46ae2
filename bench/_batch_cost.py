"""Where a micro-batch's time and CPU go, for ``bench.sink``: Spark's phases of each batch
(``durationMs`` from ``recentProgress``), the time inside the ``foreachBatch`` function, and
the CPU time of this process, of an App's driver threads and of the local session's JVM.

Each table's row is medians over a sink's batches or runs; each column is its own median,
so the columns need not add up.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from bench._common import median

#: Spark's phases of a micro-batch outside ``addBatch`` shown in the phase table (the few
#: others, getBatch and setOffsetRange among them, take a millisecond or less here).
SPARK_PHASES = ("latestOffset", "queryPlanning", "walCommit", "commitOffsets")


def progress_field(progress: Any, name: str) -> Any:
    """A field of a ``recentProgress`` entry: an object or a dict, by session kind."""
    value = getattr(progress, name, None)
    return progress[name] if value is None else value


def spark_phases(progress: Sequence[Any]) -> dict[int, dict[str, int]]:
    """Every ``durationMs`` phase of each batch that had input, by batch id."""
    return {
        int(progress_field(p, "batchId")): {
            k: int(v) for k, v in dict(progress_field(p, "durationMs")).items()
        }
        for p in progress
        if progress_field(p, "numInputRows")
    }


#: The App's driver threads whose CPU time a run reports, by the start of their names.
APP_THREADS = {
    "sparkiq-tailer-": "local node",
    "sparkiq-commits-": "commit watcher",
    "sparkiq-writer-": "writer status",
}


def thread_cpu_ms() -> dict[str, float]:
    """CPU time (ms) the live threads of :data:`APP_THREADS` have used, by kind (Linux's
    per-thread ``schedstat``; empty elsewhere)."""
    used: dict[str, float] = {}
    for thread in threading.enumerate():
        kind = next((k for p, k in APP_THREADS.items() if thread.name.startswith(p)), None)
        if kind is None or thread.native_id is None:
            continue
        try:
            with open(f"/proc/self/task/{thread.native_id}/schedstat") as handle:
                nanoseconds = int(handle.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue
        used[kind] = used.get(kind, 0.0) + nanoseconds / 1e6
    return used


#: :func:`process_cpu_ms`'s figures.
PYTHON_CPU, JVM_CPU = "Python process", "Spark JVM"


def process_cpu_ms(spark: Any) -> dict[str, float]:
    """CPU time (ms) used so far by this process (every thread) and by the local session's
    JVM (Linux's ``/proc``; left out where it cannot be read)."""
    times = os.times()
    used = {PYTHON_CPU: 1e3 * (times.user + times.system)}
    process = getattr(getattr(spark.sparkContext, "_gateway", None), "proc", None)
    try:
        with open(f"/proc/{process.pid}/stat") as handle:  # type: ignore[union-attr]
            fields = handle.read().rsplit(")", 1)[1].split()
        used[JVM_CPU] = 1e3 * (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (AttributeError, OSError, ValueError, IndexError):
        pass
    return used


CPU_COLUMNS = [
    "sink (CPU ms per batch, median of runs)",
    PYTHON_CPU,
    *(f"of which {kind}" for kind in APP_THREADS.values()),
    JVM_CPU,
]


def cpu_table(runs: Mapping[str, Sequence[Mapping[str, float]]]) -> dict[str, list[str]]:
    """Each sink's row of the CPU table: medians over its runs of the CPU time per batch
    with input (whole runs: the App's start and stop count too) of this process, of the
    App's driver threads in it, and of the JVM; "-" where not measured."""

    def med(name: str, key: str) -> str:
        values = [r[key] for r in runs[name] if key in r]
        return f"{median(values):,.1f}" if values else "-"

    return {
        name: [med(name, k) for k in (PYTHON_CPU, *APP_THREADS.values(), JVM_CPU)]
        for name in runs
        if runs[name]
    }


#: The sink's phases that make up its ``__call__`` (what it logs; the rest is its logging).
CALL_PHASES = ("prepare_ms", "job_ms", "check_ms", "commit_ms")
#: A batch's time inside the ``foreachBatch`` function, in :func:`phase_table`'s input.
INSIDE = "inside"
PHASE_COLUMNS = [
    "sink (median ms per batch)",
    "triggerExecution",
    "outside addBatch",
    *SPARK_PHASES,
    "addBatch",
    "in the function",
    "addBatch outside the function",
]


def phase_table(batches: Mapping[str, Sequence[Mapping[str, float]]]) -> dict[str, list[str]]:
    """Each sink's row of the phase table: medians over its batches of Spark's phases, of
    the time outside ``addBatch`` (triggerExecution - addBatch) and of ``addBatch`` inside
    and outside the ``foreachBatch`` function ("-" where the function was not timed). Each
    column is its own median: they need not add up."""

    def med(values: Sequence[float]) -> str:
        values = [v for v in values if v == v]  # NaN: not timed
        return f"{median(values):,.0f}" if values else "-"

    table = {}
    for name, found in batches.items():
        if not found:
            continue
        table[name] = [
            med([b["triggerExecution"] for b in found]),
            med([b["triggerExecution"] - b.get("addBatch", 0) for b in found]),
            *(med([b.get(k, 0) for b in found]) for k in SPARK_PHASES),
            med([b.get("addBatch", 0) for b in found]),
            med([b[INSIDE] for b in found]),
            med([b.get("addBatch", 0) - b[INSIDE] for b in found]),
        ]
    return table
