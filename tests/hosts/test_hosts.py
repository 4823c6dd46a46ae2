"""A three-host cluster under client load from a fourth host, over TLS with node
credentials, with the network, a clock and a host failing; judged by the history checker of
tests/faults: 0 anomalies, no failure once the cluster settled.

One :class:`~tests.hosts.harness.HostCluster` serves the module (``make test-hosts``; not
part of ``make test``: starting three nodes and the faults take minutes). Unavailability is
reported, not bounded: on a loaded 2-core machine three TLS nodes, their clients and the
writer stall each other for seconds, and a bound scaled by that load says little; the bound
on the time without an answer is asserted by tests/faults, whose proxies cut the same paths.
Run ``pytest -s tests/hosts`` to see each fault's unavailability.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests import http_calls
from tests.faults.underload import under_load
from tests.hosts.harness import PORT, TOKEN, HostCluster

pytestmark = pytest.mark.hosts

#: What each fault cost in unavailability, printed at the end of the module (``-s``).
REPORT: list[str] = []


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostCluster]:
    with HostCluster(tmp_path_factory.mktemp("hosts")) as cluster:
        yield cluster
    print("\nunavailability per fault:\n  " + "\n  ".join(REPORT))


def test_each_node_is_on_its_own_host_and_speaks_tls(cluster: HostCluster) -> None:
    """Members know each other by their hosts' addresses, over https; a client that does
    not know the cluster's CA is refused the connection."""
    headers = {"authorization": f"Bearer {TOKEN}"}
    members = http_calls.get(
        f"{cluster.nodes[0].url}/metadata", headers=headers, verify=cluster.verify
    ).json()["nodes"]
    urls = sorted(m["url"] for m in members)
    assert urls == sorted(f"https://{h.address}:{PORT}" for h in cluster.hosts)
    assert len({h.address for h in [*cluster.hosts, cluster.client_host]}) == 4
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        http_calls.get(f"{cluster.nodes[1].url}/healthz")


def test_a_host_cut_off_both_ways(cluster: HostCluster) -> None:
    """Host n2's link down: its peers and the clients hear nothing from it; a client whose
    entry node is n2 asks another node after a delay learned from latency."""
    under_load(cluster, lambda: cluster.cut_link(2, hold=5.0), report=REPORT)


@pytest.mark.parametrize("direction", ["into", "out of"])
def test_a_host_losing_one_direction(cluster: HostCluster, direction: str) -> None:
    """Every packet into (or out of) host n2 lost, the other direction passing: at the
    TCP level every connection to and from n2 stalls (a handshake needs both ways), but
    what n2 sends still arrives, as SYNs and retransmissions."""
    fault = lambda: cluster.drop_link(2, direction, hold=5.0)  # noqa: E731
    under_load(cluster, fault, report=REPORT)


def test_a_clock_skewed_within_the_credentials_window(cluster: HostCluster) -> None:
    """Host n1's clock 200 s ahead: node credentials accept requests within 300 s
    (sparkiq.cluster.nodeauth.MAX_SKEW), so nothing changes for clients."""
    under_load(cluster, lambda: cluster.skew_clock(1, +200, hold=5.0), report=REPORT)


def test_a_clock_skewed_past_the_credentials_window(cluster: HostCluster) -> None:
    """Host n1's clock 400 s behind: every node-protocol request between n1 and the others
    is refused (its timestamp is out of the window), so they part ways as in a partition;
    reads stay correct, and n1 rejoins once its clock is right again."""
    log = cluster.nodes[0].log_path
    with open(log, errors="replace") as handle:
        before = len(handle.read())
    under_load(cluster, lambda: cluster.skew_clock(1, -400, hold=6.0), report=REPORT)
    with open(log, errors="replace") as handle:
        said = handle.read()[before:]
    assert re.search(r"off this node's clock .*synchronize the nodes' clocks", said), said[-2000:]


def test_a_host_restarted_with_its_local_state(cluster: HostCluster) -> None:
    """Every process on host n1 killed; its node, started again on the same host with the
    same --local-dir, reopens the replicas it had (each RocksDB keeps the identity it was
    created with) and resumes them from their batch: none is restored from a snapshot."""
    node = cluster.nodes[1]
    with open(node.log_path, errors="replace") as handle:
        before = len(handle.read())
    had = identities(cluster.root / "local-n1")
    assert had, "n1 had no replica before the restart"
    under_load(cluster, lambda: cluster.restart_host(1, hold=3.0), report=REPORT)
    assert identities(cluster.root / "local-n1") == had
    with open(node.log_path, errors="replace") as handle:
        said = handle.read()[before:]
    assert "sparkiq node n1 serving" in said  # the restarted process's log
    restored = re.findall(r"t\[(\d+)\]: restored .* from the snapshot", said)
    assert not restored, f"n1 restored partitions {restored} from snapshots"


def identities(local_dir: Path) -> dict[str, str]:
    """Partition directory -> the identity of the RocksDB database in it."""
    return {p.parent.name: p.read_text() for p in sorted(local_dir.glob("t/*/IDENTITY"))}
