"""Many cluster members in one process, for bench/membership.py.

A :class:`SimNode` is a real :class:`~sparkiq.cluster.coordinator.Coordinator` -- the same
membership, heartbeat rounds, failure detector, router and freshness rules a
:class:`~sparkiq.Node` runs -- whose hosting is simulated: a partition assigned to it is
live at once (no restore), and one no longer assigned is released once its new replicas say
they host it live (the rule of :meth:`Coordinator.handed_off`). A key lookup it answers
locally returns ``{"table", "partition"}``. So the benchmark measures membership (its
messages, CPU, agreement and the routing around a change), not restores or RocksDB, and
100 members fit on two cores.

Members talk through :class:`CountingTransport`, the in-process
:class:`~sparkiq.cluster.transport.LocalTransport` that also counts each member's heartbeat
(or gossip) messages (requests it sent, replies it gave) and their bytes as the HTTP
transport would put them on the wire (the packed document; HTTP headers not counted).

:class:`Placement` computes the same rendezvous assignment as
:class:`~sparkiq.cluster.assignment.Assignment` (the same BLAKE2b scores; ties, 1 in 2**64,
aside) once per view for every member at once with numpy: 100 members computing it for
10,000 partitions each would otherwise cost the one process 100 times what one real node
spends. That per-node cost is measured on its own (:func:`assignment_seconds`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from sparkiq.cluster.assignment import Assignment, _score
from sparkiq.cluster.coordinator import Coordinator
from sparkiq.cluster.httppool import NodeTimeoutError
from sparkiq.cluster.membership import HostedState
from sparkiq.cluster.transport import LocalTransport
from sparkiq.query.position import Position
from sparkiq.query.request import StateQueryRequest
from sparkiq.query.result import FailureReason, QueryResult, StateQueryResult
from sparkiq.wire.values import pack

__all__ = ["CountingTransport", "Placement", "SimNode", "assignment_seconds"]


class CountingTransport(LocalTransport):
    """:class:`LocalTransport` counting heartbeat messages and bytes per member."""

    def __init__(self) -> None:
        super().__init__()
        self._counts_lock = threading.Lock()
        self.messages: dict[str, int] = {}
        self.bytes: dict[str, int] = {}

    def _count(self, node_id: str, size: int) -> None:
        with self._counts_lock:
            self.messages[node_id] = self.messages.get(node_id, 0) + 1
            self.bytes[node_id] = self.bytes.get(node_id, 0) + size

    def heartbeat(self, url: str, doc: dict[str, Any]) -> dict[str, Any]:
        self._count(doc["node_id"], len(pack(doc)))  # sent, whether or not anyone answers
        reply = super().heartbeat(url, doc)
        self._count(reply["node_id"], len(pack(reply)))
        return reply

    def probe(self, url: str, doc: dict[str, Any]) -> dict[str, Any]:
        self._sending(doc)
        reply = super().probe(url, doc)
        self._count(reply["node_id"], len(pack(reply)))
        return reply

    def probe_req(self, url: str, doc: dict[str, Any]) -> dict[str, Any]:
        self._sending(doc)
        reply = super().probe_req(url, doc)
        self._count(reply["node_id"], len(pack(reply)))
        return reply

    def _sending(self, doc: dict[str, Any]) -> None:
        """Count a gossip message; a killed member sends nothing (its stop's leave
        announcement included: a crashed host announces nothing)."""
        sender = self._nodes.get(doc["url"])
        if sender is not None and getattr(sender, "dead", False):
            raise NodeTimeoutError("a killed member sends nothing")
        self._count(doc["node_id"], len(pack(doc)))

    def snapshot(self) -> tuple[dict[str, int], dict[str, int]]:
        with self._counts_lock:
            return dict(self.messages), dict(self.bytes)


class Placement:
    """Rendezvous replicas of ``tables`` (name -> partition count) for any view of
    ``ids``, computed for all members at once (see the module docstring)."""

    def __init__(self, ids: Sequence[str], tables: Mapping[str, int], standbys: int = 1) -> None:
        self.tables = dict(tables)
        self.standbys = standbys
        self.keys = [(t, p) for t, count in self.tables.items() for p in range(count)]
        self._column = {key: k for k, key in enumerate(self.keys)}
        self._row = {member: i for i, member in enumerate(ids)}
        self._scores = np.empty((len(ids), len(self.keys)), dtype=np.uint64)
        for i, member in enumerate(ids):
            raw = b"".join(_score(member, t, p) for t, p in self.keys)
            self._scores[i] = np.frombuffer(raw, dtype=">u8")
        self._ids = list(ids)
        self._lock = threading.Lock()
        self._views: dict[tuple[str, ...], np.ndarray[Any, Any]] = {}
        self._hosted: dict[tuple[tuple[str, ...], str], dict[str, frozenset[int]]] = {}

    def replicas(self, view: Sequence[str]) -> np.ndarray[Any, Any]:
        """Row r, column k: the member (index into ``ids``) at rank r for key k."""
        members = tuple(sorted(view))
        with self._lock:
            found = self._views.get(members)
        if found is None:
            rows = np.array([self._row[m] for m in members])
            order = np.argsort(self._scores[rows], axis=0)[::-1][: 1 + self.standbys]
            found = rows[order]
            with self._lock:
                if len(self._views) > 64:
                    self._views.clear()
                    self._hosted.clear()
                self._views[members] = found
        return found

    def hosted(self, view: Sequence[str], member: str) -> dict[str, frozenset[int]]:
        """Per table, the partitions ``member`` hosts in ``view``."""
        key = (tuple(sorted(view)), member)
        with self._lock:
            found = self._hosted.get(key)
        if found is None:
            mine = (self.replicas(view) == self._row[member]).any(axis=0)
            parts: dict[str, set[int]] = {t: set() for t in self.tables}
            for k in np.flatnonzero(mine):
                table, partition = self.keys[k]
                parts[table].add(partition)
            found = {t: frozenset(ps) for t, ps in parts.items()}
            with self._lock:
                self._hosted[key] = found
        return found

    def owners(self, view: Sequence[str], table: str, partition: int) -> list[str]:
        return self.owners_in(self.replicas(view), table, partition)

    def owners_in(self, replicas: np.ndarray[Any, Any], table: str, partition: int) -> list[str]:
        """The replicas of one partition in ``replicas`` (what :meth:`replicas` returned)."""
        return [self._ids[i] for i in replicas[:, self._column[(table, partition)]]]

    def moved(self, before: Sequence[str], after: Sequence[str]) -> int:
        """Replica slots whose member changed between two views (new replicas to restore)."""
        old, new = self.replicas(before), self.replicas(after)
        return int(sum(int((~np.isin(new[:, k], old[:, k])).sum()) for k in range(new.shape[1])))

    def check(self, view: Sequence[str], samples: int = 50) -> None:
        """Raise unless the replicas agree with :class:`Assignment` on a sample of keys."""
        reference = Assignment(tuple(view), self.standbys)
        step = max(1, len(self.keys) // samples)
        for table, partition in self.keys[::step]:
            got = self.owners(view, table, partition)
            want = list(reference.replicas(table, partition))
            if got != want:
                raise AssertionError(f"placement {got} != assignment {want}: {table}[{partition}]")


def assignment_seconds(view: Sequence[str], tables: Mapping[str, int], member: str) -> float:
    """CPU seconds one real node spends computing its partitions for a new view."""
    started = time.thread_time()
    assignment = Assignment(tuple(sorted(view)), 1)
    for table, count in tables.items():
        assignment.hosted_by(member, table, count)
    return time.thread_time() - started


class SimNode:
    """A member with a real coordinator and simulated hosting (see the module docstring)."""

    def __init__(
        self,
        node_id: str,
        seeds: list[str],
        transport: CountingTransport,
        placement: Placement,
        *,
        heartbeat_interval: float,
        failure_timeout: float,
        membership: str = "heartbeats",
        batch_every: float | None = None,
    ) -> None:
        self.node_id = node_id
        #: With a number: every partition reports a new batch id every ``batch_every`` s
        #: (as a table committing at that trigger), so what a member hosts keeps changing.
        self.batch_every = batch_every
        self.url = f"local://{node_id}"
        self.transport = transport
        self.placement = placement
        self.dead = False
        self.opened = 0  # partitions this member started hosting (restores, for real)
        self._hosted: dict[str, dict[int, tuple[int, str, int]]] = {t: {} for t in placement.tables}
        self._lock = threading.Lock()
        self.coordinator = Coordinator(
            node_id=node_id,
            url=self.url,
            seeds=seeds,
            standbys=placement.standbys,
            key=None,
            open_to_local=True,
            transport=transport,
            heartbeat_interval=heartbeat_interval,
            failure_timeout=failure_timeout,
            membership=membership,
            local_answer=self.query_local,
            local_caught_up=self._caught_up,
            hosted_state=self._hosted_state,
            rebalance=self._rebalance,
        )

    def start(self) -> SimNode:
        self.transport.register(self.url, self)
        self.coordinator.start()
        return self

    def stop(self) -> None:
        """Leave (a node stopping does this: it stops answering, then stops sending)."""
        self.transport.unregister(self.url)
        self.coordinator.stop()

    def kill(self) -> None:
        """Go silent at once: send nothing and answer nothing (every call to this member
        times out, as to a crashed host), without leaving the transport."""
        self.dead = True
        self.coordinator.stop()

    # -- what the transport calls -------------------------------------------------------------

    def on_heartbeat(self, doc: dict[str, Any]) -> dict[str, Any]:
        self._check_alive()
        return self.coordinator.on_heartbeat(doc)

    def on_probe(self, doc: dict[str, Any]) -> dict[str, Any]:
        self._check_alive()
        return self.coordinator.on_probe(doc)

    def on_probe_req(self, doc: dict[str, Any]) -> dict[str, Any]:
        self._check_alive()
        return self.coordinator.on_probe_req(doc)

    def _check_alive(self) -> None:
        if self.dead:
            raise NodeTimeoutError(f"{self.url} did not answer (killed)")

    def query_local(self, request: StateQueryRequest) -> StateQueryResult[Any]:
        self._check_alive()
        results: dict[int, QueryResult[Any]] = {}
        with self._lock:
            held = self._hosted.get(request.store, {})
            for partition in request.partitions or ():
                if partition in held:
                    row = {"table": request.store, "partition": partition}
                    results[partition] = QueryResult.for_result(row, Position.empty())
                else:
                    results[partition] = QueryResult.for_failure(
                        FailureReason.NOT_PRESENT, f"{self.node_id} does not host {partition}"
                    )
        return StateQueryResult(results)

    # -- simulated hosting ----------------------------------------------------------------------

    def hosted(self) -> dict[str, set[int]]:
        with self._lock:
            return {t: set(parts) for t, parts in self._hosted.items()}

    def _caught_up(self, table: str, partition: int) -> bool:
        with self._lock:
            return partition in self._hosted.get(table, {})

    def _hosted_state(self) -> HostedState:
        batch = 0 if self.batch_every is None else int(time.monotonic() / self.batch_every)
        with self._lock:
            return {
                t: {p: (batch, name, lag) for p, (_, name, lag) in parts.items()}
                for t, parts in self._hosted.items()
            }

    def _rebalance(self, assignment: Assignment) -> None:
        view = assignment.members
        want = self.placement.hosted(view, self.node_id)
        membership = self.coordinator.membership
        replicas = self.placement.replicas(view)
        with self._lock:
            for table, held in self._hosted.items():
                for partition in want[table] - held.keys():
                    held[partition] = (0, "live", 0)
                    self.opened += 1
                for partition in list(held.keys() - want[table]):
                    owners = self.placement.owners_in(replicas, table, partition)
                    if all(partition in membership.hosted_state(o).get(table, {}) for o in owners):
                        del held[partition]
