"""What reads need of the cluster a node belongs to, as protocols (the coordinator, in
:mod:`sparkiq.cluster`, one layer up, implements them), and the cluster's metadata as
a node reports it."""

from __future__ import annotations

from typing import Any, Protocol

from sparkiq.query.request import StateQueryRequest
from sparkiq.query.result import StateQueryResult
from sparkiq.serving.metadata import HostedState, NodeMetadata

__all__ = ["ClusterView", "Members", "Placement", "Routing", "nodes_metadata"]


class Routing(Protocol):
    """Routes a request's partitions to the nodes hosting them (a cluster's router)."""

    def route(self, request: StateQueryRequest, partitions: list[int]) -> StateQueryResult[Any]: ...


class Placement(Protocol):
    """Which members host which partitions (a cluster's assignment)."""

    @property
    def members(self) -> tuple[str, ...]: ...

    def replicas(self, table: str, partition: int) -> tuple[str, ...]: ...

    def active(self, table: str, partition: int) -> str | None: ...


class Members(Protocol):
    """What a node knows of the other members: where they are and what they host."""

    def url_of(self, node_id: str) -> str | None: ...

    def hosted_state(self, node_id: str) -> HostedState: ...

    def hosting(self, table: str, partition: int) -> list[str]: ...


class ClusterView(Protocol):
    """What reads need of the cluster a node belongs to (its coordinator, in
    :mod:`sparkiq.cluster`, one layer up): the router, the assignment, the members, and
    whether this node's own view is fresh (not just resumed from a stall)."""

    @property
    def router(self) -> Routing: ...

    @property
    def assignment(self) -> Placement: ...

    @property
    def membership(self) -> Members: ...

    def is_fresh(self) -> bool: ...

    def wait_fresh(self, timeout: float) -> bool: ...


def nodes_metadata(
    cluster: ClusterView | None,
    tables: dict[str, int],
    node_id: str,
    url: str,
    hosted_here: HostedState,
) -> list[NodeMetadata]:
    """Per live node: the partitions of ``tables`` (name: partition count) it is active and
    standby for, and what it hosts as of its last heartbeat (this node, ``node_id``:
    ``hosted_here``). A standalone node (``cluster`` None) is active for everything."""
    if cluster is None:
        return [
            NodeMetadata(
                node_id,
                url,
                {t: tuple(range(n)) for t, n in tables.items()},
                {t: () for t in tables},
                hosted_here,
            )
        ]
    assignment = cluster.assignment
    out = []
    for member in assignment.members:
        active = {
            t: tuple(p for p in range(n) if assignment.active(t, p) == member)
            for t, n in tables.items()
        }
        standby = {
            t: tuple(p for p in range(n) if member in assignment.replicas(t, p)[1:])
            for t, n in tables.items()
        }
        hosted = hosted_here if member == node_id else cluster.membership.hosted_state(member)
        member_url = cluster.membership.url_of(member) or ""
        out.append(NodeMetadata(member, member_url, active, standby, hosted))
    return out
