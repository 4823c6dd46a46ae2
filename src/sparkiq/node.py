"""A serving node: hosts replicas of the tables in a ``state_dir`` and answers queries.

:class:`Node` is a facade. It assembles the rooms that do the work and wires them together;
each has one job:

* :class:`~sparkiq.serving.config.NodeConfig` -- settings, from arguments then ``SPARKIQ_*``;
* :class:`~sparkiq.serving.hosting.Hosting` -- the replicas and the tailer thread;
* :class:`~sparkiq.serving.lookup.Lookup` -- key lookups and typed requests, local or routed;
* :class:`~sparkiq.cluster.coordinator.Coordinator` -- membership, assignment and the router
  (clustered nodes only), with :class:`~sparkiq.cluster.rebalance.Rebalancer` moving
  partitions as the assignment changes;
* :class:`~sparkiq.sql.SqlEngine` and :class:`~sparkiq.sql.push.SubscriptionHub` -- SQL pull
  and push queries over what :class:`Lookup` reads;
* :func:`~sparkiq.server.start_server` -- the REST API and node protocol over HTTP;
* :class:`~sparkiq.server.pg.PgServer` -- the Postgres wire protocol (``pg_listen``).
* :class:`~sparkiq.server.flight.FlightSqlServer` -- Arrow Flight SQL (``flight_listen``).

This module sits above ``cluster``, ``sql`` and ``server`` (and below ``spark``), so the
rooms never import upward.

Queries never block on the tailer: each partition answers from its last applied batch, with
the position it is at.

Over 600 lines because it is the public API's node: the documented signature of every
setting, and one-line methods handing each call to the room that answers it.

``_lifecycle`` (a lock) guards starting and stopping and the lazily created SQL engine and
push hub; it is never held while calling into the rooms' own locks except during
:meth:`Node.start` and :meth:`Node.stop`, which the rooms never call back into.
"""

from __future__ import annotations

import dataclasses
import socket
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sparkiq.changelog.replica import ReplicaStatus, TableReplica
from sparkiq.changelog.source import ChangelogSource, SegmentSource
from sparkiq.checkpoint.source import CheckpointCatalog
from sparkiq.cluster.coordinator import Coordinator
from sparkiq.cluster.nodeauth import NodeKey, Opened
from sparkiq.cluster.rebalance import Rebalancer
from sparkiq.cluster.transport import HttpTransport, LocalTransport, Transport
from sparkiq.errors import AuthenticationError, ConfigError, SparkiqError
from sparkiq.limits import AuthPolicy, HttpLimits, PgLimits
from sparkiq.principals import Principal, Principals
from sparkiq.query.position import Position, PositionBound
from sparkiq.query.request import StateQueryRequest
from sparkiq.query.result import StateQueryResult
from sparkiq.schema.types import TableSchema
from sparkiq.server import RunningServer, bind_advertised, bind_socket, start_server
from sparkiq.server.audit import AuditLog
from sparkiq.server.auth_failures import AuthFailures
from sparkiq.server.flight import FlightSqlServer
from sparkiq.server.pg import PgServer
from sparkiq.serving.config import NOT_GIVEN, NodeConfig, node_url
from sparkiq.serving.hosting import Hosting, TableView, pinned_placement
from sparkiq.serving.kafka_lag import KafkaLag, KafkaSource
from sparkiq.serving.lookup import KeyLocation, Lookup
from sparkiq.serving.metadata import HostedState, KeyQueryMetadata, NodeMetadata
from sparkiq.serving.topic import TopicSpec, followed_catalogs
from sparkiq.serving.writer_view import WriterRecords, WriterView
from sparkiq.sql import SqlEngine, SqlLimits, SqlResult
from sparkiq.sql.push import Subscription, SubscriptionHub
from sparkiq.stores.dispatch import CATCH_UP_WAIT
from sparkiq.tls import TlsContexts, TlsFiles
from sparkiq.topics.consumer import read_client_config
from sparkiq.topics.lag import TopicLag

__all__ = ["Node", "TableView"]


