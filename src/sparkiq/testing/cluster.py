"""A serving cluster of N nodes in the test's own process.

:func:`start_cluster` starts nodes over one ``state_dir`` (write its tables with
:func:`~sparkiq.testing.write_table`) and waits until they have settled: every node sees every
other, hosts exactly the partitions the assignment gives it and has applied every committed
batch. Nodes reach each other over HTTP on 127.0.0.1 (``http=True``, the default: a
:class:`~sparkiq.Client` can then connect, see :meth:`LocalCluster.client`) or by direct
calls (``http=False``: no sockets, for tests of routing and membership only).

Why a Client speaks real HTTP here and not an in-process transport: the client is an HTTP
client (the keep-alive connection pool routers use, for the binary protocol, JSON and
streams) and a node serves through uvicorn. A transport that skipped sockets would test
neither, and loopback HTTP costs well under a millisecond per request.

Timings default to :data:`TEST_TIMINGS` (heartbeats every 0.1 s), so a cluster settles in
about a second rather than the several a production node's timings take.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from sparkiq.errors import SparkiqError

if TYPE_CHECKING:
    from sparkiq.client import Client
    from sparkiq.node import Node

__all__ = ["TEST_TIMINGS", "LocalCluster", "start_cluster", "wait_until"]

#: Node settings :func:`start_cluster` uses unless told otherwise: fast heartbeats, a short
#: failure floor (the phi detector still adapts to a slow machine) and a quick tailer.
TEST_TIMINGS: Mapping[str, float] = {
    "heartbeat_interval": 0.1,
    "failure_timeout": 1.0,
    "release_grace": 0.5,
    "poll_interval": 0.01,
}


def wait_until(check: Callable[[], bool], timeout: float, message: str) -> None:
    """Call ``check`` every 50 ms until it returns true; AssertionError with ``message``
    after ``timeout`` seconds (give generous ones: test machines are busy).

    A retryable :class:`~sparkiq.errors.SparkiqError` from ``check`` counts as "not yet": a
    node just started answers a read of a partition it is still restoring that way, and
    waiting for the answer is what the caller asked for. At the deadline the last such error
    is the AssertionError's cause; any other exception ends the wait at once."""
    deadline = time.monotonic() + timeout
    last: SparkiqError | None = None
    while True:
        try:
            if check():
                return
        except SparkiqError as error:
            if not error.retryable:
                raise
            last = error
        if time.monotonic() > deadline:
            raise AssertionError(message if last is None else f"{message} ({last})") from last
        time.sleep(0.05)


class LocalCluster:
    """Nodes of this process serving one ``state_dir``; a context manager that stops them.

    ``nodes`` is a plain list (a test may stop, replace or add nodes, then :meth:`settle`).
    """

    def __init__(self, nodes: list[Node], *, http: bool, token: str | None) -> None:
        self.nodes = nodes
        self.http = http
        self.token = token

    @property
    def urls(self) -> list[str]:
        """The nodes' HTTP URLs (none when ``http=False``: nodes then have ``local://`` ids)."""
        return [node.url for node in self.nodes if node.url] if self.http else []

    def client(self, **options: Any) -> Client:
        """A :class:`~sparkiq.Client` over every node (close it, or use it in a ``with``);
        ``options`` are the Client's (``token`` defaults to the cluster's)."""
        if not self.http:
            raise RuntimeError(
                "a Client speaks HTTP and this cluster's nodes do not listen: start it with "
                "start_cluster(..., http=True)"
            )
        from sparkiq.client import Client

        options.setdefault("token", self.token)
        return Client(self.urls, **options)

    def settle(self, timeout: float = 60.0) -> None:
        """Wait until every node sees every other, hosts exactly its assignment and has
        applied every committed batch, and heartbeats have told every node so."""
        _settle(self.nodes, timeout)

    def stop(self) -> None:
        """Stop every node, newest first."""
        for node in reversed(self.nodes):
            node.stop()

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    def __getitem__(self, index: int) -> Node:
        return self.nodes[index]

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_cluster(
    state_dir: str,
    nodes: int = 3,
    *,
    http: bool = True,
    settle_timeout: float = 60.0,
    **settings: Any,
) -> LocalCluster:
    """Start ``nodes`` nodes (ids ``n0``, ``n1``...) serving ``state_dir`` and wait until
    they settle; see the module docstring. ``settings`` are :class:`~sparkiq.Node`'s
    keyword arguments (``standbys``, ``store``, ``token``...) over :data:`TEST_TIMINGS`.
    With a ``token`` and no ``cluster_secret`` the nodes get a random shared secret."""
    from sparkiq.cluster.transport import LocalTransport
    from sparkiq.node import Node

    if nodes < 1:
        raise ValueError(f"a cluster needs at least one node, got nodes={nodes}")
    options = {**TEST_TIMINGS, **settings}
    if options.get("token") is not None and options.get("cluster_secret") is None:
        options["cluster_secret"] = secrets.token_hex(16)
    started: list[Node] = []
    try:
        if http:
            first = Node(state_dir, node_id="n0", listen="127.0.0.1:0", peers=[], **options)
            started.append(first.start())
            for i in range(1, nodes):
                peers = [first.url or ""]
                node = Node(
                    state_dir, node_id=f"n{i}", listen="127.0.0.1:0", peers=peers, **options
                )
                started.append(node.start())
        else:
            transport = LocalTransport()
            for i in range(nodes):
                peers = ["local://n0"] if i else []
                node = Node(state_dir, node_id=f"n{i}", transport=transport, peers=peers, **options)
                started.append(node.start())
        cluster = LocalCluster(started, http=http, token=options.get("token"))
        cluster.settle(settle_timeout)
    except BaseException:
        for node in reversed(started):
            node.stop()
        raise
    return cluster


def _settle(nodes: list[Node], timeout: float) -> None:
    ids = tuple(sorted(n.node_id for n in nodes))

    def settled() -> bool:
        for node in nodes:
            node.poll_once()
            coordinator = node.coordinator
            if coordinator is None:
                raise ValueError(f"node {node.node_id!r} is not clustered (no listen= or peers=)")
            if coordinator.membership.live() != ids:
                return False
            for table in node.tables:
                count = node.partition_count(table)
                want = coordinator.assignment.hosted_by(node.node_id, table, count)
                if set(node.replica(table).partitions) != want:
                    return False
            if not node.is_ready():
                return False
        for node in nodes:  # and heartbeats told everyone
            assert node.coordinator is not None
            for other in nodes:
                if other is node:
                    continue
                seen = node.coordinator.membership.hosted_state(other.node_id)
                for table in other.tables:
                    if set(seen.get(table, {})) != set(other.replica(table).partitions):
                        return False
        return True

    wait_until(settled, timeout, f"cluster {ids} did not settle in {timeout:g} s")
