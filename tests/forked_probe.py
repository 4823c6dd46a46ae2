"""``python -m tests.forked_probe CODE``: what tests/test_forked_python.py asks a child.

Prints one JSON line (its arguments, working directory, ``PROBE`` variable, parent pid and
whether sparkiq was imported before it ran), echoes each line of its standard input on
standard error, and exits with ``CODE``; ``CODE`` ``wait`` sleeps until a signal ends it."""

from __future__ import annotations

import json
import os
import sys
import time

if __name__ == "__main__":
    print(
        json.dumps(
            {
                "argv": sys.argv[1:],
                "cwd": os.getcwd(),
                "probe": os.environ.get("PROBE"),
                "ppid": os.getppid(),
                "preloaded": "sparkiq.node" in sys.modules,
            }
        ),
        flush=True,
    )
    for line in sys.stdin:
        print(line.strip(), file=sys.stderr, flush=True)
    if sys.argv[1] == "wait":
        time.sleep(600)
    sys.exit(int(sys.argv[1]))
