"""Where things are: which node hosts which partition, as values (also sent over REST)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["HostInfo", "HostedState", "KeyQueryMetadata", "NodeMetadata"]

#: Per table, per hosted partition: ``(batch_id, state, lag_batches)`` (state: live,
#: restoring, error; lag: committed batches not applied yet).
HostedState = dict[str, dict[int, tuple[int, str, int]]]


@dataclass(frozen=True, slots=True)
class HostInfo:
    """A node: its id and the URL clients and other nodes reach it at."""

    node_id: str
    url: str


@dataclass(frozen=True, slots=True)
class KeyQueryMetadata:
    """Where a key lives: its partition, the active node and the standbys (in order)."""

    partition: int
    active_host: HostInfo | None
    standby_hosts: tuple[HostInfo, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "partition": self.partition,
            "active_host": None if self.active_host is None else _host(self.active_host),
            "standby_hosts": [_host(h) for h in self.standby_hosts],
        }

    @staticmethod
    def from_dict(doc: Mapping[str, Any]) -> KeyQueryMetadata:
        active = doc.get("active_host")
        return KeyQueryMetadata(
            int(doc["partition"]),
            None if active is None else HostInfo(active["node_id"], active["url"]),
            tuple(HostInfo(h["node_id"], h["url"]) for h in doc.get("standby_hosts", ())),
        )


def _host(host: HostInfo) -> dict[str, str]:
    return {"node_id": host.node_id, "url": host.url}


@dataclass(frozen=True, slots=True)
class NodeMetadata:
    """One node of the cluster: the partitions it is active and standby for, per store,
    and the state of each partition it hosts, as of the node's last heartbeat:
    ``{store: {partition: (batch_id, state, lag_batches)}}``; ``batch_id`` is the
    partition's position in the table's batch clock."""

    node_id: str
    url: str
    active: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    standby: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    hosted: Mapping[str, Mapping[int, tuple[int, str, int]]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "node_id": self.node_id,
            "url": self.url,
            "active": {t: list(ps) for t, ps in self.active.items()},
            "standby": {t: list(ps) for t, ps in self.standby.items()},
            "hosted": {
                t: {
                    str(p): {"batch_id": s[0], "state": s[1], "lag_batches": s[2]}
                    for p, s in ps.items()
                }
                for t, ps in self.hosted.items()
            },
        }
