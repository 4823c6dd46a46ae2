"""``sparkiq publish``: one table's publisher as a process of its own."""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from sparkiq.errors import SparkiqError
from sparkiq.publish.publisher import TablePublisher

__all__ = ["publish_command", "run_publish"]

log = logging.getLogger("sparkiq.publish")


def run_publish(
    state_dir: str | None,
    table: str,
    topic: str,
    bootstrap_servers: str | None,
    settings: Sequence[str] = (),
    *,
    key_format: str = "json",
    once: bool = False,
    status_interval: float = 10.0,
) -> int:
    """Publish ``table`` to ``topic`` until SIGTERM or Ctrl-C (exit code 0), or until the
    publisher stops on a failure it cannot retry (1, the reason on stderr); ``once``:
    publish what is committed now and exit. ``settings`` are Kafka client settings as
    ``NAME=VALUE``. Logs a status line (its lag) every ``status_interval`` seconds. A
    missing or malformed argument: 2, saying which."""
    if not state_dir or not bootstrap_servers:
        missing = (
            "--state-dir (SPARKIQ_STATE_DIR)"
            if not state_dir
            else ("--bootstrap-servers (SPARKIQ_KAFKA_BOOTSTRAP)")
        )
        print(f"sparkiq publish: {missing} is required", file=sys.stderr)
        return 2
    config = {"bootstrap.servers": bootstrap_servers}
    for item in settings:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            print(
                f"sparkiq publish: --config {item!r}: expected NAME=VALUE, e.g. "
                "security.protocol=SSL",
                file=sys.stderr,
            )
            return 2
        config[name.strip()] = value
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        publisher = TablePublisher(state_dir, table, topic, config, key_format=key_format)
        if once:
            try:
                publisher.publish_available()
                print(publisher.status().line(), flush=True)
            finally:
                publisher.stop()
            return 0
    except SparkiqError as exc:
        print(f"sparkiq publish: {exc.message}", file=sys.stderr)
        return 1
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    publisher.start()
    print(f"sparkiq publish: {table!r} to {topic!r}", flush=True)
    next_line = time.monotonic()
    try:
        while not stop.wait(min(status_interval, 0.5)):
            status = publisher.status()
            if status.state in ("failed", "fenced"):
                print(f"sparkiq publish: {status.error}", file=sys.stderr)
                return 1
            if time.monotonic() >= next_line:
                log.info("%s", status.line())
                next_line = time.monotonic() + status_interval
    finally:
        publisher.stop()
    return 0


def publish_command(args: Any) -> int:
    """``sparkiq publish`` with the command line's parsed arguments (see :func:`run_publish`)."""
    return run_publish(
        args.state_dir,
        args.table,
        args.topic,
        args.bootstrap_servers,
        args.config,
        key_format=args.key_format,
        once=args.once,
        status_interval=args.status_interval,
    )
