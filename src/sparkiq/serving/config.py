"""A node's configuration: keyword arguments first, then ``SPARKIQ_*`` variables, then defaults.

:class:`NodeConfig` is the one place that reads a node's environment variables; both
:class:`~sparkiq.Node` and ``sparkiq serve`` resolve their settings through it, so an option
means the same thing whichever way it is given. Every field that a variable can set is listed
in :data:`ENV_VARIABLES` (the CLI shows them in ``--help``).

Four fields are groups of limits, each field of a group set by its own
``SPARKIQ_<GROUP>_<NAME>`` variable (:data:`ENV_GROUPS`, read through
:mod:`sparkiq.envsettings`): ``sql_limits`` (:class:`~sparkiq.sql.SqlLimits`, ``SQL``),
``http_limits`` (:class:`~sparkiq.limits.HttpLimits`, ``HTTP``), ``pg_limits``
(:class:`~sparkiq.limits.PgLimits`, ``PG``) and ``auth_policy``
(:class:`~sparkiq.limits.AuthPolicy`, ``AUTH``). They are resolved here, once per node, and
the node hands each to the components that enforce it; nothing else reads those variables.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sparkiq.envsettings import dataclass_from_env
from sparkiq.errors import ConfigError
from sparkiq.limits import AuthPolicy, HttpLimits, PgLimits
from sparkiq.sql.limits import SqlLimits

__all__ = [
    "ENV_GROUPS",
    "ENV_VARIABLES",
    "MIN_SECRET_LENGTH",
    "NOT_GIVEN",
    "NodeConfig",
    "environment_value",
    "is_loopback_host",
    "is_loopback_url",
    "node_url",
    "resolve_group",
]


class _NotGiven:
    """The default of an option that a ``SPARKIQ_*`` variable may set; ``None`` is a value
    (it means "not set, and ignore the variable")."""

    def __repr__(self) -> str:
        return "NOT_GIVEN"


NOT_GIVEN: Any = _NotGiven()

#: Field -> the variable that sets it when the keyword argument is not given.
ENV_VARIABLES: dict[str, str] = {
    "node_id": "SPARKIQ_NODE_ID",
    "listen": "SPARKIQ_LISTEN",
    "advertise": "SPARKIQ_ADVERTISE",
    "peers": "SPARKIQ_PEERS",
    "standbys": "SPARKIQ_STANDBYS",
    "token": "SPARKIQ_TOKEN",
    "cluster_secret": "SPARKIQ_CLUSTER_SECRET",
    "principals": "SPARKIQ_PRINCIPALS",
    "audit_log": "SPARKIQ_AUDIT_LOG",
    "local_dir": "SPARKIQ_LOCAL_DIR",
    "heartbeat_interval": "SPARKIQ_HEARTBEAT_INTERVAL",
    "failure_timeout": "SPARKIQ_FAILURE_TIMEOUT",
    "membership": "SPARKIQ_MEMBERSHIP",
    "pg_listen": "SPARKIQ_PG_LISTEN",
    "flight_listen": "SPARKIQ_FLIGHT_LISTEN",
    "allowed_hosts": "SPARKIQ_ALLOWED_HOSTS",
    "pg_tls": "SPARKIQ_PG_TLS",
    "tls_cert": "SPARKIQ_TLS_CERT",
    "tls_key": "SPARKIQ_TLS_KEY",
    "tls_ca": "SPARKIQ_TLS_CA",
    "kafka_bootstrap": "SPARKIQ_KAFKA_BOOTSTRAP",
    "kafka_interval": "SPARKIQ_KAFKA_INTERVAL",
    "kafka_config": "SPARKIQ_KAFKA_CONFIG",
    "source_wait": "SPARKIQ_SOURCE_WAIT",
}

#: Field -> (its settings group's class, the group's name in ``SPARKIQ_<GROUP>_<NAME>``).
ENV_GROUPS: dict[str, tuple[type, str]] = {
    "sql_limits": (SqlLimits, "SQL"),
    "http_limits": (HttpLimits, "HTTP"),
    "pg_limits": (PgLimits, "PG"),
    "auth_policy": (AuthPolicy, "AUTH"),
}

_STORES = ("rocksdb", "memory")
_PG_TLS = ("require", "optional")
_MEMBERSHIP = ("gossip", "heartbeats")


def node_url(address: str, scheme: str = "http") -> str:
    """``host:port`` (or a URL) as the URL nodes and clients use (``scheme`` when the
    address names none)."""
    address = address.strip().rstrip("/")
    return address if "://" in address else f"{scheme}://{address}"


@dataclass(frozen=True, slots=True)
class NodeConfig:
    """Everything a node is configured with (see :class:`~sparkiq.Node` for each meaning).

    Build it with :meth:`resolve`, which applies the variables and validates every value;
    the constructor itself only holds values.
    """

    state_dir: str
    node_id: str = "local"
    listen: str | None = None
    advertise: str | None = None
    peers: tuple[str, ...] = ()
    standbys: int = 1
    token: str | None = None
    cluster_secret: str | None = None
    principals: str | None = None
    audit_log: str | None = None
    local_dir: str | None = None
    store: str = "rocksdb"
    poll_interval: float = 0.02
    heartbeat_interval: float = 0.5
    failure_timeout: float = 3.0
    #: How members learn of each other: ``gossip`` (SWIM probing with piggybacked updates,
    #: the default; sparkiq.cluster.swim) or ``heartbeats`` (all-to-all). Every node of a
    #: cluster must use the same.
    membership: str = "gossip"
    release_grace: float = 5.0
    pg_listen: str | None = None
    #: ``host:port`` of the Arrow Flight SQL endpoint (sparkiq.server.flight); port 0 picks
    #: a free one.
    flight_listen: str | None = None
    #: Host names the HTTP server answers besides loopback names, IP addresses and its own
    #: URL's host (sparkiq.server.browser): ``example.com``, ``*.example.com``, or ``*``.
    allowed_hosts: tuple[str, ...] = ()
    pg_tls: str = "require"
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    #: Kafka bootstrap servers (``host:port,...``) to ask for the end offsets of the topics
    #: the tables read, every ``kafka_interval`` seconds (sparkiq.serving.kafka_lag).
    kafka_bootstrap: str | None = None
    kafka_interval: float = 5.0
    #: A file of Kafka client settings (``KEY=VALUE`` lines: SASL, TLS...) for every client
    #: the node makes: followed topics' consumers and the end-offset fetcher
    #: (sparkiq.topics.consumer.read_client_config; its secrets are never logged).
    kafka_config: str | None = None
    #: How long a read bounded by a producer's Kafka records waits for the writer to commit
    #: a batch that read them (sparkiq.serving.source_bounds).
    source_wait: float = 10.0
    #: What one SQL statement may cost (pull and push, REST and Postgres, the fragments
    #: other nodes send here): ``SPARKIQ_SQL_<NAME>``.
    sql_limits: SqlLimits = dataclasses.field(default_factory=SqlLimits)
    #: What the HTTP server accepts from a client: ``SPARKIQ_HTTP_<NAME>``.
    http_limits: HttpLimits = dataclasses.field(default_factory=HttpLimits)
    #: What one Postgres client may cost the endpoint: ``SPARKIQ_PG_<NAME>``.
    pg_limits: PgLimits = dataclasses.field(default_factory=PgLimits)
    #: How callers whose credentials fail are slowed: ``SPARKIQ_AUTH_<NAME>``.
    auth_policy: AuthPolicy = dataclasses.field(default_factory=AuthPolicy)

    @property
    def scheme(self) -> str:
        """``https`` when the node has a certificate, else ``http``."""
        return "https" if self.tls_cert else "http"

    @property
    def clustered(self) -> bool:
        """Whether the node serves HTTP or joins peers (a transport also makes it clustered)."""
        return bool(self.listen or self.peers)

    @classmethod
    def resolve(
        cls,
        state_dir: str,
        *,
        environ: Mapping[str, str] | None = None,
        defaults: Mapping[str, Any] | None = None,
        **given: Any,
    ) -> NodeConfig:
        """The configuration from keyword arguments, then ``environ`` (default
        ``os.environ``) for those left :data:`NOT_GIVEN`, then ``defaults`` (a caller's own
        defaults, e.g. ``sparkiq serve`` listens on ``127.0.0.1:8081``), then the field
        defaults. ``node_id=None`` names the node after its ``listen`` address (``"local"``
        when it does not listen). A settings group (:data:`ENV_GROUPS`) is given as an
        instance of its class, or as a mapping of some of its fields whose others come from
        the variables. Raises :class:`~sparkiq.errors.ConfigError` naming the option, and the
        variable when one set it, whose value is wrong."""
        env = os.environ if environ is None else environ
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(given) - names)
        if unknown:
            raise ConfigError(f"unknown node option(s) {unknown}; options are {sorted(names)}")
        values: dict[str, Any] = {}
        origin: dict[str, str] = {}  # per option: "" or " (set by SPARKIQ_...)" for messages
        for name in names - {"state_dir", *ENV_GROUPS}:
            value = given.get(name, NOT_GIVEN)
            origin[name] = ""
            variable = ENV_VARIABLES.get(name)
            if value is NOT_GIVEN and variable is not None and env.get(variable, "") != "":
                value, origin[name] = env[variable], f" (set by {variable})"
            if value is NOT_GIVEN and defaults is not None and name in defaults:
                value = defaults[name]
            if value is not NOT_GIVEN:
                values[name] = value
        if values.get("node_id", NOT_GIVEN) is None:  # named after where it listens
            values["node_id"] = _optional_text(values.get("listen"), "listen", "") or "local"
        groups = {name: resolve_group(name, given.get(name, NOT_GIVEN), env) for name in ENV_GROUPS}
        return cls(state_dir=state_dir, **_validated(values, origin), **groups)

    def replace(self, **changes: Any) -> NodeConfig:
        return dataclasses.replace(self, **changes)

    def with_local_dir(self) -> NodeConfig:
        """This config with the default ``local_dir`` of a RocksDB node filled in:
        ``<state_dir>/replicas/<node_id>`` for a local state_dir; a remote one needs it
        given (ConfigError)."""
        if self.local_dir is not None or self.store != "rocksdb":
            return self
        # imported here: the changelog package loads pyarrow and RocksDB, which the command
        # line's client commands (that read NodeConfig's variables) never need
        from sparkiq.changelog.storage import open_storage

        storage = open_storage(self.state_dir)
        if not storage.is_local:
            raise ConfigError(
                f"state_dir {self.state_dir!r} is remote: pass local_dir= (or SPARKIQ_LOCAL_DIR) "
                "for the replicas' local RocksDB files"
            )
        return self.replace(local_dir=os.path.join(storage.root, "replicas", self.node_id))


def resolve_group(
    name: str, value: Any = NOT_GIVEN, environ: Mapping[str, str] | None = None
) -> Any:
    """Settings group ``name`` (:data:`ENV_GROUPS`) as :meth:`NodeConfig.resolve` makes it:
    an instance of its class as given; a mapping of some of its fields, the others from the
    variables of ``environ`` (default ``os.environ``); NOT_GIVEN: every field from the
    variables; None: the defaults, variables ignored (as ``None`` ignores the variable of
    other options). For the replica handles that are not nodes (a follower, an attached
    checkpoint), which take ``sql_limits`` alone."""
    kind, group = ENV_GROUPS[name]
    env = os.environ if environ is None else environ
    if isinstance(value, kind):
        return value
    if value is None:
        return kind()
    if value is NOT_GIVEN:
        value = {}
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"{name} must be a {kind.__name__} or a mapping of some of its fields "
            f"(the others come from SPARKIQ_{group}_<NAME> variables), got {value!r}"
        )
    return dataclass_from_env(kind, group, value, environ=env)


def environment_value(field: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The value the variable of option ``field`` (:data:`ENV_VARIABLES`) has in
    ``environ`` (default ``os.environ``), None when unset or empty; for a command that
    needs one node setting without resolving a whole node (``sparkiq status``'s
    ``local_dir``)."""
    env = os.environ if environ is None else environ
    return env.get(ENV_VARIABLES[field], "") or None


