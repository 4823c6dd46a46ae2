"""Run the python blocks of one docs page, in order, in one namespace (a subprocess of the
docs test: ``python -m tests.docs.run_page BLOCKS.json``).

The namespace starts empty, except for ``spark`` (a local SparkSession from
:func:`sparkiq.testing.spark_session`) when a block uses that name without creating it, as
the guide's samples do. Afterwards every App, Node, Client or follower a block left open is
stopped or closed. Prints ``ok <file:line>`` per block; the first failure prints its
traceback under the block's location and exits 1.
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
import traceback
from typing import Any


def _needs_spark(texts: list[str]) -> bool:
    for text in texts:
        if re.search(r"^\s*spark\s*=", text, re.M):
            return False  # the page makes its own
        if re.search(r"\bspark\b", text):
            return True
    return False


def _close(namespace: dict[str, Any]) -> None:
    for value in list(namespace.values()):
        for name in ("stop", "close"):
            method = getattr(value, name, None)
            module = type(value).__module__
            if callable(method) and module.startswith("sparkiq") and not isinstance(value, type):
                with contextlib.suppress(Exception):  # already stopped, or never started
                    method()
                break


def main(path: str) -> int:
    with open(path) as handle:
        blocks = json.load(handle)
    namespace: dict[str, Any] = {"__name__": "__main__"}
    spark = None
    if _needs_spark([b["text"] for b in blocks]):
        from sparkiq.testing import spark_session

        spark = namespace["spark"] = spark_session("sparkiq-docs")
    try:
        for block in blocks:
            try:
                code = compile(block["text"], block["where"], "exec")
                exec(code, namespace)
            except BaseException:
                print(f"FAILED {block['where']}", flush=True)
                traceback.print_exc(file=sys.stdout)
                return 1
            print(f"ok {block['where']}", flush=True)
        return 0
    finally:
        _close(namespace)
        if spark is not None:
            spark.stop()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
