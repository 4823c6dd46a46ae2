"""``sparkiq demo``: a shop pipeline on Spark's built-in ``rate`` source, served live.

The generator turns each ``rate`` row into an order: a product ``p-0``..``p-49``, a user
``u-0``..``u-199`` and an amount. Three tables are materialized:

- ``revenue_by_product`` (key ``product``): orders and revenue per product;
- ``orders_by_user`` (key ``user``): orders and last order time per user;
- ``revenue_per_window`` (key ``product``, 10-second tumbling windows).

What a user sees, in order: the web console's URL (the first line, before Spark starts: a
node serving the state_dir over HTTP, with the console at ``/``), where Spark's log goes,
then a compact summary of the live tables, redrawn in place on a terminal (one line per
update when stdout is not one). Ctrl-C stops the Spark queries, then the node, then Spark,
with nothing from Spark on the screen: the JVM's output goes to ``<state_dir>/logs/spark.log``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from rich.console import Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from sparkiq.errors import SparkiqError
from sparkiq.node import Node

__all__ = ["DEMO_LISTEN", "build_orders", "run_demo"]

#: Where the demo's node listens unless told: the address `sparkiq query`/`shell` try first.
DEMO_LISTEN = "127.0.0.1:8081"

#: How long the demo waits for its first served micro-batch before giving up.
_FIRST_BATCH_TIMEOUT = 300.0

TABLES = ("revenue_by_product", "orders_by_user", "revenue_per_window")


def build_orders(spark: Any, rate: int) -> Any:
    """The demo's order stream: deterministic per ``rate`` row value."""
    from pyspark.sql import functions as F

    return (
        spark.readStream.format("rate")
        .option("rowsPerSecond", rate)
        .load()
        .select(
            F.col("timestamp").alias("ts"),
            F.concat(F.lit("p-"), (F.col("value") % 50).cast("string")).alias("product"),
            F.concat(F.lit("u-"), ((F.col("value") * 31) % 200).cast("string")).alias("user"),
            (((F.col("value") * 7919) % 1000) / 10.0).alias("amount"),
        )
    )