class Node:
    """Hosts replicas of the tables under ``state_dir`` and answers queries on them.

    ``local_dir`` holds the replicas' RocksDB files (default: ``<state_dir>/replicas/<node_id>``
    for a local ``state_dir``; required for a remote one). ``store="memory"`` keeps replicas
    in memory instead (nothing survives a restart). ``poll_interval`` is how often, in seconds,
    the changelog is checked for new commits. ``partitions`` limits what is hosted:
    ``{"table": [0, 3]}`` hosts only those partitions of that table (tables not named are
    hosted whole); queries for other partitions fail with ``NOT_PRESENT``. ``tables`` limits
    the hosted tables to those named (default: every table in ``state_dir``); ``views`` holds
    a table as a :class:`TableView` instead of as stored. Nodes never write the changelog:
    by default (``read_only=True``) every changelog is opened read-only, so any write
    through a node raises :class:`~sparkiq.errors.ReadOnlyError`.

    **Attached checkpoints.** ``checkpoints={"clicks": "/chk/clicks"}`` also serves the state
    stores of those Spark queries' checkpoints as tables named after each key
    (``clicks_agg``...; see :mod:`sparkiq.serving.attach`); :meth:`attach` adds one later.
    ``topics=[TopicSpec(...)]`` serves Kafka topics as tables (:mod:`sparkiq.serving.topic`).

    **Clustered.** With ``listen`` (``"host:port"``, port 0 picks a free one) the node serves
    the REST API and the node protocol over HTTP; with ``peers`` (seed addresses) or a
    ``transport`` it joins a cluster: partitions are assigned to one active and ``standbys``
    standby nodes by rendezvous hashing over the live members (``membership``: ``"gossip"``
    probes one member every ``heartbeat_interval`` s, SWIM-style, :mod:`sparkiq.cluster.swim`;
    ``"heartbeats"`` beats to all; either way a member is gone after ``failure_timeout`` s
    at least), the node
    hosts only its share, and :meth:`query`/:meth:`get` route to whichever node hosts a
    partition (see :mod:`sparkiq.cluster.router`). ``token`` turns on bearer-token
    authentication for HTTP callers; ``principals`` (a TOML file, :mod:`sparkiq.principals`)
    names several callers, each with its tokens and the tables it may read; ``audit_log``
    (a file) records who read what (:mod:`sparkiq.server.audit`). ``cluster_secret`` (at
    least 16 characters, the same on every node, never given to clients) is how nodes prove
    to each other that they are members (:mod:`sparkiq.cluster.nodeauth`; it never
    travels): without it only processes on this host may join, and only when the node asks
    its clients for no token. ``advertise`` is the URL other nodes and clients use to reach
    this one (default: from ``listen``); ``allowed_hosts`` adds host names the HTTP server
    answers for (:mod:`sparkiq.server.browser`).

    **Postgres wire protocol.** With ``pg_listen`` (``"host:port"``, port 0 picks a free
    one; :attr:`pg_address` is where it listens once started) the node also answers psql,
    psycopg and other Postgres clients with pull queries (docs/postgres.md); the password
    is ``token`` when the node has one. With TLS (below) ``pg_tls`` says whether clients
    must switch to it (``"require"``, the default) or may (``"optional"``).

    **Arrow Flight SQL.** ``flight_listen`` serves ADBC and JDBC the same way
    (:attr:`flight_address`; docs/flight.md).

    **TLS.** With ``tls_cert`` and ``tls_key`` (PEM files) the node serves HTTPS and reaches
    its peers over HTTPS, verifying their certificates against ``tls_ca`` (a PEM bundle;
    default: the system's authorities); renewed files are picked up while it runs
    (:mod:`sparkiq.tls`).

    **Kafka lag.** With ``kafka_bootstrap`` (``"host:port,..."``, operator configuration)
    the node asks that Kafka cluster for the end offsets of the topics its tables read,
    every ``kafka_interval`` seconds (default 5) on a background thread, so
    :meth:`kafka_sources`, ``GET /stats``, ``/metrics`` and ``sparkiq status`` show how far
    each table is behind its topics (:mod:`sparkiq.serving.kafka_lag`; needs
    ``sparkiq[kafka]``); ``kafka_config`` names a file of client settings (SASL, TLS...).

    **Read-your-writes for producers.** A read bounded by a producer's Kafka records
    (:meth:`~sparkiq.PositionBound.after`) that no committed batch has read yet waits up to
    ``source_wait`` seconds (default 10) for the writer to commit one, then answers
    ``NOT_UP_TO_BOUND`` (:mod:`sparkiq.serving.source_bounds`).

    **Limits.** ``sql_limits`` (:class:`~sparkiq.sql.SqlLimits`), ``http_limits``,
    ``pg_limits`` and ``auth_policy`` (:mod:`sparkiq.limits`) each take an instance, or a
    mapping of some of its fields, e.g. ``sql_limits={"max_result_rows": 5000}``.

    **Settings from the environment.** Every setting above but ``store``, ``poll_interval``
    and ``release_grace`` defaults to its ``SPARKIQ_*`` variable (``node_id`` to
    ``SPARKIQ_NODE_ID``...: :data:`~sparkiq.serving.config.ENV_VARIABLES`; ``peers`` and
    ``allowed_hosts`` comma-separated), each field of a limits group to
    ``SPARKIQ_<GROUP>_<NAME>``, read once, when the node is made; ``None`` ignores a variable.
    ``config`` gives all settings at once (a :class:`~sparkiq.serving.config.NodeConfig`).
    """

    def __init__(
        self,
        state_dir: str | None = None,
        *,
        config: NodeConfig | None = None,
        node_id: str = NOT_GIVEN,
        listen: str | None = NOT_GIVEN,
        peers: Iterable[str] | None = NOT_GIVEN,
        standbys: int = NOT_GIVEN,
        token: str | None = NOT_GIVEN,
        cluster_secret: str | None = NOT_GIVEN,
        principals: str | None = NOT_GIVEN,
        audit_log: str | None = NOT_GIVEN,
        advertise: str | None = NOT_GIVEN,
        local_dir: str | None = NOT_GIVEN,
        heartbeat_interval: float = NOT_GIVEN,
        failure_timeout: float = NOT_GIVEN,
        membership: str = NOT_GIVEN,
        release_grace: float = NOT_GIVEN,
        store: str = NOT_GIVEN,
        poll_interval: float = NOT_GIVEN,
        pg_listen: str | None = NOT_GIVEN,
        flight_listen: str | None = NOT_GIVEN,
        allowed_hosts: Iterable[str] | str | None = NOT_GIVEN,
        pg_tls: str = NOT_GIVEN,
        tls_cert: str | None = NOT_GIVEN,
        tls_key: str | None = NOT_GIVEN,
        tls_ca: str | None = NOT_GIVEN,
        kafka_bootstrap: str | None = NOT_GIVEN,
        kafka_interval: float = NOT_GIVEN,
        kafka_config: str | None = NOT_GIVEN,
        source_wait: float = NOT_GIVEN,
        sql_limits: SqlLimits | Mapping[str, Any] | None = NOT_GIVEN,
        http_limits: HttpLimits | Mapping[str, Any] | None = NOT_GIVEN,
        pg_limits: PgLimits | Mapping[str, Any] | None = NOT_GIVEN,
        auth_policy: AuthPolicy | Mapping[str, Any] | None = NOT_GIVEN,
        transport: Transport | None = None,
        partitions: Mapping[str, Iterable[int]] | None = None,
        tables: Iterable[str] | None = None,
        views: Mapping[str, TableView] | None = None,
        read_only: bool = True,
        checkpoints: Mapping[str, str] | None = None,
        topics: Sequence[TopicSpec] | None = None,
    ) -> None:
        # every NodeConfig option is a keyword of the same name; the others are not settings
        passed = locals()
        options = {f.name for f in dataclasses.fields(NodeConfig)} - {"state_dir"}
        given = {k: passed[k] for k in options if passed[k] is not NOT_GIVEN}
        if config is None:
            if state_dir is None:
                raise ConfigError("Node needs a state_dir (or a config=NodeConfig)")
            config = NodeConfig.resolve(state_dir, **given)
        elif given or (state_dir is not None and state_dir != config.state_dir):
            raise ConfigError(
                f"pass either config= or settings, not both (also given: {sorted(given)})"
            )
        self.config = config = config.with_local_dir()
        self.state_dir = config.state_dir
        self.node_id = config.node_id
        self.token = config.token
        #: Who may call this node and read what (``token``, ``principals``): ConfigError here
        #: for a principals file that cannot be read.
        self.principals = Principals(token=config.token, path=config.principals)
        #: Who read what, when ``audit_log`` names a file (sparkiq.server.audit).
        self.audit = None if config.audit_log is None else AuditLog(config.audit_log, self.node_id)
        self.clustered = config.clustered or transport is not None
        if self.clustered and partitions is not None:
            raise ConfigError(
                "partitions= pins what a standalone node hosts; a clustered node (listen=, "
                "peers=) hosts what the assignment gives it"
            )
        self._transport = transport
        pinned = {t: frozenset(ps) for t, ps in (partitions or {}).items()}
        self.url: str | None = None
        self.coordinator: Coordinator | None = None
        self._rebalancer: Rebalancer | None = None
        #: The tables' Kafka topics, with the broker's end offsets when kafka_bootstrap is
        #: given (ConfigError here when the Kafka client, sparkiq[kafka], is not installed).
        client = read_client_config(config.kafka_config)  # SASL, TLS...: never logged
        followed = followed_catalogs(topics or (), config, client)
        self._kafka = KafkaLag(lambda: self._hosting.status(), config, followed, client)
        self._writers = WriterRecords(config.state_dir)  # each table's writer status record
        self._hosting = Hosting(
            config.state_dir,
            node_id=config.node_id,
            placement=self._placement if self.clustered else pinned_placement(pinned),
            local_dir=config.local_dir,
            store=config.store,
            poll_interval=config.poll_interval,
            tables=tables,
            views=views,
            read_only=read_only,
            on_drop=self._forget_retired,
            catalogs=[
                *(_checked(CheckpointCatalog(u, n)) for n, u in (checkpoints or {}).items()),
                *followed,
            ],
            status_extra=self._kafka.status_extra,
        )
        self._lookup = Lookup(self._hosting, node_id=config.node_id, sql_limits=config.sql_limits)
        self._lookup.source_wait = config.source_wait
        self._server: RunningServer | None = None
        self._tls: TlsContexts | None = None  # with tls_cert: every listener's certificate
        self._pg: PgServer | None = None
        self._flight: FlightSqlServer | None = None
        # failed authentications of every listener (REST, Postgres), slowed per address
        self.auth_failures = AuthFailures(config.auth_policy)
        self.pg_address: tuple[str, int] | None = None
        self.flight_address: tuple[str, int] | None = None
        self._started = False
        self._lifecycle = threading.RLock()
        self._sql: SqlEngine | None = None
        self._hub: SubscriptionHub | None = None  # push subscriptions, made by the first stream()

    # -- settings, as attributes (read-only views of the config) -------------------------------

    @property
    def listen(self) -> str | None:
        return self.config.listen

    @property
    def peers(self) -> list[str]:
        return list(self.config.peers)

    @property
    def standbys(self) -> int:
        return self.config.standbys

    @property
    def local_dir(self) -> str | None:
        return self.config.local_dir

    @property
    def poll_interval(self) -> float:
        return self.config.poll_interval

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> Node:
        """Open the replicas of every table in ``state_dir`` and start tailing. Idempotent."""
        with self._lifecycle:
            if self._started:
                return self
            if self.audit is None and self.config.audit_log is not None:  # closed by stop()
                self.audit = AuditLog(self.config.audit_log, self.node_id)
            self._hosting.refresh_tables()
            config = self.config
            if config.tls_cert and config.tls_key and self._tls is None:
                files = TlsFiles(config.tls_cert, config.tls_key, config.tls_ca)
                self._tls = TlsContexts(files).start()
            if self.clustered:
                self._start_cluster()
            self._hosting.start_tailing()
            self._kafka.start()
            if self.config.pg_listen:
                self._pg = PgServer(
                    self,
                    bind_socket(self.config.pg_listen),
                    principals=self.principals,
                    audit=self.audit,
                    limits=config.pg_limits,
                    sql_limits=config.sql_limits,
                    auth_failures=self.auth_failures,
                    tls=self._tls,
                    require_tls=config.pg_tls == "require",
                ).start()
                self.pg_address = self._pg.address
            if config.flight_listen:
                self._flight = FlightSqlServer.for_node(
                    self, config, self._tls, self.principals, self.auth_failures, self.audit
                )
                self.flight_address = self._flight.address
            self._started = True
        return self

    def _start_cluster(self) -> None:
        config = self.config
        sock: socket.socket | None = None
        if config.listen:
            sock, self.url = bind_advertised(config.listen, config.advertise, config.scheme)
        else:
            self.url = node_url(config.advertise or f"local://{self.node_id}")
        self._lookup.url = self.url
        transport = self._transport
        key = None if config.cluster_secret is None else NodeKey(config.cluster_secret)
        if transport is None:
            tls = None if self._tls is None else self._tls.client
            transport = HttpTransport(node_id=self.node_id, key=key, tls=tls)
        elif isinstance(transport, LocalTransport):
            transport.register(self.url, self)
        coordinator = Coordinator(
            node_id=self.node_id,
            url=self.url,
            seeds=list(config.peers),
            standbys=config.standbys,
            key=key,
            open_to_local=not self.principals.required,
            transport=transport,
            heartbeat_interval=config.heartbeat_interval,
            failure_timeout=config.failure_timeout,
            membership=config.membership,
            local_answer=self._lookup.query_local,
            local_caught_up=self._hosting.caught_up,
            hosted_state=self._hosting.hosted_state,
            rebalance=self._rebalance,
            catch_up=self._hosting.poll_once,
            committed_head=self._hosting.latest_batch,
        )
        self._rebalancer = Rebalancer(
            self._hosting,
            node_id=self.node_id,
            handed_off=coordinator.handed_off,
            release_grace=config.release_grace,
        )
        self.coordinator = self._lookup.coordinator = coordinator
        if sock is not None:
            self._server = start_server(self, sock, limits=config.http_limits, tls=self._tls)
        coordinator.start()

    def stop(self) -> None:
        """Stop tailing and serving, end push subscriptions and close every replica.
        Idempotent."""
        with self._lifecycle:
            self._hosting.stop_tailing()
            self._kafka.close()
            for listener in (self._pg, self._flight):
                if listener is not None:
                    listener.stop()
            self._pg = self._flight = None
            if self._server is not None:
                self._server.stop()
                self._server = None
            hub, self._hub = self._hub, None
            if hub is not None:  # ends every open subscription with an error carrying its position
                hub.close()
            coordinator, self.coordinator = self.coordinator, None
            self._lookup.coordinator = None
            if coordinator is not None:
                if isinstance(self._transport, LocalTransport) and self.url:
                    self._transport.unregister(self.url)
                coordinator.stop()
            if self._rebalancer is not None:
                self._rebalancer.close()
                self._rebalancer = None
            self._hosting.close()
            if self._tls is not None:
                self._tls.stop()
                self._tls = None
            if self.audit is not None:
                self.audit.close()
                self.audit = None
            self._started = False

    def __enter__(self) -> Node:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- wiring between the rooms --------------------------------------------------------------

    def _placement(self, table: str, partition_count: int) -> Iterable[int]:
        coordinator = self.coordinator
        if coordinator is None:  # clustered, not started: the first assignment opens them
            return ()
        return coordinator.assignment.hosted_by(self.node_id, table, partition_count)

    def _rebalance(self, assignment: Any) -> None:
        if self._rebalancer is not None:
            self._rebalancer.rebalance(assignment)

    def _forget_retired(self, table: str) -> None:
        if self._rebalancer is not None:
            self._rebalancer.forget(table)

    # -- hosting -----------------------------------------------------------------------------

    @property
    def tables(self) -> list[str]:
        return self._hosting.tables

    def attach(
        self,
        checkpoint_uri: str,
        name: str,
        operators: Mapping[int, str] | Iterable[int] | None = None,
    ) -> list[str]:
        """Serve the state stores of a Spark query's checkpoint as tables named after
        ``name`` (zero-change mode, see :mod:`sparkiq.serving.attach`); return the tables
        hosted now (stores that appear later are hosted when they do)."""
        catalog = CheckpointCatalog(checkpoint_uri, name, operators)
        catalog.names()  # a wrong operator id or an unservable store fails here, clearly
        return self._hosting.add_catalog(catalog)

    def refresh_tables(self) -> list[str]:
        """Host any table that appeared in ``state_dir`` since the last call; return new ones
        (see :meth:`sparkiq.serving.hosting.Hosting.refresh_tables`)."""
        return self._hosting.refresh_tables()

    def poll_once(self) -> int:
        """Apply whatever was committed since the last poll; return the applications made.
        Safe to call while the background tailer runs (polls are serialized)."""
        return self._hosting.poll_once()

    def wait_for(self, table: str, batch_id: int, timeout: float | None = None) -> bool:
        """Block until every hosted partition of ``table`` applied ``batch_id``."""
        return self._hosting.wait_for(table, batch_id, timeout)

    def notify(self, table: str | None = None) -> None:
        """Tell the tailer (and push subscriptions) a batch was just committed."""
        self._hosting.wake()
        hub = self._hub
        if hub is not None:
            hub.notify(table)

    def replica(self, store: str) -> TableReplica:
        """The hosted replica of table ``store`` (its changelog, partitions and stores)."""
        return self._hosting.replica(store)

    def status(self) -> list[ReplicaStatus]:
        return self._hosting.status()

    def is_ready(self) -> bool:
        """Whether every hosted partition is caught up with the changelog (readiness).

        Never before :meth:`start` has returned: the HTTP server answers while a clustered
        node still meets its peers and opens the partitions assigned to it, and a node
        hosting nothing yet is not caught up with anything."""
        return self._started and all(s.state == "live" for s in self.status())

    def hosted_state(self) -> HostedState:
        return self._hosting.hosted_state()

    def write_status_file(self) -> None:
        """Write ``<local_dir>/status.json`` (what ``sparkiq status`` shows for this node)."""
        self._hosting.write_status_file()

    def position(self, store: str) -> Position:
        return self._hosting.position(store)

    def kafka_sources(self) -> list[KafkaSource]:
        """Per table, the Kafka topics it reads: the offsets applied here, and the end
        offsets and lag when the node has ``kafka_bootstrap`` (read from a cache a background
        thread refreshes: never blocks)."""
        return self._kafka.sources()

    def followed_topics(self) -> list[TopicLag]:
        """Per topic followed as a table: its lag and its malformed and misplaced records
        (:mod:`sparkiq.topics.lag`; never blocks)."""
        return self._kafka.followed()

    def writers(self) -> list[WriterView]:
        """Per hosted table, its writer (running, failed, stopped, silent or unknown), from
        the status records its driver writes (:mod:`sparkiq.serving.writer_view`; a cache
        read in the background: never blocks after the first call)."""
        return self._writers.views(self.tables)

    # -- reads -------------------------------------------------------------------------------

    def schema(self, store: str) -> TableSchema:
        """The schema of the rows ``store`` answers with (a view's schema for a follower)."""
        return self._lookup.schema(store)

    def history(self, store: str) -> dict[str, Any]:
        """How far back ``store`` can be read here: the table's history setting and the
        oldest and newest batch every partition hosted here still holds (None: none)."""
        return self._hosting.replica(store).history()

    def partition_count(self, store: str) -> int:
        """How many partitions ``store`` has (hosted here or not)."""
        return self._lookup.partition_count(store)

    def partition_for_key(self, store: str, key: Any) -> int:
        """The partition holding ``key`` (validates the key against the table's key columns)."""
        return self._lookup.partition_for_key(store, key)

    def get(self, store: str, key: Any) -> dict[str, Any] | None:
        """The current row of ``key`` in ``store``, or None. The fast path of a KeyQuery: a
        clustered node asks the node hosting the key's partition when it does not hold it
        caught up itself; a partition no node can answer raises :class:`SparkiqError`."""
        return self._lookup.get(store, key)

    def get_with_position(self, store: str, key: Any) -> tuple[dict[str, Any] | None, Position]:
        """Like :meth:`get`, with the position of the partition the row was read at (the
        pair is consistent: the row is exactly the state at that position)."""
        return self._lookup.get_with_position(store, key)

    def local_lookup(
        self, store: str, key: Any
    ) -> tuple[dict[str, Any] | None, Position, int] | None:
        """``(row, position, partition)`` when this node holds the key's partition caught up,
        else None (another node must be asked). Never blocks on the network."""
        return self._lookup.local_lookup(store, key)

    def locate_key(self, store: str, key: Any) -> KeyLocation:
        """Where ``key`` is: its partition and whether this node reads it itself (no I/O);
        pass it to :meth:`read_located`, so the key is located once per request."""
        return self._lookup.locate(store, key)

    def read_located(
        self, location: KeyLocation, store: str, key: Any
    ) -> tuple[dict[str, Any] | None, Position]:
        """``(row, position)`` of a key :meth:`locate_key` found; blocks only when another
        node must be asked (``location.here`` false)."""
        return self._lookup.read_located(location, store, key)

    def query(self, request: StateQueryRequest) -> StateQueryResult[Any]:
        """Answer ``request``; failures are per partition: a standalone node answers from the
        partitions it hosts (``NOT_PRESENT`` for others), a clustered node routes each
        partition to a node hosting it (see :mod:`sparkiq.cluster.router`)."""
        return self._lookup.route(request)

    @property
    def source_wait(self) -> float:
        """``source_wait`` (see the class): settable while the node runs."""
        return self._lookup.source_wait

    @source_wait.setter
    def source_wait(self, seconds: float) -> None:
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
            raise ValueError(f"source_wait must be a number of seconds >= 0, got {seconds!r}")
        self._lookup.source_wait = float(seconds)

    def sources_read(self, store: str, bound: PositionBound) -> bool:
        """Whether, as far as this node's replicas have seen, ``store`` has committed a
        batch that read the Kafka records ``bound`` asks for (memory only: cheap enough to
        ask on an event loop while a request waits)."""
        return self._lookup.sources.covered(store, bound)

    def query_local(
        self, request: StateQueryRequest, *, catch_up_wait: float = CATCH_UP_WAIT
    ) -> StateQueryResult[Any]:
        """Answer ``request`` from the partitions hosted here only (``NOT_PRESENT`` for the
        others; ``NOT_ACTIVE`` for standbys when the request requires the active); a
        partition behind the request's batch or bound is waited for up to
        ``catch_up_wait`` seconds."""
        return self._lookup.query_local(request, catch_up_wait=catch_up_wait)

    def metadata_for_key(self, store: str, key: Any) -> KeyQueryMetadata:
        """Which partition holds ``key`` and which nodes host it (active first)."""
        return self._lookup.metadata_for_key(store, key)

    def all_metadata(self) -> list[NodeMetadata]:
        """Per live node: the partitions it is active and standby for, and what it hosts."""
        return self._lookup.all_metadata()

    # -- cluster -----------------------------------------------------------------------------

    def check_token(self, token: str | None) -> Principal | None:
        """The principal ``token`` authenticates (None: the node asks for no token); raises
        :class:`~sparkiq.errors.AuthenticationError` for a missing or unknown one."""
        return self.principals.authenticate(token)

    def principal_named(self, name: str | None) -> Principal | None:
        """The principal a member says a routed request runs for (None: the member itself);
        :class:`~sparkiq.errors.ForbiddenError` for a name this node does not know."""
        return self.principals.routed_for(name, self.node_id)

    def admit_node(
        self, header: str | None, method: str, path: str, body: bytes, peer: str | None
    ) -> Opened | None:
        """Check the node credential of a node-protocol request (see
        :meth:`sparkiq.cluster.coordinator.Coordinator.admit`)."""
        if self.coordinator is None:
            raise AuthenticationError(f"node {self.node_id!r} is not clustered: it has no members")
        return self.coordinator.admit(header, method, path, body, peer)

    def sign_reply(self, request_mac: str | None, body: bytes) -> str | None:
        """The header proving this node's reply comes from a member (None: no secret)."""
        return None if self.coordinator is None else self.coordinator.sign_reply(request_mac, body)

    def _clustered(self) -> Coordinator:
        if self.coordinator is None:
            raise SparkiqError(f"node {self.node_id!r} is not clustered")
        return self.coordinator

    def on_heartbeat(self, doc: dict[str, Any]) -> dict[str, Any]:
        """A heartbeat from another member; returns this node's."""
        return self._clustered().on_heartbeat(doc)

    def on_probe(self, doc: dict[str, Any]) -> dict[str, Any]:
        """A gossip probe from another member; returns the ack."""
        return self._clustered().on_probe(doc)

    def on_probe_req(self, doc: dict[str, Any]) -> dict[str, Any]:
        """Another member asks this one to probe a third (gossip's indirect probe)."""
        return self._clustered().on_probe_req(doc)

    # -- SQL ---------------------------------------------------------------------------------

    def sql(self, text: str, **options: Any) -> SqlResult:
        """Run a SQL pull query (or ``EXPLAIN``) over the tables this node serves.

        See :meth:`sparkiq.sql.SqlEngine.execute` for ``options``. Limits are the node's
        ``sql_limits`` (docs/sql.md#limits)."""
        engine = self._sql
        if engine is None:
            with self._lifecycle:
                engine = self._sql
                if engine is None:
                    engine = self._sql = SqlEngine(self._lookup, self.config.sql_limits)
        return engine.execute(text, **options)

    def sql_here(self, text: str, *, page_size: int | None = None) -> SqlResult | None:
        """:meth:`sql`'s answer when at hand without blocking, else None (for an event loop to
        try before handing :meth:`sql` to a thread; :meth:`SqlEngine.execute_here`)."""
        engine = self._sql
        return None if engine is None else engine.execute_here(text, page_size=page_size)

    def stream(self, text: str, **options: Any) -> Subscription:
        """Run a SQL push query (``SELECT ... FROM t [WHERE ...] EMIT CHANGES``).

        Returns a :class:`sparkiq.sql.push.Subscription` (a closeable iterator of changes);
        see :meth:`sparkiq.sql.push.SubscriptionHub.subscribe` for ``options``. Every
        subscription of this node shares one changelog tail per table.
        """
        hub = self._hub
        if hub is None:
            with self._lifecycle:
                hub = self._hub
                if hub is None:
                    hub = self._hub = SubscriptionHub(
                        self.state_dir,
                        source=self._lookup,
                        sources=self._attached_source,
                        limits=self.config.sql_limits,
                    )
        return hub.subscribe(text, **options)

    def subscriptions(self) -> dict[str, int]:
        """Open push subscriptions per table (from :meth:`stream` and the HTTP and Postgres
        endpoints); a subscription counts from the moment it is registered, so the changes
        committed after that are the ones it delivers."""
        hub = self._hub
        return {} if hub is None else hub.subscriptions()

    def _attached_source(self, table: str) -> ChangelogSource | None:
        """The change source of an attached checkpoint or followed topic (None: sparkiq's)."""
        try:
            source = self._hosting.replica(table).source
        except SparkiqError:
            return None
        return None if isinstance(source, SegmentSource) else source


def _checked(catalog: CheckpointCatalog) -> CheckpointCatalog:
    """The catalog, once its stores are known to be servable (raises a clear error if not)."""
    catalog.names()
    return catalog
