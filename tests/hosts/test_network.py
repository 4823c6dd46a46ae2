"""The hosts harness's network itself (part of ``make test``: a few seconds, no node): hosts
reach each other over the bridge, a cut stops both directions, a one-way drop only one (seen
with UDP, which needs no reply), healing restores both, and what a killed run left behind is
removed by the next one."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.faults.harness import REPO
from tests.hosts.netns import Host, Network, ip

#: Receives (``listen``) or sends (``send``) one TCP connection or a few UDP datagrams; the
#: listener prints what arrived, or "nothing" once told on stdin that the sender is done.
PROBE = """
import select, socket, sys
kind, role, address = sys.argv[1:4]
port = 47000
if role == "send":
    try:
        if kind == "tcp":
            socket.create_connection((address, port), timeout=1.0).sendall(b"hello")
        else:
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            for _ in range(5):
                s.sendto(b"hello", (address, port))
    except OSError as exc:
        print(f"failed: {exc}")
    sys.exit(0)
if kind == "tcp":
    s = socket.create_server((address, port))
else:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind((address, port))
print("ready", flush=True)
told = False
while True:
    ready = select.select([s] if told else [s, sys.stdin], [], [], 0.5 if told else None)[0]
    if s in ready:
        c = s.accept()[0] if kind == "tcp" else s
        print(c.recv(100).decode())
        break
    if told:
        print("nothing")
        break
    told = sys.stdin in ready
"""


def on(host: Host | None, *args: str) -> list[str]:
    """A probe run on ``host`` (None: the root namespace)."""
    prefix = host.prefix if host else []
    return [*prefix, sys.executable, "-c", PROBE, *args]


def exchange(kind: str, sender: Host | None, receiver: Host) -> str:
    """What ``receiver`` got from ``sender``: "hello" or "nothing". The listener waits until
    the sender is done, then half a second for what is already under way."""
    listener = subprocess.Popen(
        on(receiver, kind, "listen", receiver.address),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert listener.stdout is not None
        assert listener.stdout.readline().strip() == "ready"
        sent = subprocess.run(
            on(sender, kind, "send", receiver.address), capture_output=True, timeout=60
        )
        assert sent.returncode == 0, sent.stderr
        return listener.communicate("done\n", timeout=60)[0].strip()
    finally:
        if listener.poll() is None:
            listener.kill()
            listener.wait()


@pytest.fixture(scope="module")
def network() -> Iterator[Network]:
    with Network() as net:
        net.add_host("a")
        net.add_host("b")
        yield net


def test_hosts_reach_each_other_and_a_cut_stops_both_ways(network: Network) -> None:
    a, b = network.hosts
    assert a.address != b.address and a.address.startswith(network.subnet)
    assert exchange("tcp", b, a) == "hello"
    assert exchange("tcp", None, a) == "hello"  # the root namespace, over the bridge
    a.cut()
    try:
        assert exchange("udp", b, a) == "nothing"
        assert exchange("udp", a, b) == "nothing"
    finally:
        a.heal()
    assert exchange("tcp", b, a) == "hello"


@pytest.mark.parametrize("direction", ["into", "out of"])
def test_a_one_way_drop_loses_one_direction_only(network: Network, direction: str) -> None:
    """UDP shows the direction; TCP fails both ways (a handshake needs both)."""
    a, b = network.hosts
    a.drop(direction)
    try:
        into, out = exchange("udp", b, a), exchange("udp", a, b)
        assert (into, out) == (
            ("nothing", "hello") if direction == "into" else ("hello", "nothing")
        )
        assert exchange("tcp", b, a) == "nothing"
    finally:
        a.heal()
    assert (exchange("udp", b, a), exchange("udp", a, b)) == ("hello", "hello")


def test_what_a_killed_run_left_is_removed_by_the_next() -> None:
    script = (
        "import time; from tests.hosts.netns import Network\n"
        "net = Network(); net.add_host('x')\n"
        "print(net.tag, flush=True); time.sleep(600)"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    tag = child.stdout.readline().strip()
    child.kill()
    child.wait()
    assert tag in ip("netns", "list") and tag in ip("link", "show")
    with Network() as fresh:
        assert fresh.tag != tag
        assert tag not in ip("netns", "list") and tag not in ip("link", "show")
    assert fresh.tag not in ip("netns", "list") + ip("link", "show")