def _validated(values: dict[str, Any], origin: dict[str, str]) -> dict[str, Any]:
    out = dict(values)
    texts = (
        "listen",
        "advertise",
        "token",
        "cluster_secret",
        "local_dir",
        "pg_listen",
        "flight_listen",
    )
    files = ("principals", "audit_log", "tls_cert", "tls_key", "tls_ca", "kafka_config")
    for name in (*texts, *files, "kafka_bootstrap"):
        if name in out:  # "" means unset, as it does for the variables
            out[name] = _optional_text(out[name], name, origin[name])
    if bool(out.get("tls_cert")) != bool(out.get("tls_key")) or (
        out.get("tls_ca") and not out.get("tls_cert")
    ):
        raise ConfigError(
            "TLS needs both tls_cert and tls_key (--tls-cert/--tls-key, SPARKIQ_TLS_CERT/"
            "SPARKIQ_TLS_KEY), and tls_ca only goes with them; given: "
            + ", ".join(n for n in ("tls_cert", "tls_key", "tls_ca") if out.get(n))
        )
    secret = out.get("cluster_secret")
    if secret is not None and len(secret) < MIN_SECRET_LENGTH:
        raise ConfigError(
            f"cluster_secret must be at least {MIN_SECRET_LENGTH} characters"
            f"{origin['cluster_secret']}: make one with "
            "python -c 'import secrets; print(secrets.token_urlsafe(32))'"
        )
    if secret is not None and secret == out.get("token"):
        raise ConfigError(
            "cluster_secret must differ from token: clients hold the token, and a client "
            "must not be able to join the cluster as a node"
        )
    if "node_id" in out:
        node_id = out["node_id"]
        if not isinstance(node_id, str) or not node_id.strip():
            raise ConfigError(
                f"node_id must be a non-empty string, got {node_id!r}{origin['node_id']}"
            )
    if "peers" in out:
        scheme = "https" if out.get("tls_cert") else "http"
        out["peers"] = _peers(out["peers"], origin["peers"], scheme)
    if out.get("peers") and out.get("cluster_secret") is None:
        # Without a secret nothing proves a member is a node: only this host's own processes
        # may form a cluster, and only when no token says they are not all trusted.
        if out.get("token") is not None or out.get("principals") is not None:
            raise ConfigError(
                "a node with a token (or principals) joins peers only with a cluster secret, "
                "which its peers "
                "share and clients never hold: set cluster_secret (--cluster-secret / "
                "SPARKIQ_CLUSTER_SECRET) on every node"
            )
        remote = [p for p in out["peers"] if not is_loopback_url(p)]
        if remote:
            raise ConfigError(
                f"peers {remote} are not on this host: nodes on other hosts prove they are "
                "members with a cluster secret; set cluster_secret (--cluster-secret / "
                "SPARKIQ_CLUSTER_SECRET) on every node"
            )
    if "allowed_hosts" in out:
        out["allowed_hosts"] = _hosts(out["allowed_hosts"], origin["allowed_hosts"])
    if "standbys" in out:
        standbys = _number(out["standbys"], int, "standbys", origin["standbys"])
        if standbys < 0:
            raise ConfigError(f"standbys must be >= 0, got {standbys}{origin['standbys']}")
        out["standbys"] = standbys
    seconds_options = ("poll_interval", "heartbeat_interval", "failure_timeout", "release_grace")
    for name in (*seconds_options, "kafka_interval"):
        if name in out:
            seconds = _number(out[name], float, name, origin[name])
            if not seconds > 0:
                raise ConfigError(
                    f"{name} must be a positive number, got {out[name]!r}{origin[name]}"
                )
            out[name] = seconds
    if "source_wait" in out:
        wait = _number(out["source_wait"], float, "source_wait", origin["source_wait"])
        if not 0 <= wait <= 3600:
            raise ConfigError(
                f"source_wait must be 0 to 3600 seconds, got {out['source_wait']!r}"
                f"{origin['source_wait']}"
            )
        out["source_wait"] = wait
    if "pg_tls" in out and out["pg_tls"] not in _PG_TLS:
        raise ConfigError(
            f"pg_tls must be 'require' or 'optional', got {out['pg_tls']!r}{origin['pg_tls']}"
        )
    if "membership" in out and out["membership"] not in _MEMBERSHIP:
        raise ConfigError(
            f"membership must be 'gossip' or 'heartbeats', got {out['membership']!r}"
            f"{origin['membership']}"
        )
    if "store" in out and out["store"] not in _STORES:
        raise ConfigError(f"store must be 'rocksdb' or 'memory', got {out['store']!r}")
    return out


