"""A cluster on separate hosts: each node in a network namespace of its own, clients on a
fourth, TLS and node credentials, and faults of the network, the clock and the host.

:class:`HostCluster` is a :class:`~tests.faults.harness.FaultCluster` (the writer, the
model's table, the checker's verdict, ``inject``, ``settle``, ``kill_node``) whose nodes,
instead of sitting behind TCP proxies on 127.0.0.1, run on the hosts of a
:class:`~tests.hosts.netns.Network`:

- host ``n<i>`` (``10.77.N.(i + 2)``) runs node ``n<i>`` with ``ip netns exec``, listening on
  its own address and port :data:`PORT` (the same port on every host, as on real machines),
  advertising ``https://<its address>:PORT``, with a certificate for that address from a CA
  made at test time (trustme), the clients' token and the cluster secret (node credentials);
- host ``clients`` runs the recorded client sessions (:mod:`tests.hosts.clients`), which
  reach the nodes over the bridge, verifying their certificates;
- the root namespace runs the writer (it writes files only) and this test process, which
  waits on the nodes over the bridge too. The ``state_dir`` is on the filesystem every
  namespace shares: it plays the shared storage (an object store or NFS between machines).

Faults: :meth:`HostCluster.cut_link` (a host's link down, both ways),
:meth:`HostCluster.drop_link` (one direction lost), :meth:`HostCluster.skew_clock` (a host's
wall clock stepped, see below) and :meth:`HostCluster.restart_host` (every process of a host
killed, its node started again on the same host with the same ``--local-dir``).

A network namespace has no wall clock of its own (Linux's time namespaces offset only the
monotonic and boot clocks) and sparkiq has no clock-offset setting, so the node of host
``clock_host`` runs with libfaketime preloaded (the ``libfaketime`` wheel ships the
library): its wall clock is the machine's plus the offset written in the host's clock file,
read again every second, while its monotonic clock stays the machine's. (Only that node:
libfaketime doubles a node's CPU time, every clock read going through it.) That is what a
host whose clock is stepped (a wrong NTP server, a VM resumed) looks like to the process.
"""

from __future__ import annotations

import os
import signal
import ssl
from pathlib import Path

import trustme

from tests.cluster.serve_processes import ServeProcess
from tests.faults.checker import Fault
from tests.faults.harness import REPO, STARTUP, FaultCluster
from tests.faults.history import Op
from tests.hosts.clients import RemoteSessions
from tests.hosts.netns import Host, Network

PORT = 7443
#: Heartbeats and failure timeout (after FAST_FLAGS, so these count): three TLS nodes, their
#: clients and the writer on two shared cores stall each other for 2-3 s at times, which
#: the fault harness's 1.5 s timeout takes for failures, over and over; every fault here
#: holds longer than 4 s.
TIMINGS = ["--heartbeat-interval", "0.5", "--failure-timeout", "4"]
TOKEN = "hosts-clients-token"
SECRET = "hosts-cluster-secret-of-the-nodes"


def faketime_library() -> str:
    """The libfaketime shared library the ``libfaketime`` package ships."""
    import libfaketime  # a dev dependency; imported here, where a node is started with it

    path = Path(libfaketime.__file__).parent / "vendor" / "libfaketime" / "src"
    library = path / "libfaketime.so.1"
    if not library.is_file():
        raise RuntimeError(
            f"no {library}: the libfaketime package changed its layout; "
            "look for libfaketime.so.1 in it and update tests/hosts/harness.py"
        )
    return str(library)


