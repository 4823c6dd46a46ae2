"""Run the python blocks of docs pages, each page's blocks in order in one namespace (a
subprocess of the docs test).

``python -m tests.docs.run_page PAGE.json`` runs one page and exits. ``python -m
tests.docs.run_page --serve`` runs page after page in one interpreter, as a user runs one
page after another in the same Python session: it reads the path of a ``PAGE.json`` per
line on stdin and ends each page's output with ``{DONE} <exit code>``. A ``PAGE.json`` is
``{"env": {NAME: value}, "blocks": [{"where": "file:line", "text": code}]}``: the variables
are set while the page runs (``SPARKIQ_URL`` for the pages that read the live demo, which
starts after the runner), then put back. Spark starts once, for
the first page that needs it, instead of once per page (a JVM start is tens of seconds on
a loaded machine, and more than the blocks of most pages take).

A page's namespace starts empty, except for ``spark`` (a local SparkSession from
:func:`sparkiq.testing.spark_session`) when a block uses that name without creating it, as
the guide's samples do. Afterwards every App, Node, Client or follower a block left open is
stopped or closed (also those whose name a later block bound to another), every streaming
query still running is stopped and the session's runtime settings are put back as they
were, so the next page starts as the first did.
Relative paths resolve against the working directory, which Spark's JVM reads once, at its
start: a serving runner stays in the directory it started in, and the test gives each page
that directory afresh (tests/docs/conftest.py).

Prints ``ok <file:line>`` per block and, on the next line, the seconds it took (``# 3.1 s``;
Spark's start too, before the first block: where a slow page spends its time); the first
failure prints its traceback under the block's location and the page ends with 1.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import time
import traceback
from typing import Any

#: The line that ends a page's output in ``--serve`` mode, followed by its exit code.
DONE = "=== page done:"


def _needs_spark(texts: list[str]) -> bool:
    for text in texts:
        if re.search(r"^\s*spark\s*=", text, re.M):
            return False  # the page makes its own
        if re.search(r"\bspark\b", text):
            return True
    return False


def _closeable(value: Any) -> Any:
    """``value``'s ``stop`` or ``close`` method when it is a sparkiq object (an App, Node,
    Client, follower...) that has one, else None."""
    if isinstance(value, type) or not type(value).__module__.startswith("sparkiq"):
        return None
    for name in ("stop", "close"):
        method = getattr(value, name, None)
        if callable(method):
            return method
    return None


def _keep(namespace: dict[str, Any], opened: dict[int, Any]) -> None:
    """Remember the sparkiq objects the namespace holds now: a later block may bind their
    name to another (the guide's ``app`` is three Apps in turn), and each must be closed."""
    for value in namespace.values():
        if _closeable(value) is not None:
            opened.setdefault(id(value), value)


def _close(opened: dict[int, Any]) -> None:
    for value in reversed(list(opened.values())):  # the newest first
        with contextlib.suppress(Exception):  # already stopped, or never started
            _closeable(value)()


def _settings(spark: Any) -> dict[str, str]:
    """The session's runtime settings that differ from Spark's defaults (``SET``)."""
    return {row[0]: row[1] for row in spark.sql("SET").collect()}


def _reset(spark: Any, before: dict[str, str]) -> None:
    """Stop the streaming queries a page left running and put its settings back."""
    for query in spark.streams.active:
        with contextlib.suppress(Exception):  # it stopped meanwhile
            query.stop()
    after = _settings(spark)
    for key, value in after.items():
        if key not in before:
            with contextlib.suppress(Exception):  # a static setting: a page cannot set it
                spark.conf.unset(key)
        elif before[key] != value:
            spark.conf.set(key, before[key])


class _Runner:
    """Runs pages; holds the SparkSession the pages share once one needed it."""

    def __init__(self) -> None:
        self.spark: Any = None

    def run(self, path: str) -> int:
        with open(path) as handle:
            page = json.load(handle)
        blocks, env = page["blocks"], page["env"]
        namespace: dict[str, Any] = {"__name__": "__main__"}
        if _needs_spark([b["text"] for b in blocks]):
            if self.spark is None:
                from sparkiq.errors import ConfigError
                from sparkiq.testing import spark_kafka_jars, spark_session

                started = time.monotonic()
                try:  # docs/kafka.md reads Kafka: the connector, as the tests' session has it
                    config = {"spark.jars": ",".join(spark_kafka_jars())}
                except ConfigError:
                    config = {}
                self.spark = spark_session("sparkiq-docs", config=config)
                print(f"# spark: {time.monotonic() - started:.1f} s", flush=True)
            namespace["spark"] = self.spark
        before = _settings(self.spark) if self.spark is not None else {}
        opened: dict[int, Any] = {}
        environ = {name: os.environ.get(name) for name in env}
        os.environ.update(env)
        try:
            for block in blocks:
                started = time.monotonic()
                try:
                    code = compile(block["text"], block["where"], "exec")
                    try:
                        exec(code, namespace)
                    finally:
                        _keep(namespace, opened)
                except BaseException:
                    print(f"FAILED {block['where']}", flush=True)
                    traceback.print_exc(file=sys.stdout)
                    return 1
                print(f"ok {block['where']}", flush=True)
                print(f"# {time.monotonic() - started:.1f} s", flush=True)
            return 0
        finally:
            started = time.monotonic()
            _close(opened)
            if self.spark is not None:
                _reset(self.spark, before)
            for name, value in environ.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
            print(f"# closed: {time.monotonic() - started:.1f} s", flush=True)

    def stop(self) -> None:
        if self.spark is not None:
            self.spark.stop()
            self.spark = None


def main(args: list[str]) -> int:
    runner = _Runner()
    try:
        if args != ["--serve"]:
            return runner.run(args[0])
        for line in sys.stdin:
            code = runner.run(line.strip())
            print(f"{DONE} {code}", flush=True)
        return 0
    finally:
        runner.stop()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