def _optional_text(value: Any, name: str, origin: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ConfigError(f"{name} must be a string, got {value!r}{origin}")
    return value.strip() or None


def _peers(value: Any, origin: str, scheme: str) -> tuple[str, ...]:
    if value is None:
        return ()
    items: Iterable[Any] = value.split(",") if isinstance(value, str) else value
    peers = []
    for item in items:
        if not isinstance(item, str):
            raise ConfigError(f"peers must be addresses (host:port), got {item!r}{origin}")
        if item.strip():
            peers.append(node_url(item, scheme))
    return tuple(peers)


_HOST_NAME = re.compile(r"(\*|(\*\.)?[a-z0-9_]([a-z0-9_.-]*[a-z0-9_])?)")


def _hosts(value: Any, origin: str) -> tuple[str, ...]:
    """``allowed_hosts``: comma-separated or a list; names, ``*.suffix``, ``*`` or IP
    addresses, each without a scheme or port (a name is answered on every port)."""
    if value is None:
        return ()
    items: Iterable[Any] = value.split(",") if isinstance(value, str) else value
    hosts = []
    for item in items:
        if not isinstance(item, str):
            raise ConfigError(f"allowed_hosts must be host names, got {item!r}{origin}")
        name = item.strip().lower().rstrip(".")
        if not name:
            continue
        if not _HOST_NAME.fullmatch(name) and not _is_address(name.strip("[]")):
            raise ConfigError(
                f"allowed_hosts: {item.strip()!r} is not a host name; give names such as "
                f"'sparkiq.example.com', '*.example.com' or '*', without scheme or port{origin}"
            )
        hosts.append(name)
    return tuple(hosts)


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _number(value: Any, kind: type[int] | type[float], name: str, origin: str) -> Any:
    what = "an int" if kind is int else "a number"
    if isinstance(value, bool) or (
        kind is int and isinstance(value, float) and not value.is_integer()
    ):
        raise ConfigError(f"{name} must be {what}, got {value!r}{origin}")
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be {what}, got {value!r}{origin}") from None


#: The shortest cluster secret accepted (node credentials are MACs keyed by it).
MIN_SECRET_LENGTH = 16


def is_loopback_host(host: str | None) -> bool:
    """Whether ``host`` (a name or an address, IPv6 with or without brackets) is this
    machine's loopback: ``localhost``, 127.0.0.0/8 or ::1."""
    if not host:
        return False
    host = host.strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_loopback_url(url: str) -> bool:
    """Whether ``url`` (``scheme://host[:port]``) names a loopback host; ``local://`` URLs
    (the in-process transport) count as loopback."""
    parts = urllib.parse.urlsplit(url)
    return parts.scheme == "local" or is_loopback_host(parts.hostname)
