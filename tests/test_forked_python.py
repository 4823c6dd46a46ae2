"""The test zygote (tests/forked_python.py) gives its children what ``subprocess.Popen``
gives a new interpreter: arguments, directory, environment, standard files, exit status
and signals; what it saves is the import of sparkiq."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests import forked_python

PROBE = [sys.executable, "-m", "tests.forked_probe"]


def test_a_child_runs_the_module_with_its_arguments_directory_environment_and_files(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out.log"
    with out.open("wb") as log:
        child = forked_python.popen(
            [*PROBE, "3", "more"],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=os.environ | {"PROBE": "yes"},
            cwd=tmp_path,
        )
    assert isinstance(child, forked_python.ForkedProcess)
    assert child.wait(60) == 3 and child.poll() == 3
    said = json.loads(out.read_text().splitlines()[0])
    assert said["argv"] == ["3", "more"] and said["cwd"] == str(tmp_path)
    assert said["probe"] == "yes"
    # forked from the zygote, which had imported sparkiq: not a child of this process
    assert said["preloaded"] and said["ppid"] != os.getpid()


def test_pipes_carry_text_both_ways() -> None:
    child = forked_python.popen(
        [*PROBE, "0"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdin is not None and child.stdout is not None and child.stderr is not None
    child.stdin.write("hello\nthere\n")
    child.stdin.close()
    assert json.loads(child.stdout.readline())["argv"] == ["0"]
    assert child.stderr.read() == "hello\nthere\n"
    assert child.wait(60) == 0


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_signal_ends_a_child_and_its_status_says_which(sig: signal.Signals) -> None:
    child = forked_python.popen([*PROBE, "wait"], stdout=subprocess.PIPE)
    assert child.stdout is not None
    json.loads(child.stdout.readline())  # it runs
    with pytest.raises(subprocess.TimeoutExpired):
        child.wait(0.2)
    assert child.poll() is None
    child.send_signal(sig)
    assert child.wait(60) == -sig
    child.kill()  # ended already: nothing is signalled


def test_what_it_cannot_honour_is_started_by_popen(tmp_path: Path) -> None:
    command = [sys.executable, "-c", "print('real')"]
    child = forked_python.popen(command, stdout=subprocess.PIPE)
    assert isinstance(child, subprocess.Popen)
    assert child.communicate(timeout=60)[0] == b"real\n"
    started_anew = forked_python.popen([*PROBE, "0"], stdout=subprocess.DEVNULL, bufsize=0)
    assert isinstance(started_anew, subprocess.Popen) and started_anew.wait(60) == 0


def test_no_fork_starts_every_process_anew(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(forked_python.NO_FORK_ENV, "1")
    child = forked_python.popen([*PROBE, "0"], stdout=subprocess.PIPE)
    assert isinstance(child, subprocess.Popen)
    out, _ = child.communicate(timeout=60)
    said = json.loads(out)
    assert not said["preloaded"] and said["ppid"] == os.getpid()


def test_a_signal_to_a_child_reaped_before_its_status_came_is_no_error() -> None:
    """The zygote reaps a child, then sends its status: in between the pid is gone while
    ``poll()`` still says running. ``terminate`` and ``kill`` then do nothing, as Popen's
    (a cluster's stop raised ``ProcessLookupError`` once in a whole run)."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # reaped: no process has its pid now
    ours, zygote_end = socket.socketpair()  # the status that has not come yet
    try:
        child = forked_python.ForkedProcess(["gone"], ours, gone.pid)
        assert child.poll() is None
        child.terminate()
        child.kill()
        zygote_end.sendall(b"0")  # then the status comes
        assert child.wait(30) == 0
    finally:
        zygote_end.close()
        ours.close()