@contextlib.contextmanager
def _output_to(path: str) -> Iterator[None]:
    """Inside the block, file descriptors 1 and 2 write to ``path``. A process started
    inside (the JVM, and the Python workers it forks later) keeps writing there after the
    block; this process gets its terminal back."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(log, 1)
        os.dup2(log, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, log):
            os.close(fd)


def _spark(log_path: str) -> Any:
    from sparkiq.testing import LOCAL_SPARK_CONF, spark_session

    with _output_to(log_path):
        return spark_session(
            "sparkiq-demo",
            config={
                "spark.ui.enabled": "true",  # the demo is for watching
                # WARN and above, all into the log file (the JVM's stderr is that file); the
                # thread stack size the tests' session sets is kept
                "spark.log.level": "WARN",
                "spark.driver.extraJavaOptions": LOCAL_SPARK_CONF["spark.driver.extraJavaOptions"],
            },
        )


def _start_node(state_dir: str, listen: str) -> Node:
    """The demo's serving node, with the console; on the next free port when ``listen``'s
    is taken (another demo, a `sparkiq serve`)."""
    options: dict[str, Any] = {"node_id": "demo", "peers": None, "token": None, "standbys": 0}
    first = Node(state_dir, listen=listen, **options)
    try:
        return first.start()
    except (OSError, SparkiqError):
        first.stop()  # closes the replicas it opened before the port was refused
        host = listen.rsplit(":", 1)[0]
        return Node(state_dir, listen=f"{host}:0", **options).start()


class _Summary:
    """What the demo shows of the live tables, read through the node as any client would."""

    def __init__(self, node: Node) -> None:
        self.node = node

    def read(self) -> dict[str, Any] | None:
        """The facts of one update, or None before the first micro-batch is served."""
        node = self.node
        batches = {s.table: s.batch_id for s in node.status()}
        if not batches or max(batches.values()) < 0 or set(TABLES) - set(node.tables):
            return None
        top = node.sql(
            "SELECT product, orders, revenue FROM revenue_by_product ORDER BY revenue DESC LIMIT 3"
        ).rows
        windows = node.sql(
            "SELECT WINDOWSTART AS window_start, revenue FROM revenue_per_window "
            "WHERE product = 'p-7' ORDER BY window_start DESC LIMIT 3"
        ).rows
        if not top:  # the first batch is committed but not yet applied here
            return None
        counts = node.sql("SELECT count(*) AS n FROM orders_by_user").rows
        return {
            "time": time.strftime("%H:%M:%S"),
            "batches": batches,
            "p7": node.get("revenue_by_product", "p-7"),
            "top": top,
            "u0": node.get("orders_by_user", "u-0"),
            "users": counts[0]["n"] if counts else 0,
            "windows": windows,
        }

    @staticmethod
    def line(facts: dict[str, Any]) -> str:
        """One update as one line (stdout is not a terminal)."""
        batch = max(facts["batches"].values())
        p7 = facts["p7"] or {}
        top = ", ".join(f"{r['product']} {r['revenue']}" for r in facts["top"])
        u0 = (facts["u0"] or {}).get("orders", 0)
        windows = ", ".join(
            f"{r['window_start']:%H:%M:%S} {r['revenue']}" for r in facts["windows"]
        )
        return (
            f"[{facts['time']}] batch {batch} | p-7 revenue {p7.get('revenue')} "
            f"({p7.get('orders')} orders) | top {top} | u-0 {u0} orders, "
            f"{facts['users']} users | p-7 windows {windows}"
        )

    @staticmethod
    def panel(facts: dict[str, Any] | None, url: str, log_path: str) -> Group:
        """One update for a terminal, redrawn in place."""
        head = Text.assemble(
            ("console ", "dim"), (f"{url}/", "bold cyan"), ("   spark log ", "dim"), log_path
        )
        if facts is None:
            return Group(head, Text("waiting for the first micro-batch...", style="yellow"))
        tables = Table("table", "batch", box=None, header_style="dim")
        for name in TABLES:
            tables.add_row(name, str(facts["batches"].get(name, "-")))
        top = Table("top products", "orders", "revenue", box=None, header_style="dim")
        for row in facts["top"]:
            top.add_row(row["product"], str(row["orders"]), str(row["revenue"]))
        p7 = facts["p7"] or {}
        u0 = facts["u0"] or {}
        lookups = Text(
            f"get revenue_by_product 'p-7' -> {p7.get('orders')} orders, "
            f"revenue {p7.get('revenue')}\n"
            f"get orders_by_user 'u-0'      -> {u0.get('orders')} orders "
            f"({facts['users']} users)\n"
            f"p-7 per 10 s window          -> {_windows(facts)}"
        )
        grid = Table.grid(padding=(0, 4))
        grid.add_row(tables, top)
        foot = Text(f"{facts['time']}  Ctrl-C stops", style="dim")
        return Group(head, Text(), grid, Text(), lookups, Text(), foot)


def run_demo(
    state_dir: str,
    duration: float,
    rate: int,
    partitions: int,
    fresh: bool,
    listen: str = DEMO_LISTEN,
    trigger: float = 1.0,
) -> int:
    """Run the demo until Ctrl-C or, when ``duration`` > 0, for ``duration`` seconds once the
    tables first answer (Spark's start and first micro-batch take from seconds to a minute,
    depending on the machine); the exit code (1: nothing served within five minutes).
    ``trigger`` is the seconds between micro-batches: each costs about the same CPU whatever
    it holds, so a longer interval makes a demo left running (the docs' tests) cheaper."""
    from pyspark.sql import functions as F

    import sparkiq

    if fresh and os.path.isdir(state_dir):
        shutil.rmtree(state_dir)
    logs = os.path.join(state_dir, "logs")
    os.makedirs(logs, exist_ok=True)
    log_path = os.path.abspath(os.path.join(logs, "spark.log"))

    node = _start_node(state_dir, listen)
    url = node.url or ""
    print(f"sparkiq console: {url}/", flush=True)
    asked = listen.rsplit(":", 1)[-1]
    moved = asked != "0" and url.rsplit(":", 1)[-1] != asked  # port 0: any free port, asked for
    print(
        f"state in {os.path.abspath(state_dir)}; Spark's log in {log_path}\n"
        f"query it: sparkiq shell --url {url}   (or sparkiq query, or the console)\n"
        + (
            f"({listen} was taken: in your other terminal, export SPARKIQ_URL={url} and the "
            "sparkiq commands and getting-started's examples use this node)\n"
            if moved
            else ""
        )
        + "starting Spark...",
        flush=True,
    )
    spark = _spark(log_path)
    # After Spark starts: its context installs a SIGINT handler that cancels every job and
    # raises KeyboardInterrupt anywhere; Ctrl-C must only ask the loop below to stop.
    stop = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    orders = build_orders(spark, rate)
    app = sparkiq.App(spark, state_dir=state_dir, name="shop")
    every: dict[str, Any] = {
        "key": "product",
        "partitions": partitions,
        "trigger": {"processingTime": f"{round(trigger * 1000)} milliseconds"},
    }
    app.materialize(
        "revenue_by_product",
        orders.groupBy("product").agg(
            F.count("*").alias("orders"), F.round(F.sum("amount"), 2).alias("revenue")
        ),
        **every,
    )
    app.materialize(
        "orders_by_user",
        orders.groupBy("user").agg(F.count("*").alias("orders"), F.max("ts").alias("last_order")),
        **(every | {"key": "user"}),
    )
    app.materialize(
        "revenue_per_window",
        orders.groupBy("product", F.window("ts", "10 seconds")).agg(
            F.round(F.sum("amount"), 2).alias("revenue")
        ),
        window="window",
        **every,
    )
    summary = _Summary(node)
    live_since: float | None = None  # when the tables first answered
    waiting_since = time.monotonic()
    code = 0
    try:
        # The node serves queries; the App only writes (its own local node would hold a
        # second copy of every replica).
        app.start(local_node=False)
        node.refresh_tables()

        def update() -> dict[str, Any] | None:
            nonlocal live_since
            facts = _read(summary)
            if facts is not None and live_since is None:
                live_since = time.monotonic()
            return facts

        def finished() -> bool:
            if stop.is_set():
                return True
            if live_since is None:
                return time.monotonic() - waiting_since > _FIRST_BATCH_TIMEOUT
            return duration > 0 and time.monotonic() - live_since >= duration

        if sys.stdout.isatty():
            with Live(summary.panel(None, url, log_path), auto_refresh=False) as live:
                while not finished():
                    live.update(summary.panel(update(), url, log_path), refresh=True)
                    stop.wait(1.0)
        else:
            while not finished():
                facts = update()
                print(summary.line(facts) if facts else "waiting for the first micro-batch...")
                sys.stdout.flush()
                stop.wait(2.0)
        if live_since is None and not stop.is_set():
            print(
                f"sparkiq demo: no micro-batch was served in {_FIRST_BATCH_TIMEOUT:.0f} s; "
                f"see {log_path}",
                file=sys.stderr,
            )
            code = 1
    finally:
        print("stopping...", flush=True)
        # The queries first, between micro-batches, then the node, then Spark: stopping
        # Spark under running queries is what makes it log errors.
        app.stop(timeout=10.0)  # a loaded machine's batch takes seconds: let it finish
        node.stop()
        with _output_to(log_path):
            spark.stop()
        signal.signal(signal.SIGINT, previous)
    print(f"stopped. `sparkiq status --state-dir {state_dir}` shows the tables' changelog.")
    return code


def _windows(facts: dict[str, Any]) -> str:
    return ", ".join(f"{r['window_start']:%H:%M:%S} {r['revenue']}" for r in facts["windows"])


def _read(summary: _Summary) -> dict[str, Any] | None:
    try:
        return summary.read()
    except SparkiqError:  # a table still opening its first replica: next update
        return None