class HostCluster(FaultCluster):
    def __init__(self, root: Path, nodes: int = 3, *, clock_host: int = 1, seed: int = 1) -> None:
        # A batch every 0.2 s (the soak's rate): at 0.1 s, three nodes applying every
        # partition on two cores shared with other work fell behind the writer for minutes.
        super().__init__(root, nodes, writer_interval=0.2, seed=seed)
        self.clock_host = clock_host  # the host whose clock :meth:`skew_clock` can step
        self.network: Network | None = None
        self.hosts: list[Host] = []
        self.client_host: Host | None = None
        self.clients: RemoteSessions | None = None
        self.token = TOKEN
        self.ca_path = str(root / "ca.pem")
        # The nodes run this worktree's sparkiq, and the clients process its tests package.
        self.pythonpath = os.pathsep.join([str(Path(REPO) / "src"), REPO])

    def start(self) -> HostCluster:
        try:
            super().start()
        except BaseException:
            self.close()
            raise
        return self

    def start_nodes(self) -> None:
        self.network = Network()
        self.hosts = [self.network.add_host(f"n{i}") for i in range(self.count)]
        self.client_host = self.network.add_host("clients")
        ca = trustme.CA()
        ca.cert_pem.write_to_path(self.ca_path)
        self.verify = ssl.create_default_context(cafile=self.ca_path)
        preload = faketime_library()
        seed = f"{self.hosts[0].address}:{PORT}"
        for i, host in enumerate(self.hosts):
            node_id = f"n{i}"
            cert, key = self.root / f"{node_id}.crt", self.root / f"{node_id}.key"
            issued = ca.issue_cert(host.address)
            issued.cert_chain_pems[0].write_to_path(str(cert))
            issued.private_key_pem.write_to_path(str(key))
            self.clock(i).write_text("+0\n")
            local_dir = self.root / f"local-{node_id}"
            local_dir.mkdir()
            extra = [
                "--advertise", f"https://{host.address}:{PORT}",
                "--local-dir", str(local_dir),
                "--tls-cert", str(cert), "--tls-key", str(key), "--tls-ca", self.ca_path,
                "--token", TOKEN,
                *TIMINGS,
            ]  # fmt: skip
            env = {"SPARKIQ_CLUSTER_SECRET": SECRET, "PYTHONPATH": self.pythonpath}
            if i == self.clock_host:  # libfaketime costs a node twice the CPU: only here
                env |= {
                    "LD_PRELOAD": preload,
                    "FAKETIME_TIMESTAMP_FILE": str(self.clock(i)),
                    "FAKETIME_CACHE_DURATION": "1",  # the file is read again every second
                    "FAKETIME_DONT_FAKE_MONOTONIC": "1",
                }
            peers = [seed] if i else []
            self.nodes.append(
                ServeProcess(self.state_dir, node_id, PORT, peers, str(self.root), extra=extra,
                             host=host.address, prefix=host.prefix, verify=self.verify, **env)
            )  # fmt: skip
        for node in self.nodes:
            node.start()
        for node in self.nodes:
            node.wait_up(timeout=STARTUP)
        self.wait_whole(STARTUP)

    def clock(self, i: int) -> Path:
        """Host ``i``'s clock file: the offset of its wall clock ("+0", "-400", ...)."""
        return self.root / f"clock-n{i}"

    # -- clients on their own host -----------------------------------------------------------

    def start_load(self) -> None:
        assert self.client_host is not None
        urls = [n.url for n in self.nodes]
        self.sessions += 1
        sessions = []
        for i in range(self.loader_count):
            mine = urls[i % self.count]
            sessions.append({
                "name": f"s{self.sessions}c{i}",
                "seed": self.seed * 1000 + self.sessions * 10 + i,
                "urls": [mine, *(u for u in urls if u != mine)],
            })  # fmt: skip
        self.clients = RemoteSessions(
            self.root / f"ops-{self.sessions}.jsonl",
            sessions,
            prefix=self.client_host.prefix,
            cwd=REPO,
            env={"PYTHONPATH": self.pythonpath},
            token=TOKEN,
            ca=self.ca_path,
            pause=self.load_pause,
        )
        self.loaders = list(self.clients.sessions.values())  # type: ignore[arg-type]

    def stop_load(self) -> list[Op]:
        assert self.clients is not None
        return self.clients.stop()

    def close(self) -> None:
        try:
            if self.clients is not None:
                self.clients.kill()
            self.loaders = []  # they were the clients process's sessions
            super().close()
        finally:
            if self.network is not None:
                self.network.close()

    # -- faults ------------------------------------------------------------------------------

    def cut_link(self, i: int, hold: float = 5.0) -> Fault:
        """Host ``i``'s link down: nothing passes, either way, for ``hold`` seconds."""
        host = self.hosts[i]
        return self.inject(f"link of {host.name} down", host.cut, host.heal, hold)

    def drop_link(self, i: int, direction: str, hold: float = 5.0) -> Fault:
        """Packets ``"into"`` host ``i``, or ``"out of"`` it, lost for ``hold`` seconds."""
        host = self.hosts[i]
        return self.inject(
            f"packets {direction} {host.name} dropped",
            lambda: host.drop(direction),
            host.heal,
            hold,
        )

    def skew_clock(self, i: int, seconds: int, hold: float = 5.0) -> Fault:
        """Host ``i``'s wall clock stepped by ``seconds`` for ``hold`` seconds, then back."""
        if i != self.clock_host:
            raise ValueError(f"only host n{self.clock_host}'s clock can be stepped, not n{i}'s")
        clock = self.clock(i)
        return self.inject(
            f"clock of n{i} {seconds:+d} s",
            lambda: clock.write_text(f"{seconds:+d}\n"),
            lambda: clock.write_text("+0\n"),
            hold,
        )

    def restart_host(self, i: int, hold: float = 3.0) -> Fault:
        """Every process of host ``i`` killed (SIGKILL), then its node started again there
        with the same local directory."""
        host, node = self.hosts[i], self.nodes[i]

        def kill_all() -> None:
            assert node.process is not None
            pids = host.pids()
            assert node.process.pid in pids, f"{node.node_id} is not on {host.name}: {pids}"
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            node.process.wait()

        return self.inject(f"host {host.name} restarted", kill_all, lambda: self._restart(i), hold)
