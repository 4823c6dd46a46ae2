"""TCP proxies in front of the nodes, able to drop, delay or blackhole traffic per direction.

``python -m tests.faults.proxy CONTROL NAME=LISTEN_PORT:TARGET_PORT ...`` runs one asyncio
proxy per node on 127.0.0.1. Every node advertises its proxy's address, so nodes reach each
other (and clients reach them) only through the proxies, and a partition on one host is a
matter of rules. The JSON file CONTROL, re-read every 50 ms, holds::

    {"pids": {"n0": 1234, ...},
     "rules": [{"src": "n1", "dst": "*", "mode": "blackhole"}, ...]}

A connection's destination is the proxy it reached; its source is the node whose process
owns the connecting socket (found in ``/proc``: every connection comes from 127.0.0.1, so
the port is all there is to go by), or ``client``. A connection first seen as ``client`` is
identified again whenever the pids change: nodes connect to each other before the harness
knows their pids (while they start, and after a restart), and those keep-alive connections
would otherwise pass every rule on ``src`` -- a "partition" that still let heartbeats through
one way. The first rule whose ``src`` and ``dst``
match (``*`` matches anything) decides, per chunk, so a rule applies to open connections
too: ``drop`` closes the connection (and refuses new ones), ``blackhole`` swallows the bytes
(the peer waits until its own timeout, as behind a dead route), ``delay`` waits
``seconds`` before forwarding each chunk. No rule: bytes pass.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any


class Rules:
    def __init__(self, path: str) -> None:
        self.path = path
        self.pids: dict[str, int] = {}
        self.rules: list[dict[str, Any]] = []
        self._mtime = -1.0

    def reload(self) -> None:
        try:
            mtime = os.stat(self.path).st_mtime
            if mtime == self._mtime:
                return
            with open(self.path) as handle:
                doc = json.load(handle)
            self.pids = {k: int(v) for k, v in doc.get("pids", {}).items()}
            self.rules = list(doc.get("rules", []))
            self._mtime = mtime
        except (OSError, ValueError):
            pass

    def mode(self, src: str, dst: str) -> tuple[str, float]:
        for rule in self.rules:
            if rule.get("src", "*") in ("*", src) and rule.get("dst", "*") in ("*", dst):
                return str(rule["mode"]), float(rule.get("seconds", 0.0))
        return "pass", 0.0


def _socket_inode(peer_port: int, listen_port: int) -> str | None:
    """The inode of the client end of the connection 127.0.0.1:peer_port -> listen_port."""
    local, remote = f"0100007F:{peer_port:04X}", f"0100007F:{listen_port:04X}"
    try:
        with open("/proc/net/tcp") as handle:
            for line in handle:
                # The table holds every socket of the host, closed ones waiting included,
                # and this runs for each connection: split only the lines that can match.
                if local not in line:
                    continue
                fields = line.split()
                if len(fields) > 9 and fields[1] == local and fields[2] == remote:
                    return fields[9]
    except OSError:
        return None
    return None


def source_of(peer_port: int, listen_port: int, pids: dict[str, int]) -> str:
    inode = _socket_inode(peer_port, listen_port)
    if inode is None:
        return "client"
    target = f"socket:[{inode}]"
    for name, pid in pids.items():
        fd_dir = f"/proc/{pid}/fd"
        try:
            for fd in os.listdir(fd_dir):
                try:
                    if os.readlink(f"{fd_dir}/{fd}") == target:
                        return name
                except OSError:
                    continue
        except OSError:
            continue
    return "client"


class Link:
    """One proxied connection: where it comes from (``src``, resolved again while it is
    ``client``), the proxy it reached (``dst``) and both ends."""

    def __init__(
        self, peer_port: int, listen_port: int, src: str, dst: str,
        down: asyncio.StreamWriter, up: asyncio.StreamWriter,
    ) -> None:  # fmt: skip
        self.peer_port, self.listen_port = peer_port, listen_port
        self.src, self.dst, self.down, self.up = src, dst, down, up


class Proxy:
    def __init__(self, rules: Rules) -> None:
        self.rules = rules
        self.open: set[Link] = set()

    async def serve(self, name: str, listen_port: int, target_port: int) -> asyncio.Server:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            peer_port = writer.get_extra_info("peername")[1]
            src = source_of(peer_port, listen_port, self.rules.pids)
            if self.rules.mode(src, name)[0] == "drop":
                writer.close()
                return
            try:
                up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target_port)
            except OSError:
                writer.close()
                return
            link = Link(peer_port, listen_port, src, name, writer, up_writer)
            self.open.add(link)
            try:
                await asyncio.gather(self.pipe(reader, up_writer, link),
                                     self.pipe(up_reader, writer, link))  # fmt: skip
            finally:
                self.open.discard(link)
                for w in (writer, up_writer):
                    w.close()

        return await asyncio.start_server(handle, "127.0.0.1", listen_port)

    async def pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, link: Link
    ) -> None:
        try:
            while chunk := await reader.read(65536):
                mode, seconds = self.rules.mode(link.src, link.dst)
                if mode == "drop":
                    break
                if mode == "blackhole":
                    continue
                if mode == "delay":
                    await asyncio.sleep(seconds)
                writer.write(chunk)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def watch(self) -> None:
        """Reload the rules; identify connections again when the pids change; close open
        connections a ``drop`` rule now covers."""
        pids: dict[str, int] = {}
        while True:
            self.rules.reload()
            if self.rules.pids != pids:
                pids = dict(self.rules.pids)
                for link in list(self.open):
                    if link.src == "client":
                        link.src = source_of(link.peer_port, link.listen_port, pids)
            for link in list(self.open):
                if self.rules.mode(link.src, link.dst)[0] == "drop":
                    link.down.close()
                    link.up.close()
            await asyncio.sleep(0.05)


async def main(control: str, routes: list[str]) -> None:
    rules = Rules(control)
    rules.reload()
    proxy = Proxy(rules)
    for route in routes:
        name, ports = route.split("=")
        listen, target = (int(p) for p in ports.split(":"))
        await proxy.serve(name, listen, target)
    print(f"proxies up at {time.time():.3f}", flush=True)
    await proxy.watch()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2:]))
