"""A real Apache Kafka broker for tests, and Spark's Kafka connector jars (both public through
:mod:`sparkiq.testing`).

The jars come from Maven Central, pinned by the poms in a sparkiq checkout's ``jvm/`` and
copied by ``make jvm-jars`` into ``.jvm/``: ``.jvm/kafka-broker/`` (Kafka's server jar and its
runtime dependencies) and ``.jvm/spark-kafka/`` (``spark-sql-kafka-0-10`` and the Kafka
client). Nothing is downloaded here: a missing directory is an error saying how to fetch it.

:class:`KafkaBroker` runs one JVM, a single node that is both KRaft controller and broker, on
two free 127.0.0.1 ports, with its storage and log in a temporary directory, removed on exit
(kept, for its log, when the broker does not start); a test can stop and start it again on
the same ports and storage. :func:`kafka_broker` is the same broker as a plain ``with`` block
yielding its address. Importing this module starts nothing.
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path

from sparkiq.errors import ConfigError, SparkiqError

__all__ = [
    "JARS_ENV",
    "KAFKA_JVM_OPTIONS",
    "KafkaBroker",
    "kafka_broker",
    "kafka_jars_dir",
    "spark_kafka_jars",
    "stop_process_group",
]

#: The environment variable naming the directory that holds ``kafka-broker/`` and
#: ``spark-kafka/`` (what ``make jvm-jars`` fills), when no ``jars=`` argument is given.
JARS_ENV = "SPARKIQ_KAFKA_JARS"

#: The broker JVM's options: a small heap, and C1 only with the serial collector, like every
#: other JVM the tests start (tests/spark/short_jvm.py): a test broker lives minutes and
#: serves little, so C2 and a GC thread per core would only take CPU from the tests.
KAFKA_JVM_OPTIONS = (
    "-Xms64m",
    "-Xmx512m",
    "-XX:TieredStopAtLevel=1",
    "-XX:ReservedCodeCacheSize=240m",  # C1 alone would reserve 48 MB; a long run fills it
    "-XX:+UseSerialGC",
    "-Djava.awt.headless=true",
)

# The checkout this module runs from, for an editable install (src/sparkiq/testing/ -> the repo).
_CHECKOUT_JARS = Path(__file__).resolve().parents[3] / ".jvm"

_LOG4J2 = """\
status = error
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = {level}
rootLogger.appenderRef.out.ref = out
"""


def kafka_jars_dir(jars: str | os.PathLike[str] | None = None) -> Path:
    """The directory holding ``kafka-broker/`` and ``spark-kafka/``: ``jars``, else the
    ``SPARKIQ_KAFKA_JARS`` environment variable, else the ``.jvm/`` of the sparkiq checkout
    this package is installed from (``make jvm-jars`` fills it)."""
    chosen = jars if jars is not None else os.environ.get(JARS_ENV)
    return Path(chosen) if chosen else _CHECKOUT_JARS


def _module_jars(jars: str | os.PathLike[str] | None, module: str) -> list[Path]:
    root = kafka_jars_dir(jars)
    found = sorted((root / module).glob("*.jar"))
    if not found:
        raise ConfigError(
            f"no jars in {root / module}: run `make jvm-jars` in a sparkiq checkout (Maven "
            f"copies them from jvm/pom.xml into .jvm/), or point jars= or {JARS_ENV} at a "
            f"directory holding kafka-broker/ and spark-kafka/"
        )
    return found


def spark_kafka_jars(jars: str | os.PathLike[str] | None = None) -> list[str]:
    """The paths of Spark's Kafka connector and its dependencies (not Spark's own jars), for
    ``spark.jars``: ``spark_session(config={"spark.jars": ",".join(spark_kafka_jars())})``.

    ``spark.jars`` is read when the session's JVM starts, so set it on the first session of
    the process. Raises :class:`~sparkiq.errors.ConfigError` when the jars are missing."""
    return [str(path) for path in _module_jars(jars, "spark-kafka")]


class KafkaBroker:
    """A single-node Apache Kafka cluster in KRaft mode that a test can stop and start again,
    on the same ports with the same storage: ``with KafkaBroker() as broker:``.

    The node is controller and broker in one JVM (:data:`KAFKA_JVM_OPTIONS`; ``JAVA_HOME``'s
    ``java``, else the one on ``PATH``), with its storage formatted, once, in a new temporary
    directory (:attr:`workdir`). Internal topics have one replica, so consumer groups and
    transactions work; ``config`` adds or overrides broker settings (``{"num.partitions":
    "4"}``; the listeners are its own: :attr:`bootstrap_servers` is the address it chose).

    Entering the block formats the storage and starts the broker; it returns once the broker
    answers a metadata request listing itself. :meth:`stop` and :meth:`start` (or
    :meth:`restart`) take it down and bring it back with every topic, its data and offsets:
    clients see a broker that went away and came back at the same address. When a start does
    not succeed within ``timeout`` seconds (formatting included), or the JVM exits,
    :class:`~sparkiq.errors.SparkiqError` names its log file (:attr:`log_path`, kept with its
    directory) and quotes what the log says went wrong (its ERROR lines and their causes).
    When the block ends the broker is stopped and its directory removed, with the data of
    every topic. ``jars`` is the directory holding ``kafka-broker/`` (see
    :func:`kafka_jars_dir`); ``log_level`` is the level of the broker's log (``INFO`` shows
    its every step). One thread at a time may call its methods.
    """

    def __init__(
        self,
        *,
        jars: str | os.PathLike[str] | None = None,
        config: Mapping[str, str] | None = None,
        timeout: float = 120.0,
        log_level: str = "WARN",
    ) -> None:
        self._classpath = os.pathsep.join(str(p) for p in _module_jars(jars, "kafka-broker"))
        self._java = _java()
        self._config = dict(config or {})
        self._timeout = timeout
        self._log_level = log_level
        self._process: subprocess.Popen[bytes] | None = None
        self._port = 0
        self._workdir: Path | None = None
        self._failed = False  # a start failed: the directory stays, for the log it names

    @property
    def bootstrap_servers(self) -> str:
        """``127.0.0.1:<port>``, the same across restarts."""
        if not self._port:
            raise SparkiqError("the Kafka broker has not been started: use it in a with block")
        return f"127.0.0.1:{self._port}"

    @property
    def workdir(self) -> Path:
        """The broker's directory: its settings, its storage (``data/``) and its log."""
        if self._workdir is None:
            raise SparkiqError("the Kafka broker has not been started: use it in a with block")
        return self._workdir

    @property
    def log_path(self) -> Path:
        """The broker's log (``kafka.log`` in :attr:`workdir`), appended to by each start."""
        return self.workdir / "kafka.log"

    @property
    def running(self) -> bool:
        """Whether the broker's JVM is running (started and neither stopped nor exited)."""
        return self._process is not None and self._process.poll() is None

    def __enter__(self) -> KafkaBroker:
        deadline = time.monotonic() + self._timeout
        self._workdir = Path(tempfile.mkdtemp(prefix="sparkiq-kafka-"))
        try:
            self._port, controller_port = _free_ports(2)
            settings = _settings(self._workdir, self._port, controller_port, self._config)
            self._properties.write_text("".join(f"{k}={v}\n" for k, v in settings))
            (self._workdir / "log4j2.properties").write_text(_LOG4J2.format(level=self._log_level))
            self._format(deadline)
            self._launch(deadline)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def stop(self, *, kill: bool = False) -> None:
        """Stop the broker, keeping its storage: a clean shutdown (SIGTERM, then SIGKILL
        after 30 s), or with ``kill`` an abrupt one (SIGKILL: the next start recovers its
        logs as after a crash). Does nothing when it is not running."""
        process, self._process = self._process, None
        if process is None:
            return
        if kill and process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        else:
            stop_process_group(process)

    def start(self) -> None:
        """Start the stopped broker again, on the same ports and storage; returns once it
        serves (within ``timeout`` seconds, else :class:`~sparkiq.errors.SparkiqError`
        naming its log). Does nothing when it is running."""
        if self.running:
            return
        if not self._port:
            raise SparkiqError("the Kafka broker was never started: use it in a with block")
        self._launch(time.monotonic() + self._timeout)

    def restart(self, *, kill: bool = False) -> None:
        """:meth:`stop` (abruptly with ``kill``), then :meth:`start`."""
        self.stop(kill=kill)
        self.start()

    def close(self) -> None:
        """Stop the broker and remove its directory, unless a start failed (its log is
        named by the error). Idempotent; the block's end calls it."""
        self.stop()
        if self._workdir is not None and not self._failed:
            shutil.rmtree(self._workdir, ignore_errors=True)

    @property
    def _properties(self) -> Path:
        return self.workdir / "server.properties"

    def _command(self) -> list[str]:
        return [
            self._java,
            *KAFKA_JVM_OPTIONS,
            f"-Dlog4j2.configurationFile={self.workdir / 'log4j2.properties'}",
            "-cp",
            self._classpath,
        ]

    def _format(self, deadline: float) -> None:
        storage_tool = [*self._command(), "kafka.tools.StorageTool", "format"]
        with open(self.log_path, "ab") as log_file:
            formatter = subprocess.Popen(
                [*storage_tool, "--cluster-id", _cluster_id(), "--config", str(self._properties)],
                cwd=self.workdir,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
            )
        code = _wait_for_exit(formatter, deadline)
        if code != 0:
            self._failed = True
            state = f"exit code {code}" if code is not None else f"not done in {self._timeout} s"
            raise SparkiqError(
                f"formatting the Kafka broker's storage failed ({state}); its log is "
                f"{self.log_path}:\n{_tail(self.log_path)}"
            )

    def _launch(self, deadline: float) -> None:
        with open(self.log_path, "ab") as log_file:
            self._process = subprocess.Popen(
                [*self._command(), "kafka.Kafka", str(self._properties)],
                cwd=self.workdir,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stopped with all it runs
            )
        try:
            _wait_until_serving(self._process, self._port, deadline, self._timeout, self.log_path)
        except SparkiqError:
            self._failed = True
            raise


