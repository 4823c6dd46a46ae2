"""Hosts on a real network: Linux network namespaces on a bridge, built with iproute2.

A :class:`Network` is a bridge in the root namespace with the address ``10.77.N.1/24`` and,
per :meth:`Network.add_host`, a namespace holding one end of a veth pair (``eth0``, address
``10.77.N.(i + 2)``) whose other end is a port of the bridge. Traffic between hosts, and
between the root namespace and a host, crosses real interfaces (veth, bridge, each
namespace's own routing and TCP stack); the filesystem is shared (a namespace separates the
network only), so a ``state_dir`` on it plays the shared storage.

Faults, without nftables (the machines have iproute2 only, and their kernel no ``netem``):

- :meth:`Host.cut`: the host's bridge port goes down (a cable pulled at the switch): nothing
  passes either way, and senders see silence, not an error.
- :meth:`Host.drop`: one direction is lost: a ``pfifo`` queue of length 0 on the egress of
  one veth end drops every packet sent that way (``into`` the host: on the bridge's end;
  ``out of`` it: on ``eth0``); the other direction still passes.

Names carry the creating process's id and a counter (``sq<pid hex>-<k>-...``; interface
names have at most 15 characters), so parallel test workers never collide, and whatever a
dead run left behind (its process is gone) is removed by the next :class:`Network` before it
allocates its subnet: namespaces (and the processes still in them), veths and bridges. The
subnet ``N`` is the lowest not used by another live network, chosen under a lock file.
:meth:`Network.close` removes everything the network made, and is safe to call twice.

Needs root and ``ip netns``: :func:`unavailable` says why not, for a skip.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import re
import shutil
import signal
import subprocess
from dataclasses import dataclass

#: The first two bytes of every network's subnet.
PREFIX = "10.77"
LOCK = "/tmp/sparkiq-netns.lock"
#: Names this module makes: ``sq<pid hex>-<counter>-<what>``.
NAME = re.compile(r"^sq([0-9a-f]+)-(\d+)-([\w.-]+)$")
_counter = itertools.count()


def unavailable() -> str:
    """Why namespaces cannot be made here ("" when they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root (tests/hosts runs as root, as CI does)"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"`ip netns` is unavailable: {probe.stderr.strip()}"
    return ""


def ip(*args: str, check: bool = True) -> str:
    """Run ``ip ARGS``; a failure raises with iproute2's own message."""
    return _run(["ip", *args], check)


def _run(args: list[str], check: bool = True) -> str:
    done = subprocess.run(args, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"`{' '.join(args)}` failed: {done.stderr.strip()}")
    return done.stdout


@dataclass(frozen=True)
class Host:
    """One namespace on the bridge. ``link`` is its bridge port (root namespace side)."""

    name: str
    netns: str
    address: str
    link: str

    @property
    def prefix(self) -> list[str]:
        """Prepended to a command line, runs it on this host."""
        return ["ip", "netns", "exec", self.netns]

    def cut(self) -> None:
        """Both directions lost until :meth:`heal`."""
        ip("link", "set", self.link, "down")

    def drop(self, direction: str) -> None:
        """Packets ``"into"`` the host, or ``"out of"`` it, lost until :meth:`heal`."""
        if direction == "into":
            _run(["tc", "qdisc", "replace", "dev", self.link, "root", "pfifo", "limit", "0"])
        elif direction == "out of":
            _run(["tc", "-n", self.netns, "qdisc", "replace", "dev", "eth0", "root",
                  "pfifo", "limit", "0"])  # fmt: skip
        else:
            raise ValueError(f"direction must be 'into' or 'out of', got {direction!r}")

    def heal(self) -> None:
        """Undo :meth:`cut` and :meth:`drop`."""
        _run(["tc", "qdisc", "del", "dev", self.link, "root"], check=False)
        _run(["tc", "-n", self.netns, "qdisc", "del", "dev", "eth0", "root"], check=False)
        ip("link", "set", self.link, "up")

    def pids(self) -> list[int]:
        """The processes running in this host's namespace."""
        return [int(p) for p in ip("netns", "pids", self.netns, check=False).split()]


class Network:
    """A bridge and the hosts on it; a context manager that removes them all."""

    def __init__(self) -> None:
        self.tag = f"sq{os.getpid():x}-{next(_counter)}"
        self.bridge = f"{self.tag}-br"
        self.hosts: list[Host] = []
        self.subnet = ""
        with open(LOCK, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            remove_stale()
            used = {int(m) for m in re.findall(rf"inet {PREFIX}\.(\d+)\.", ip("-o", "-4", "addr"))}
            free = next((n for n in range(1, 255) if n not in used), None)
            if free is None:
                raise RuntimeError(f"every subnet {PREFIX}.N.0/24 is taken: `ip -4 addr`")
            self.subnet = f"{PREFIX}.{free}"
            ip("link", "add", self.bridge, "type", "bridge")
            try:
                ip("addr", "add", f"{self.subnet}.1/24", "dev", self.bridge)
                ip("link", "set", self.bridge, "up")
            except RuntimeError:
                self.close()
                raise

    @property
    def address(self) -> str:
        """The root namespace's address on the bridge."""
        return f"{self.subnet}.1"

    def add_host(self, name: str) -> Host:
        index = len(self.hosts)
        host = Host(name, f"{self.tag}-{name}", f"{self.subnet}.{index + 2}", f"{self.tag}-{index}")
        self.hosts.append(host)  # before it exists: close() removes what was made of it
        ip("netns", "add", host.netns)
        ip("link", "add", host.link, "type", "veth", "peer", "name", "eth0", "netns", host.netns)
        ip("link", "set", host.link, "master", self.bridge, "up")
        ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", "eth0")
        ip("-n", host.netns, "link", "set", "eth0", "up")
        ip("-n", host.netns, "link", "set", "lo", "up")
        return host

    def close(self) -> None:
        for host in self.hosts:
            _remove_netns(host.netns)
            ip("link", "del", host.link, check=False)  # gone with its namespace, normally
        self.hosts = []
        ip("link", "del", self.bridge, check=False)

    def __enter__(self) -> Network:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stale(name: str) -> bool:
    match = NAME.match(name)
    return match is not None and not _alive(int(match.group(1), 16))


def _remove_netns(netns: str) -> None:
    """Kill what still runs in ``netns`` (a namespace lives on while a process is in it),
    then delete it."""
    for pid in ip("netns", "pids", netns, check=False).split():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)
    ip("netns", "del", netns, check=False)


def remove_stale() -> list[str]:
    """Remove the namespaces and links of runs whose process is gone; return their names."""
    removed = []
    for line in ip("netns", "list").splitlines():
        netns = line.split()[0] if line.split() else ""
        if _stale(netns):
            _remove_netns(netns)
            removed.append(netns)
    for line in ip("-o", "link", "show").splitlines():
        # "12: sq1f2e-0-0@if3: <...>" or "13: sq1f2e-0-br: <...>"
        fields = line.split(":")
        link = fields[1].strip().split("@")[0] if len(fields) > 1 else ""
        if _stale(link):
            ip("link", "del", link, check=False)
            removed.append(link)
    return removed
