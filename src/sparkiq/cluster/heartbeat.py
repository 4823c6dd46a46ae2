"""The heartbeat document, and its validation: a heartbeat is input like any other.

Wire format (packed with :func:`sparkiq.wire.values.pack`; the reply has the same shape)::

    {"node_id": str,                      # 1..128 printable characters
     "url": str,                          # the sender's base URL (see below)
     "started_at": float,                 # wall-clock seconds, finite, >= 0
     "members": {node_id: url, ...},      # the members the sender knows (<= MAX_MEMBERS)
     "v": 2,                              # format version; absent: 1
     "hosted": {table: {"<partition>": [batch_id, state, lag_batches]}}}      # version 1
     "groups": {table: [[batch_id, state, lag_batches, [partition, ...]], ...]}}  # version 2

``state`` is ``live``, ``restoring`` or ``error``; ``batch_id`` is an int >= -1 (-1: nothing
applied), ``lag_batches`` an int >= 0.

**Versions.** Both carry the same :data:`HostedState`. Version 2 lists the partitions that
share a state together -- after each batch nearly all of a node's partitions of a table do --
so a heartbeat of 5,000 partitions is about a fifth of the bytes and a tenth of the CPU
(bench/membership.py). A node sends version 2 only to members whose own heartbeats said
``"v": 2`` (and answers a heartbeat in the version it came in): nodes of the previous release
read only ``hosted``, and a rolling upgrade must keep them in the cluster. Either version is
read. A URL is ``scheme://host[:port]`` with no user info,
path, query or fragment, at most 2048 characters; its scheme must be the receiver's own (an
``http`` node never learns an ``https`` URL and vice versa). A node without a cluster secret
(:mod:`sparkiq.cluster.nodeauth`) accepts only loopback URLs: nothing proves that a member
elsewhere is a node.

:func:`parse_heartbeat` checks every field's type and bounds before anything is recorded and
raises :class:`HeartbeatError` (a ``ValueError``; the REST layer answers it with ``400
invalid_heartbeat`` naming the field), so a malformed heartbeat changes nothing.
"""

from __future__ import annotations

import math
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sparkiq.errors import ErrorCode, SparkiqError
from sparkiq.serving.config import is_loopback_url, node_url
from sparkiq.serving.metadata import HostedState

__all__ = [
    "FORMAT",
    "MAX_MEMBERS",
    "HeartbeatError",
    "Heartbeat",
    "HostedState",
    "check_url",
    "grouped",
    "parse_groups",
    "parse_heartbeat",
]

#: The newest heartbeat format version (see the module docstring).
FORMAT = 2


MAX_MEMBERS = 1024
_MAX_ID = 128
_MAX_URL = 2048
_MAX_TABLE = 256
_MAX_TABLES = 4096
_MAX_PARTITION = 1 << 20
_MAX_INT = (1 << 63) - 1
_STATES = frozenset({"live", "restoring", "error"})


class HeartbeatError(SparkiqError, ValueError):
    """A heartbeat (or a heartbeat's reply) is malformed; ``field`` names the culprit."""

    code = ErrorCode.INVALID_HEARTBEAT

    def __init__(self, message: str, field: str) -> None:
        super().__init__(f"invalid heartbeat: {message}", field=field)


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """A validated heartbeat."""

    node_id: str
    url: str
    started_at: float
    members: dict[str, str]
    hosted: HostedState
    version: int = 1


def checked_seeds(
    seeds: list[str], url: str, scheme: str, *, loopback_only: bool, node_id: str, log: Any
) -> list[str]:
    """The seed addresses a member may contact (its own ``url`` left out); a bad one is
    logged on ``log`` and ignored."""
    checked_all: list[str] = []
    for seed in seeds:
        try:
            checked = check_url(node_url(seed), scheme, "peers", loopback_only=loopback_only)
        except HeartbeatError as exc:
            log.warning("%s: ignoring seed %r: %s", node_id, seed, exc)
            continue
        if checked != url:
            checked_all.append(checked)
    return checked_all


def check_url(value: object, scheme: str, field: str, *, loopback_only: bool = False) -> str:
    """``value`` as a member URL of ``scheme`` (see the module docstring), or raise;
    ``loopback_only`` refuses hosts other than this machine's loopback."""
    if not isinstance(value, str) or not 0 < len(value) <= _MAX_URL:
        raise HeartbeatError(f"{field} must be a URL of at most {_MAX_URL} characters", field)
    try:
        parts = urllib.parse.urlsplit(value)
        port = parts.port
    except ValueError:
        raise HeartbeatError(f"{field} is not a URL: {value[:100]!r}", field) from None
    if parts.scheme != scheme:
        raise HeartbeatError(
            f"{field} must be a {scheme}:// URL like this node's own, got {value[:100]!r}", field
        )
    if scheme == "local":  # the in-process transport: local://<node id>
        ok = bool(parts.netloc) and not (parts.path or parts.query or parts.fragment)
    else:
        ok = (
            bool(parts.hostname)
            and (port is None or port > 0)
            and parts.username is None
            and parts.path in ("", "/")
            and not parts.query
            and not parts.fragment
            and not any(c.isspace() for c in value)
        )
    if not ok:
        raise HeartbeatError(f"{field} must be {scheme}://host[:port], got {value[:100]!r}", field)
    if loopback_only and not is_loopback_url(value):
        raise HeartbeatError(
            f"{field} {value[:100]!r} is not on this host: a node without a cluster secret "
            "only has members on its own loopback",
            field,
        )
    return value.rstrip("/")