@contextlib.contextmanager
def kafka_broker(
    *,
    jars: str | os.PathLike[str] | None = None,
    config: Mapping[str, str] | None = None,
    timeout: float = 120.0,
    log_level: str = "WARN",
) -> Iterator[str]:
    """Run a single-node Apache Kafka cluster in KRaft mode for the block; yields its
    ``bootstrap_servers``, ``127.0.0.1:<port>``.

    A :class:`KafkaBroker` (same arguments) that the block cannot stop: the broker answers
    once the block starts, and is stopped and its directory removed when the block ends.
    When it does not start, :class:`~sparkiq.errors.SparkiqError` names its kept log file and
    quotes what went wrong. Use :class:`KafkaBroker` to stop and restart it mid-test.
    """
    with KafkaBroker(jars=jars, config=config, timeout=timeout, log_level=log_level) as broker:
        yield broker.bootstrap_servers


def _settings(
    workdir: Path, port: int, controller_port: int, config: Mapping[str, str] | None
) -> Iterator[tuple[str, str]]:
    settings = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(workdir / "data"),
        # one broker: every internal topic has one replica
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "4",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
    }
    settings.update({str(k): str(v) for k, v in (config or {}).items()})
    yield from settings.items()


def _wait_for_exit(process: subprocess.Popen[bytes], deadline: float) -> int | None:
    """The process's exit code, or None (after killing it) when it runs past ``deadline``."""
    try:
        return process.wait(max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        return None


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and os.access(os.path.join(home, "bin", "java"), os.X_OK):
        return os.path.join(home, "bin", "java")
    found = shutil.which("java")
    if found is None:
        raise ConfigError("no java: install Java 17 or later, or set JAVA_HOME")
    return found


def _free_ports(count: int) -> list[int]:
    """Ports free now (the broker takes them moments later), all distinct."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for probe in sockets:
            probe.bind(("127.0.0.1", 0))
        return [probe.getsockname()[1] for probe in sockets]
    finally:
        for probe in sockets:
            probe.close()


def _cluster_id() -> str:
    """A Kafka cluster id: 16 random bytes in URL-safe base64 without padding, not starting
    with ``-`` (as Kafka's ``Uuid.randomUuid`` makes them)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not text.startswith("-"):
            return text


def _tail(path: Path, size: int = 3000) -> str:
    """What the log says went wrong: its ERROR lines and the causes and exception lines of
    their stack traces (the last 20), else its last ``size`` characters."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as error:
        return f"(unreadable: {error})"
    said = [line[:400] for line in text.splitlines() if _WHAT_WENT_WRONG.search(line)]
    return "\n".join(said[-20:]) if said else text[-size:]


_WHAT_WENT_WRONG = re.compile(r"\] (ERROR|FATAL) |^Caused by: |^Exception in thread ")


def _wait_until_serving(
    process: subprocess.Popen[bytes], port: int, deadline: float, timeout: float, log_path: Path
) -> None:
    while True:
        if _metadata_lists_a_broker(port):
            return
        if process.poll() is not None or time.monotonic() > deadline:
            code = process.poll()
            state = f"exited with code {code}" if code is not None else f"not up in {timeout} s"
            raise SparkiqError(
                f"the Kafka broker did not start ({state}); its log is "
                f"{log_path}:\n{_tail(log_path)}"
            )
        time.sleep(0.2)


def _metadata_lists_a_broker(port: int) -> bool:
    """Whether the broker answers a Metadata request (v4: no topics asked) with a broker list
    that is not empty; any error or short answer means not yet."""
    client_id = b"sparkiq-probe"
    # request header v1 (api key 3, version 4, correlation id, client id), then the body:
    # topics = empty array (brokers only), allow_auto_topic_creation = false
    request = struct.pack(">hhih", 3, 4, 1, len(client_id)) + client_id
    request += struct.pack(">i?", 0, False)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as conn:
            conn.sendall(struct.pack(">i", len(request)) + request)
            size = struct.unpack(">i", _read_exactly(conn, 4))[0]
            body = _read_exactly(conn, size)
    except (OSError, struct.error):
        return False
    # response: correlation id, throttle_time_ms, then the brokers array's length
    if len(body) < 12:
        return False
    correlation, _throttle, brokers = struct.unpack(">iii", body[:12])
    return bool(correlation == 1 and brokers > 0)


def _read_exactly(conn: socket.socket, size: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = conn.recv(size - len(chunks))
        if not chunk:
            raise OSError("connection closed")
        chunks += chunk
    return bytes(chunks)


def stop_process_group(process: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    """Stop a JVM started in its own process group (``start_new_session``) with everything
    it started: SIGTERM, then SIGKILL after ``timeout`` seconds."""
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
