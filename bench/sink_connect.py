"""Sink overhead per micro-batch under Spark Connect vs a classic session, in one run.

The query, input and sinks of :mod:`bench.sink` (a streaming aggregation over a file source,
one file of 10k rows per micro-batch; ``foreachBatch`` that only evaluates the batch vs a
:class:`sparkiq.App` materializing it), run on two kinds of session:

* classic: a local ``local[2]`` session;
* Connect: a Spark Connect session to a local Connect server (PySpark's own, its own JVM,
  ``local[2]``, the same settings); each ``foreachBatch`` call runs in a Python process the
  server starts and drives the batch through the server again.

Each child process holds one session and measures both sinks there as :mod:`bench.sink`
does (:func:`bench.sink.in_turns`): first a warm-up run of the baseline whose figures are
left out, then the baseline and the App in turns, each starting one of the rounds. Once a
process has made a Connect session, PySpark builds Connect columns for every session in it,
so the two kinds cannot share one process; children alternate between the kinds (and which
goes first), so drift on the shared machine hits both alike. Per-batch durations come from
``recentProgress`` after the warm-up batches, and every run reads the same input files.

Without the warm-up run, the baseline ran first in a fresh JVM (the child's, or the
Connect server's) and paid for its class loading and JIT compilation: the App then came out
below its own baseline in both kinds of session (bench/notes/sink_connect.md).

Run: ``python -m bench.sink_connect [--quick | --smoke]``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from bench import sink as sink_bench
from bench._common import Report, Scale, cli, median, scratch_dir, verdict
from bench.sink import (
    KEYSPACE,
    WARM_UP,
    Run,
    _run_app,
    _run_baseline,
    _session,
    in_turns,
    rows_per_file,
    warmup_batches,
    write_input,
)

SESSIONS = ("Connect", "classic")
SINKS = ("baseline (noop)", "sparkiq App")
#: Issue 28's target: Connect's overhead at most this much above classic's, per batch.
TARGET_MS = 30
#: Longest one child may take (session start, a Connect server, five queries).
RUN_TIMEOUT_S = 900


def _child(session: str, source: str, root: str, out: str, rounds: int, batches: int) -> None:
    """One child's share, in this (child) process: the baseline and the App in turns on
    ``session`` (see the module docstring); their per-batch durations written to ``out``
    as JSON."""
    from pyspark import cloudpickle

    # The baseline's foreachBatch function lives in bench.sink, which the Connect server's
    # Python workers cannot import (bench is not installed): ship it by value.
    cloudpickle.register_pickle_by_value(sink_bench)
    runs: dict[str, Run] = {SINKS[0]: _run_baseline, SINKS[1]: _run_app}
    with _session(session == "Connect") as spark:
        found = in_turns(spark, source, root, runs, rounds, batches, warmup=0)
    with open(out, "w") as handle:
        json.dump(found, handle)


def run(scale: Scale = Scale.FULL) -> Report:
    batches = scale.pick(12, 8, 1)
    children = scale.pick(2, 1, 1)  # per session kind
    rounds = scale.pick(2, 2, 1)  # in each child: each sink starts one round
    rows, warmup = rows_per_file(scale), warmup_batches(scale)
    found: dict[tuple[str, str], list[tuple[int, int, int]]] = {
        (s, k): [] for s in SESSIONS for k in (WARM_UP, *SINKS)
    }
    rng = random.Random(9)
    with scratch_dir("sink-connect") as root:
        source = write_input(os.path.join(root, "in"), batches, rng, rows)
        for c in range(children):
            order = SESSIONS if c % 2 == 0 else SESSIONS[::-1]
            for name in order:
                work = os.path.join(root, f"{name}-{c}")
                os.makedirs(work)
                out = os.path.join(work, "durations.json")
                subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "bench.sink_connect",
                        "--child",
                        name,
                        source,
                        work,
                        out,
                        "--rounds",
                        str(rounds),
                        "--batches",
                        str(batches),
                    ],
                    check=True,
                    timeout=RUN_TIMEOUT_S,
                    cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                )
                with open(out) as handle:
                    durations = json.load(handle)
                for sink in (WARM_UP, *SINKS):
                    found[name, sink] += [tuple(d) for d in durations[sink] if d[0] >= warmup]
    report = Report(
        name="sink_connect",
        title="Sink overhead per micro-batch: Spark Connect vs classic",
        measures=(
            "duration of one micro-batch of the streaming aggregation of the section above "
            f"(one file of {rows:,} rows per batch, keys drawn from {KEYSPACE:,}, "
            f"local[2], 4 shuffle partitions), {batches - warmup} batches per run after "
            f"{warmup} warm-up batches, {children * rounds} run(s) per sink and session; a "
            "classic session and a Connect session to a local Spark Connect server (its own "
            f"JVM), each in {children} process(es) of its own, processes alternating between "
            "the kinds; in each, a warm-up run of the baseline left out, then the baseline "
            "and the App in turns (`bench.sink.in_turns`)"
        ),
        baseline=(
            "per session, the same query (same source, plan and trigger) with `foreachBatch` "
            'that only evaluates the batch (`df.write.format("noop")`), in the same process; '
            "the classic session's overhead, measured in the same run"
        ),
        target=f"<= +{TARGET_MS} ms per batch more under Connect than classic (issue 28)",
        columns=["session", "sink", "batches", "triggerExecution median ms", "addBatch median ms"],
        scale=scale,
    )
    medians: dict[tuple[str, str], tuple[float, float]] = {
        key: (median([d[1] for d in values]), median([d[2] for d in values]))
        for key, values in found.items()
    }
    overhead: dict[str, float] = {}
    for session in SESSIONS:

        def row(sink: str, session: str = session) -> list[str]:
            trigger, add = medians[session, sink]
            return [session, sink, str(len(found[session, sink])), f"{trigger:,.0f}", f"{add:,.0f}"]

        (base_t, base_a), (app_t, app_a) = (medians[session, s] for s in SINKS)
        overhead[session] = app_t - base_t
        report.rows += [
            *(row(sink) for sink in SINKS),
            [
                session,
                "difference (App - baseline)",
                "",
                f"{app_t - base_t:+,.0f} ({app_t / base_t:.2f}x)",
                f"{app_a - base_a:+,.0f} ({app_a / base_a:.2f}x)",
            ],
            row(WARM_UP),
        ]
    extra = overhead["Connect"] - overhead["classic"]
    report.readings.append(
        f"sparkiq adds {overhead['Connect']:+,.0f} ms per micro-batch under Spark Connect vs "
        f"{overhead['classic']:+,.0f} ms with a classic session (same run, alternated): "
        f"{extra:+,.0f} ms per batch for Connect; "
        + verdict(max(extra, 0.0), TARGET_MS, "ms", at_most=True)
    )
    report.readings.append(
        "the warm-up run, first in its process's fresh JVM, took "
        + " and ".join(
            f"{medians[s, WARM_UP][0]:,.0f} ms per batch ({s}; "
            f"{medians[s, WARM_UP][0] - medians[s, SINKS[0]][0]:+,.0f} vs the baseline after it)"
            for s in SESSIONS
        )
        + ": the cost a sink measured first in a fresh process would be charged"
    )
    report.figures = {
        "median_trigger_ms": {f"{s} / {k}": m[0] for (s, k), m in medians.items()},
        "median_add_batch_ms": {f"{s} / {k}": m[1] for (s, k), m in medians.items()},
        "overhead_ms": overhead,
    }
    return report


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """``--quick`` or ``--smoke`` as every benchmark; ``--child SESSION SOURCE ROOT OUT`` is
    one run, in the child process :func:`run` starts."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--child"]:
        parser = argparse.ArgumentParser(description="one run of bench.sink_connect")
        parser.add_argument("--child", choices=SESSIONS, required=True)
        for name in ("source", "root", "out"):
            parser.add_argument(name)
        parser.add_argument("--rounds", type=int, required=True)
        parser.add_argument("--batches", type=int, required=True)
        child = parser.parse_args(args)
        _child(child.child, child.source, child.root, child.out, child.rounds, child.batches)
        return {}
    return cli(run, args, __doc__).as_dict()


if __name__ == "__main__":
    main()
