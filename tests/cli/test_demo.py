"""``sparkiq demo`` as a user runs it, with stdout piped (not a terminal): the console URL
first and answering, Spark's log in its file and not on the screen, live values, exit 0."""

from __future__ import annotations

import re
import shlex
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests import http_calls
from tests.cli.terminal import Terminal

pytestmark = pytest.mark.slow

UPDATE = re.compile(
    r"^\[\d\d:\d\d:\d\d\] batch (\d+) \| p-7 revenue ([\d.]+) \((\d+) orders\) \| top p-\d+ "
)


def test_demo_prints_the_console_first_keeps_spark_quiet_and_shows_values(
    tmp_path: Path,
) -> None:
    """Piped, with another process on the port it is told to use: the demo serves on a free
    one and says how to point the other terminal at it (the docs' steps then use
    SPARKIQ_URL). One demo for both: each is a Spark JVM of its own."""
    state = tmp_path / "demo-state"
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    taken = f"127.0.0.1:{held.getsockname()[1]}"
    # --duration counts from the first served batch: 3 s are two updates (one per 2 s), all
    # the test reads; Spark's start, the first batch and the shutdown run in full whatever
    # the duration. A micro-batch every 3 s (--trigger), not every second: each costs about
    # the same CPU whatever it holds, and a loaded machine whose batches took longer than 1 s
    # ran them back to back, so the shutdown found no pause between two to stop the queries
    # in and waited out the demo's 10 s for one (14 CPU-s of the demo's 42).
    command = ["demo", "--duration", "3", "--state-dir", str(state), "--listen", taken]
    command += ["--rate", "50", "--partitions", "2", "--trigger", "3"]
    process = subprocess.Popen(
        [sys.executable, "-m", "sparkiq.cli", *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    stderr: list[str] = []
    assert process.stdout is not None and process.stderr is not None
    errors = process.stderr
    reader = threading.Thread(target=lambda: stderr.extend(errors), daemon=True)
    reader.start()
    try:
        first = process.stdout.readline()
        match = re.fullmatch(r"sparkiq console: (http://127\.0\.0\.1:(\d+))/\n", first)
        assert match and f":{match.group(2)}" != taken[taken.index(":") :], first
        console = http_calls.get(f"{match.group(1)}/", timeout=10)
        assert console.status_code == 200
        assert "<html" in console.text.lower()
        rest = process.stdout.read()
        assert process.wait(120) == 0
    finally:
        held.close()
        if process.poll() is None:
            process.kill()
            process.wait()
    reader.join(10)
    out = [first, *rest.splitlines(keepends=True)]
    assert out[3] == (
        f"({taken} was taken: in your other terminal, export SPARKIQ_URL={match.group(1)} and "
        "the sparkiq commands and getting-started's examples use this node)\n"
    ), out[:5]
    assert out[4] == "starting Spark...\n"
    log = state / "logs" / "spark.log"
    assert f"Spark's log in {log}" in rest
    # nothing from Spark on the screen: its log went to the file it names
    noisy = [line for line in out + stderr if re.search(r"\b(WARN|ERROR)\b", line)]
    assert noisy == []
    assert stderr == []
    assert re.search(r"\b(WARN|INFO)\b", log.read_text())
    updates = [UPDATE.match(line) for line in rest.splitlines()]
    values = [m for m in updates if m]
    assert values, rest
    # the summary moves: later updates have read later batches
    assert int(values[-1].group(1)) >= int(values[0].group(1))
    assert all(float(m.group(2)) > 0 and int(m.group(3)) > 0 for m in values)
    assert rest.splitlines()[-1].startswith("stopped.")


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux (.ci/run)")
def test_demo_on_a_terminal_redraws_in_place_and_stops_cleanly_on_ctrl_c(
    tmp_path: Path, terminal: Terminal
) -> None:
    state = tmp_path / "demo-state"
    # A micro-batch every 3 s (--trigger): the screen needs one batch after the first, and
    # a loaded machine ran the 1 s default's batches back to back while Spark warmed up (and
    # Ctrl-C then waited out 10 s for a pause between two batches to stop the queries in).
    command = (
        f"{shlex.quote(sys.executable)} -m sparkiq.cli demo --state-dir {shlex.quote(str(state))}"
        " --listen 127.0.0.1:0 --rate 50 --partitions 2 --trigger 3"
    )
    terminal.start(command, {})
    screen = terminal.wait_for(lambda s: "Ctrl-C stops" in s, timeout=240)
    assert screen.splitlines()[0].startswith("sparkiq console: http://127.0.0.1:")
    assert "was taken" not in screen  # port 0 asks for any free port: none was taken

    def batches(screen: str) -> list[int]:
        return [
            int(line.split()[1])
            for line in screen.splitlines()
            if line.startswith(" revenue_by_product ")
        ]

    first = batches(screen)
    screen = terminal.wait_for(lambda s: batches(s) and batches(s)[0] > first[0], timeout=60)
    # several updates later the summary is on the screen once: redrawn, not scrolled
    assert len(batches(screen)) == 1
    assert screen.count("Ctrl-C stops") == 1
    terminal.keys("C-c")
    screen = terminal.wait_for(lambda s: "EXIT=" in s, timeout=120)
    assert "EXIT=0" in screen
    assert "stopping...\nstopped." in screen
    for word in ("Traceback", "WARN", "ERROR", "KeyboardInterrupt"):
        assert word not in screen
