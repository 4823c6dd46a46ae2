"""The ``sparkiq`` command line.

Every option can also be set by the ``SPARKIQ_*`` environment variable shown in ``--help``;
a flag given on the command line wins over the variable.

It is the parser of every command (a declaration per option, with its help) and the thin
functions that run each; what a command does lives in the package (``status_report``,
``output``, ``shell``, ``demo``, ``Client``). Over 600 lines because of the options'
declarations: a table per command, each option with its help.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Sequence
from typing import Any

from sparkiq.serving.config import ENV_GROUPS, ENV_VARIABLES, NodeConfig, environment_value

__all__ = ["main"]

_SERVE_LISTEN = "127.0.0.1:8081"

#: ``sparkiq serve`` options that configure the node: (NodeConfig field, type, help, default
#: shown). Each is also set by its variable in ENV_VARIABLES; NodeConfig applies both.
_SERVE_OPTIONS: tuple[tuple[str, type, str, str], ...] = (
    ("node_id", str, "this node's unique id", "host:port"),
    ("listen", str, "host:port to serve on", _SERVE_LISTEN),
    ("advertise", str, "URL other nodes and clients reach this node at", ""),
    ("peers", str, "comma-separated host:port of seed nodes", ""),
    ("standbys", int, "standby replicas per partition", "1"),
    ("token", str, "require this bearer token from clients", ""),
    (
        "cluster_secret",
        str,
        "the secret every node of the cluster shares to prove it is a member "
        "(never given to clients; prefer the variable: arguments show in ps)",
        "",
    ),
    ("principals", str, "TOML file of principals: their tokens and the tables they read", ""),
    ("audit_log", str, "append one JSON line per request to this file (who read what)", ""),
    ("local_dir", str, "where this node keeps its replicas", "<state_dir>/replicas/<node_id>"),
    ("heartbeat_interval", float, "seconds between probes (gossip) or heartbeats", "0.5"),
    ("failure_timeout", float, "a member silent this long (at least) is gone", "3"),
    (
        "membership",
        str,
        "how members learn of each other: 'gossip' (SWIM) or 'heartbeats' (all-to-all); "
        "the same on every node",
        "gossip",
    ),
    ("pg_listen", str, "host:port to serve the Postgres wire protocol on (psql, psycopg)", ""),
    ("flight_listen", str, "host:port to serve Arrow Flight SQL on (ADBC, JDBC)", ""),
    (
        "pg_tls",
        str,
        "with --tls-cert: 'require' refuses Postgres clients that do not ask for TLS, "
        "'optional' also lets them in in plain text",
        "require",
    ),
    ("tls_cert", str, "PEM certificate (and chain): serve HTTPS, reach peers over HTTPS", ""),
    ("tls_key", str, "PEM private key of --tls-cert", ""),
    ("tls_ca", str, "PEM bundle of the CAs that sign the other nodes' certificates", "system"),
    (
        "kafka_bootstrap",
        str,
        "Kafka bootstrap servers (host:port,...) to ask for the end offsets of the topics the "
        "tables read: Kafka lag in status, the console and /metrics (needs sparkiq[kafka]); "
        "also where --follow-topic reads",
        "",
    ),
    ("kafka_interval", float, "seconds between fetches of the Kafka end offsets", "5"),
    (
        "kafka_config",
        str,
        "file of Kafka client settings, KEY=VALUE lines in librdkafka's names "
        "(security.protocol, sasl.username, sasl.password, ssl.ca.location...), for "
        "--follow-topic and the end offsets; secrets are never logged",
        "",
    ),
    (
        "source_wait",
        float,
        'seconds a read bounded by a producer\'s Kafka records ("after") waits for the '
        "writer to commit a batch that read them",
        "10",
    ),
)


def _env(variable: str, default: Any) -> Any:
    """The default of a CLI option of the command line's own (a state dir, the demo's
    rate, a client command's URL and token...). A node's settings are not read here:
    NodeConfig reads their variables (docs/design.md, "every node setting in NodeConfig")."""
    return os.environ.get(variable, default)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sparkiq",
        description="Interactive queries over the live state of PySpark streaming pipelines.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = commands.add_parser(
        "demo",
        help="run a self-contained streaming pipeline and query its tables live",
        description="Starts a node with the web console (its URL is the first line), runs a "
        "shop pipeline on a built-in event generator into three tables and shows a live "
        "summary of them. Spark's log goes to <state_dir>/logs/spark.log. Stop with Ctrl-C.",
    )
    demo.add_argument(
        "--state-dir",
        default=_env("SPARKIQ_STATE_DIR", "./demo-state"),
        help="where the changelog and replicas live [SPARKIQ_STATE_DIR, default ./demo-state]",
    )
    demo.add_argument(
        "--duration",
        type=float,
        default=float(_env("SPARKIQ_DEMO_DURATION", 0)),
        help="stop this many seconds after the tables first answer; 0 runs until Ctrl-C "
        "[SPARKIQ_DEMO_DURATION]",
    )
    demo.add_argument(
        "--rate",
        type=int,
        default=int(_env("SPARKIQ_DEMO_RATE", 200)),
        help="generated events per second [SPARKIQ_DEMO_RATE, default 200]",
    )
    demo.add_argument(
        "--partitions",
        type=int,
        default=int(_env("SPARKIQ_DEMO_PARTITIONS", 4)),
        help="partitions per table [SPARKIQ_DEMO_PARTITIONS, default 4]",
    )
    demo.add_argument(
        "--trigger",
        type=float,
        default=float(_env("SPARKIQ_DEMO_TRIGGER", 1)),
        help="seconds between micro-batches: a longer one costs less CPU, the tables move "
        "less often [SPARKIQ_DEMO_TRIGGER, default 1]",
    )
    demo.add_argument(
        "--listen",
        default=_env("SPARKIQ_DEMO_LISTEN", _SERVE_LISTEN),  # where `query` and `shell` look first
        help="host:port of the demo's node and web console; the next free port when taken "
        "[SPARKIQ_DEMO_LISTEN, default 127.0.0.1:8081]",
    )
    demo.add_argument(
        "--fresh",
        action="store_true",
        help="delete --state-dir first instead of resuming from it",
    )

    status = commands.add_parser(
        "status",
        help="show the tables of a state_dir, their changelog, and the progress of local nodes",
    )
    status.add_argument(
        "--state-dir",
        default=_env("SPARKIQ_STATE_DIR", "./demo-state"),
        help="the state_dir to inspect [SPARKIQ_STATE_DIR]",
    )
    status.add_argument(
        "--local-dir",
        action="append",
        default=None,
        help="a node's local_dir whose replicas to show (repeatable); by default every node "
        "under <state_dir>/replicas [SPARKIQ_LOCAL_DIR]",
    )
    status.add_argument(
        "--checkpoint",
        action="append",
        metavar="NAME=URI",
        default=None,
        help="also show the tables served from the Spark query whose checkpoint is URI, as "
        "`sparkiq serve --checkpoint` names them (repeatable) [SPARKIQ_CHECKPOINT, "
        "comma-separated]",
    )
    status.add_argument(
        "--watch",
        type=float,
        nargs="?",
        const=2.0,
        default=None,
        metavar="SECONDS",
        help="show it again every SECONDS (default 2) until Ctrl-C: redrawn in place on a "
        "terminal, one block after another otherwise",
    )

    compact = commands.add_parser(
        "compact",
        help="snapshot tables at their newest batch, then apply retention",
        description="Writes a snapshot of every partition (no Spark needed) and, with "
        "--retention, deletes what no snapshot needs. The writer App does this on its own "
        "every snapshot_every batches; use this to do it now, or when the writer is down.",
    )
    compact.add_argument(
        "--state-dir",
        default=_env("SPARKIQ_STATE_DIR", "./demo-state"),
        help="the state_dir holding the tables [SPARKIQ_STATE_DIR]",
    )
    compact.add_argument("--table", action="append", help="only this table (repeatable)")
    compact.add_argument(
        "--retention",
        type=float,
        default=None,
        help="then delete files older than this many seconds that no snapshot needs",
    )

    publish = commands.add_parser(
        "publish",
        help="publish a table to a compacted Kafka topic, exactly once (docs/kafka.md)",
        description="Follows the table's changelog and produces every committed batch to "
        "the topic in one Kafka transaction (created compacted when absent; its schema goes "
        "to the topic sparkiq-schemas). Resumes where the topic stopped; one publisher per "
        "table and topic (a second one fences the first). Logs its lag; stops on SIGTERM or "
        "Ctrl-C. Needs sparkiq[kafka].",
    )
    publish.add_argument(
        "--state-dir",
        default=_env("SPARKIQ_STATE_DIR", None),
        help="the state_dir holding the table [SPARKIQ_STATE_DIR]",
    )
    publish.add_argument("--table", required=True, help="the table to publish")
    publish.add_argument("--topic", required=True, help="the Kafka topic to publish it to")
    publish.add_argument(
        "--bootstrap-servers",
        default=_env("SPARKIQ_KAFKA_BOOTSTRAP", None),
        help="Kafka bootstrap servers, host:port,... [SPARKIQ_KAFKA_BOOTSTRAP]",
    )
    publish.add_argument(
        "--config",
        action="append",
        metavar="NAME=VALUE",
        default=[],
        help="a Kafka client setting (librdkafka's names, e.g. security.protocol=SSL; repeatable)",
    )
    publish.add_argument(
        "--key-format",
        choices=("json", "kafka"),
        default=_env("SPARKIQ_PUBLISH_KEY_FORMAT", "json"),
        help="how keys are written: json, or kafka (ksqlDB's KAFKA format, one key column) "
        "[SPARKIQ_PUBLISH_KEY_FORMAT, default json]",
    )
    publish.add_argument(
        "--once",
        action="store_true",
        help="publish what is committed now, then exit (instead of following the table)",
    )
    publish.add_argument(
        "--status-interval",
        type=float,
        default=10.0,
        help="seconds between status lines in the log (default 10)",
    )

    serve = commands.add_parser(
        "serve",
        help="run a serving node: host replicas, join a cluster, answer over HTTP",
        description="Hosts the partitions the cluster assigns to this node, answers typed and "
        "SQL queries over HTTP (REST API, /openapi.json) and routes what it does not host to "
        "the node that does. Stops on SIGTERM or Ctrl-C.",
        epilog=_limits_epilog(),
    )
    serve.add_argument(
        "--state-dir",
        default=_env("SPARKIQ_STATE_DIR", None),
        help="the state_dir the writer materializes into [SPARKIQ_STATE_DIR]",
    )
    serve.add_argument(
        "--checkpoint",
        action="append",
        metavar="NAME=URI",
        default=None,
        help="also serve the state of the Spark query whose checkpoint is URI, as tables "
        "NAME_<operator>... (repeatable; docs/attach.md) [SPARKIQ_CHECKPOINT, comma-separated]",
    )
    serve.add_argument(
        "--follow-topic",
        action="append",
        metavar="[NAME=]TOPIC[?OPTIONS]",
        default=None,
        help="also serve the Kafka topic TOPIC (from --kafka-bootstrap) as table NAME "
        "(default: the topic's name); OPTIONS for a topic sparkiq did not publish: "
        "key=COLUMNS&columns=DDL[&key_format=json|kafka][&value_format=json|string], e.g. "
        "'totals?key=user&columns=user STRING, total BIGINT'; &kafka.SETTING=VALUE for a "
        "client setting of its own (repeatable; docs/kafka.md) "
        "[SPARKIQ_FOLLOW_TOPIC, ';'-separated]",
    )
    for field, kind, text, shown in _SERVE_OPTIONS:
        variable = ENV_VARIABLES[field]
        serve.add_argument(
            "--" + field.replace("_", "-"),
            type=kind,
            default=argparse.SUPPRESS,  # absent: NodeConfig reads the variable, then defaults
            help=f"{text} [{variable}{f', default {shown}' if shown else ''}]",
        )
    serve.add_argument(
        "--allowed-host",
        dest="allowed_hosts",
        action="append",
        metavar="NAME",
        default=argparse.SUPPRESS,
        help="also answer HTTP requests for this host name (repeatable; *.example.com, or * "
        "for any); localhost, IP addresses and the host of --advertise/--listen always are "
        f"[{ENV_VARIABLES['allowed_hosts']}, comma-separated]",
    )

    query = commands.add_parser(
        "query",
        help="run a SQL query against a node and print the rows (a table; --json, --csv)",
        description="Runs a pull query and prints its rows, or a push query "
        "(... EMIT CHANGES) and prints each change as it is committed until Ctrl-C.",
    )
    query.add_argument("sql", help="the statement, e.g. \"SELECT * FROM t WHERE k = 'a'\"")
    _connection_options(query)
    forms = query.add_mutually_exclusive_group()
    forms.add_argument(
        "--json", dest="form", action="store_const", const="json", help="one JSON object a line"
    )
    forms.add_argument(
        "--csv", dest="form", action="store_const", const="csv", help="CSV with a header line"
    )
    query.set_defaults(form="table")

    tables = commands.add_parser("tables", help="list the tables a node serves")
    _connection_options(tables)

    shell = commands.add_parser(
        "shell",
        help="an interactive SQL shell against a node",
        description="Statements end with ';' and may span lines. Tab completes keywords, "
        "tables and columns; history is kept in $SPARKIQ_HISTORY (default "
        "~/.sparkiq/history). \\q or Ctrl-D leaves.",
    )
    _connection_options(shell)

    return parser


def _limits_epilog() -> str:
    """The limits groups of NodeConfig, set by variables only: one line per group."""
    groups = []
    for kind, group in ENV_GROUPS.values():
        names = ", ".join(f.name for f in dataclasses.fields(kind))
        groups.append(f"SPARKIQ_{group}_<NAME> ({kind.__name__}: {names})")
    return (
        "limits, set by variables only (docs/cluster.md), <NAME> in capitals (e.g. "
        "SPARKIQ_SQL_MAX_RESULT_ROWS=5000): " + "; ".join(groups)
    )


def _connection_options(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--url",
        default=_env("SPARKIQ_URL", "http://127.0.0.1:8081"),
        help="a node's URL [SPARKIQ_URL, default http://127.0.0.1:8081]",
    )
    command.add_argument(
        "--token",
        default=_env("SPARKIQ_TOKEN", None),
        help="the node's bearer token [SPARKIQ_TOKEN]",
    )
    command.add_argument(
        "--ca",
        default=_env("SPARKIQ_TLS_CA", None),
        help="PEM bundle to verify an https node's certificate with [SPARKIQ_TLS_CA, "
        "default: the system's authorities]",
    )


def _serve(args: argparse.Namespace) -> int:
    import gc
    import logging
    import signal
    import threading

    from sparkiq.errors import SparkiqError

    followed: list[str] = args.follow_topic or _env("SPARKIQ_FOLLOW_TOPIC", "").split(";")
    try:
        checkpoints = _checkpoints(args)
        topics: list[Any] = []
        if any(t.strip() for t in followed):  # the parser imports Kafka's client: a second
            from sparkiq.serving.topic import parse_topic_spec

            topics = [parse_topic_spec(t) for t in followed if t.strip()]
    except (ValueError, SparkiqError) as exc:
        print(f"sparkiq serve: {exc}", file=sys.stderr)
        return 2
    if not args.state_dir and not checkpoints and not topics:
        print(
            "sparkiq serve: --state-dir (or SPARKIQ_STATE_DIR) is required, or --checkpoint "
            "NAME=URI (or SPARKIQ_CHECKPOINT) to serve a Spark query's state, or "
            "--follow-topic (or SPARKIQ_FOLLOW_TOPIC) to serve a Kafka topic",
            file=sys.stderr,
        )
        return 2
    from sparkiq.node import Node  # a second of imports: after what a mistake is told by

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        given = {field: getattr(args, field) for field, *_ in _SERVE_OPTIONS if field in args}
        if "allowed_hosts" in args:
            given["allowed_hosts"] = args.allowed_hosts
        config = NodeConfig.resolve(
            # only checkpoints or topics: the state_dir holds nothing but this node's replicas
            args.state_dir or "sparkiq-serve",
            defaults={"listen": _SERVE_LISTEN, "node_id": None},
            **given,
        )
        node = Node(config=config, checkpoints=checkpoints, topics=topics).start()
    except SparkiqError as exc:
        print(f"sparkiq serve: {exc}", file=sys.stderr)
        return 2
    print(f"sparkiq node {node.node_id} serving {node.tables} at {node.url}", flush=True)
    if not node.tables:
        from sparkiq.server.served import no_tables_warning

        # the log is stderr (basicConfig above): one line, where the operator looks
        logging.getLogger("sparkiq.serve").warning("%s", no_tables_warning(config.state_dir))
    if node.pg_address is not None:
        print("Postgres wire protocol on {}:{}".format(*node.pg_address), flush=True)
    if node.flight_address is not None:
        scheme = "grpc+tls" if node.config.tls_cert else "grpc"
        print("Arrow Flight SQL on {}://{}:{}".format(scheme, *node.flight_address), flush=True)
    # What the start made lives as long as the process: frozen, full collections stop
    # walking it (116,000 objects, 70-90 ms with every request held: design.md).
    gc.freeze()
    try:
        stop.wait()
    finally:
        node.stop()
    return 0


def _checkpoints(args: argparse.Namespace) -> dict[str, str]:
    items = args.checkpoint or _env("SPARKIQ_CHECKPOINT", "").split(",")
    if not any(item.strip() for item in items):
        return {}  # none given: no need to import the SQL engine (a second of CPU)
    from sparkiq.serving.attach import checkpoint_items

    return checkpoint_items(items)


def _query(args: argparse.Namespace) -> int:
    from sparkiq.client import Client
    from sparkiq.output import ChangePrinter, Elapsed, print_rows
    from sparkiq.sql.statement import is_push_query

    with Client(args.url, token=args.token, ca=args.ca) as client:
        if is_push_query(args.sql):
            printer = ChangePrinter(sys.stdout, args.form)
            with _Failure("query", args) as failure, client.stream(args.sql) as changes:
                try:
                    for change in changes:
                        printer(change)
                except KeyboardInterrupt:
                    pass  # Ctrl-C ends a push query: it runs until then
            return failure.code
        with _Failure("query", args) as failure, Elapsed(sys.stderr, "running query"):
            answer = client.sql(args.sql)
        if failure.code:
            return failure.code
    print_rows(sys.stdout, answer.columns, answer.rows, args.form)
    print(f"-- {len(answer.rows)} rows at position {answer.position.to_token()}", file=sys.stderr)
    return 0


def _tables(args: argparse.Namespace) -> int:
    from sparkiq.client import Client
    from sparkiq.output import print_rows

    with (
        Client(args.url, token=args.token, ca=args.ca) as client,
        _Failure("tables", args) as failure,
    ):
        stores = client.stores()
    if failure.code:
        return failure.code
    rows = [
        {
            "table": s["name"],
            "key": ", ".join(s["key_columns"]),
            "window": s.get("window_column") or "",
            "partitions": s["partitions"],
        }
        for s in stores
    ]
    print_rows(sys.stdout, ["table", "key", "window", "partitions"], rows, "table")
    return 0


class _Failure:
    """``with _Failure(command, args) as failure:`` turns an error of a call to a node into
    one line on stderr and an exit code in ``failure.code`` (0 when the block succeeded): 2
    for what the user fixes by how they call (no node at --url, a token missing or wrong),
    1 for a refused query. No traceback either way."""

    def __init__(self, command: str, args: argparse.Namespace) -> None:
        self.code, self._command, self._args = 0, command, args

    def __enter__(self) -> _Failure:
        return self

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> bool:
        from sparkiq.errors import SparkiqError
        from sparkiq.output import failure_message

        if not isinstance(exc, SparkiqError):
            return False
        hint = failure_message(exc, self._args.url, self._args.token)
        self.code = 2 if hint else 1
        print(f"sparkiq {self._command}: {hint or exc}", file=sys.stderr)
        return True


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "demo":
        if not args.trigger > 0:
            print(
                f"sparkiq demo: --trigger (SPARKIQ_DEMO_TRIGGER) is {args.trigger:g}: give the "
                "seconds between micro-batches, more than 0 (default 1)",
                file=sys.stderr,
            )
            return 2
        from sparkiq.demo import run_demo  # a second of imports: after the check

        return run_demo(
            state_dir=args.state_dir,
            duration=args.duration,
            rate=args.rate,
            partitions=args.partitions,
            fresh=args.fresh,
            trigger=args.trigger,
            listen=args.listen,
        )
    if args.command == "status":
        from sparkiq.status_report import status_text, watch_status

        from_env = environment_value("local_dir")
        local_dirs = args.local_dir or (None if from_env is None else [from_env])
        from sparkiq.errors import SparkiqError

        try:
            checkpoints = _checkpoints(args)
            code, text = status_text(args.state_dir, local_dirs, checkpoints)
        except ValueError as exc:
            print(f"sparkiq status: {exc}", file=sys.stderr)
            return 2
        except SparkiqError as exc:  # a checkpoint that is none, or cannot be read
            print(f"sparkiq status: {exc.message}", file=sys.stderr)
            return 2
        if args.watch is not None:
            return watch_status(args.state_dir, local_dirs, args.watch, checkpoints)
        print(text, file=sys.stdout if code == 0 else sys.stderr)
        return code
    if args.command == "compact":
        return _compact(args.state_dir, args.table, args.retention)
    if args.command == "serve":
        return _serve(args)
    if args.command == "publish":
        from sparkiq.publish.command import publish_command

        return publish_command(args)
    if args.command == "query":
        return _query(args)
    if args.command == "tables":
        return _tables(args)
    if args.command == "shell":
        from sparkiq.shell import run_shell

        return run_shell(args.url, args.token, args.ca)
    return 2


def _compact(state_dir: str, tables: list[str] | None, retention: float | None) -> int:
    from sparkiq.changelog import list_tables
    from sparkiq.spark.maintenance import compact_table

    names = tables or list_tables(state_dir)
    if not names:
        print(f"no sparkiq tables in {state_dir!r}", file=sys.stderr)
        return 1
    for name in names:
        batch_id, rows, report = compact_table(state_dir, name, retention_seconds=retention)
        if batch_id < 0:
            print(f"{name}: nothing committed yet")
            continue
        print(
            f"{name}: snapshot at batch {batch_id}, {rows} rows" + (f"; {report}" if report else "")
        )
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