def _node_id(value: object, field: str) -> str:
    if (
        not isinstance(value, str)
        or not 0 < len(value) <= _MAX_ID
        or not value.isprintable()
        or value != value.strip()
    ):
        raise HeartbeatError(
            f"{field} must be a node id of 1 to {_MAX_ID} printable characters", field
        )
    return value


def _int(value: object, low: int, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= _MAX_INT:
        raise HeartbeatError(f"{field} must be an integer >= {low}", field)
    return value


def _hosted(value: object) -> HostedState:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or len(value) > _MAX_TABLES:
        raise HeartbeatError(f"hosted must be a map of at most {_MAX_TABLES} tables", "hosted")
    out: HostedState = {}
    for table, parts in value.items():
        if not isinstance(table, str) or not 0 < len(table) <= _MAX_TABLE:
            raise HeartbeatError("hosted: table names must be non-empty strings", "hosted")
        if not isinstance(parts, Mapping) or len(parts) > _MAX_PARTITION:
            raise HeartbeatError(f"hosted[{table!r}] must be a map of partitions", "hosted")
        states: dict[int, tuple[int, str, int]] = {}
        for key, state in parts.items():
            where = f"hosted[{table!r}][{key!r}]"
            if not isinstance(key, str) or not key.isdigit() or len(key) > 7:
                raise HeartbeatError(f"{where}: partitions are decimal strings", "hosted")
            partition = int(key)
            if partition >= _MAX_PARTITION:
                raise HeartbeatError(f"{where}: partition out of range", "hosted")
            if not isinstance(state, list | tuple) or len(state) != 3:
                raise HeartbeatError(f"{where} must be [batch_id, state, lag_batches]", "hosted")
            batch, name, lag = state
            if name not in _STATES:
                raise HeartbeatError(f"{where}: state must be one of {sorted(_STATES)}", "hosted")
            states[partition] = (_int(batch, -1, "hosted"), name, _int(lag, 0, "hosted"))
        out[table] = states
    return out


def parse_heartbeat(doc: object, scheme: str, *, loopback_only: bool = False) -> Heartbeat:
    """Validate a heartbeat document received by a node whose URL has ``scheme``
    (``loopback_only``: see :func:`check_url`)."""
    if not isinstance(doc, Mapping):
        raise HeartbeatError("a heartbeat is a map", "body")
    node_id = _node_id(doc.get("node_id"), "node_id")
    url = check_url(doc.get("url"), scheme, "url", loopback_only=loopback_only)
    started_at = doc.get("started_at", 0.0)
    if (
        isinstance(started_at, bool)
        or not isinstance(started_at, int | float)
        or not math.isfinite(started_at)
        or started_at < 0
    ):
        raise HeartbeatError("started_at must be a finite number of seconds >= 0", "started_at")
    members_doc = doc.get("members") or {}
    if not isinstance(members_doc, Mapping) or len(members_doc) > MAX_MEMBERS:
        raise HeartbeatError(
            f"members must be a map of at most {MAX_MEMBERS} node ids to URLs", "members"
        )
    members = {
        _node_id(other, "members"): check_url(
            other_url, scheme, "members", loopback_only=loopback_only
        )
        for other, other_url in members_doc.items()
    }
    version = doc.get("v", 1)
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise HeartbeatError("v must be a format version, an integer >= 1", "v")
    hosted = parse_groups(doc["groups"]) if "groups" in doc else _hosted(doc.get("hosted"))
    return Heartbeat(node_id, url, float(started_at), members, hosted, version)


def grouped(hosted: HostedState) -> dict[str, list[list[Any]]]:
    """``hosted`` in version 2's ``groups`` form: per table, one group per distinct state."""
    out: dict[str, list[list[Any]]] = {}
    for table, parts in hosted.items():
        groups: dict[tuple[int, str, int], list[int]] = {}
        for partition, state in parts.items():
            groups.setdefault(state, []).append(partition)
        out[table] = [[*state, sorted(ps)] for state, ps in groups.items()]
    return out


def parse_groups(value: object) -> HostedState:
    """Version 2's ``groups`` as a :data:`HostedState`, every field checked (gossip's hosted
    records carry the same form)."""
    if not isinstance(value, Mapping) or len(value) > _MAX_TABLES:
        raise HeartbeatError(f"groups must be a map of at most {_MAX_TABLES} tables", "hosted")
    out: HostedState = {}
    for table, groups in value.items():
        if not isinstance(table, str) or not 0 < len(table) <= _MAX_TABLE:
            raise HeartbeatError("groups: table names must be non-empty strings", "hosted")
        where = f"groups[{table!r}]"
        if not isinstance(groups, list | tuple) or len(groups) > _MAX_PARTITION:
            raise HeartbeatError(f"{where} must be a list of groups", "hosted")
        states: dict[int, tuple[int, str, int]] = {}
        for group in groups:
            if not isinstance(group, list | tuple) or len(group) != 4:
                raise HeartbeatError(
                    f"{where}: a group is [batch_id, state, lag_batches, [partition, ...]]",
                    "hosted",
                )
            batch, name, lag, partitions = group
            if name not in _STATES:
                raise HeartbeatError(f"{where}: state must be one of {sorted(_STATES)}", "hosted")
            state = (_int(batch, -1, "hosted"), name, _int(lag, 0, "hosted"))
            if not isinstance(partitions, list | tuple):
                raise HeartbeatError(f"{where}: a group's partitions are a list", "hosted")
            for partition in partitions:
                if (
                    isinstance(partition, bool)
                    or not isinstance(partition, int)
                    or not 0 <= partition < _MAX_PARTITION
                ):
                    raise HeartbeatError(f"{where}: partition out of range", "hosted")
                if partition in states:
                    raise HeartbeatError(f"{where}: partition {partition} listed twice", "hosted")
                states[partition] = state
        out[table] = states
    return out
