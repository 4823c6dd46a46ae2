"""TLS on a node's HTTP listener and between nodes: clients verify the nodes, nodes verify
each other, and a renewed certificate is served without a restart. Certificates come from a
CA made at test time (trustme)."""

from __future__ import annotations

import json
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trustme

from sparkiq import Client, ConfigError, KeyQuery, Node, StateQueryRequest
from sparkiq.tls import TlsContexts, TlsFiles
from tests import http_calls
from tests.changelog.helpers import make_table, write_batch
from tests.cluster.cluster_helpers import FAST, settle

TOKEN = "clients-token"
SECRET = "the-nodes-own-secret"
ROWS = {f"k{i}": i for i in range(24)}


def issue(ca: trustme.CA, where: Path, name: str) -> dict[str, str]:
    """A certificate for 127.0.0.1 signed by ``ca``, written as the node's TLS files."""
    cert = ca.issue_cert("127.0.0.1", "localhost")
    paths = {"tls_cert": where / f"{name}.crt", "tls_key": where / f"{name}.key"}
    cert.cert_chain_pems[0].write_to_path(str(paths["tls_cert"]))
    cert.private_key_pem.write_to_path(str(paths["tls_key"]))
    ca_path = where / f"{name}-ca.pem"
    ca.cert_pem.write_to_path(str(ca_path))
    return {k: str(v) for k, v in paths.items()} | {"tls_ca": str(ca_path)}


@pytest.fixture(scope="module")
def authority() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, authority: trustme.CA
) -> Iterator[tuple[list[Node], str, Path]]:
    where = tmp_path_factory.mktemp("tls")
    state_dir = str(where / "state")
    write_batch(make_table(state_dir, partitions=4), 0, ROWS)
    settings: dict[str, Any] = FAST | {"token": TOKEN, "cluster_secret": SECRET, "standbys": 0}
    n0 = Node(
        state_dir, node_id="n0", listen="127.0.0.1:0", peers=[], **settings,
        **issue(authority, where, "n0"),
    ).start()  # fmt: skip
    n1 = Node(
        state_dir, node_id="n1", listen="127.0.0.1:0", peers=[n0.url or ""], **settings,
        **issue(authority, where, "n1"),
    ).start()  # fmt: skip
    settle([n0, n1])
    yield [n0, n1], str(where / "n0-ca.pem"), where
    n1.stop()
    n0.stop()


def test_nodes_serve_https_and_route_to_each_other_over_it(
    cluster: tuple[list[Node], str, Path],
) -> None:
    nodes, ca, _ = cluster
    assert all((n.url or "").startswith("https://127.0.0.1:") for n in nodes)
    with Client([n.url or "" for n in nodes], token=TOKEN, ca=ca) as client:
        for key, n in ROWS.items():
            assert client.get("t", key) == {"k": key, "n": n}
        rows = client.sql("SELECT k, n FROM t").rows
        assert sorted((row["k"], row["n"]) for row in rows) == sorted(ROWS.items())
    for node in nodes:  # every key read through each node: half of them routed over TLS
        for key, n in ROWS.items():
            request = StateQueryRequest.in_store("t").with_query(KeyQuery.with_key(key))
            assert node.query(request).only_partition_result().result["n"] == n
    headers = {"authorization": f"Bearer {TOKEN}"}
    verify = ssl.create_default_context(cafile=ca)
    answer = http_calls.get(f"{nodes[0].url}/stores/t/keys/k3", headers=headers, verify=verify)
    assert answer.json()["row"] == {"k": "k3", "n": 3}


def test_a_client_without_the_ca_or_without_tls_gets_nothing(
    cluster: tuple[list[Node], str, Path],
) -> None:
    nodes, _, _ = cluster
    url = nodes[0].url or ""
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        http_calls.get(f"{url}/healthz")  # the system's authorities do not know the test CA
    plain = url.replace("https://", "http://")
    with pytest.raises(httpx.HTTPError):
        http_calls.get(f"{plain}/stores/t/keys/k3", headers={"authorization": f"Bearer {TOKEN}"})


def test_a_node_that_does_not_trust_the_cluster_ca_never_joins(
    cluster: tuple[list[Node], str, Path],
) -> None:
    """A node whose authorities do not include the one that signed the members' certificates
    cannot verify them, so it never exchanges a heartbeat with them (nor they with it)."""
    nodes, _, where = cluster
    other = issue(trustme.CA(), where, "stranger")
    state_dir = str(where / "state")
    stranger = Node(
        state_dir, node_id="n9", listen="127.0.0.1:0", peers=[nodes[0].url or ""],
        **(FAST | {"token": TOKEN, "cluster_secret": SECRET}), **other,
    ).start()  # fmt: skip
    try:
        time.sleep(20 * FAST["heartbeat_interval"])
        assert stranger.coordinator is not None
        assert stranger.coordinator.membership.live() == ("n9",)
        for node in nodes:
            assert node.coordinator is not None
            assert "n9" not in node.coordinator.membership.members()
    finally:
        stranger.stop()


def test_a_renewed_certificate_is_served_without_a_restart(
    tmp_path: Path, authority: trustme.CA
) -> None:
    files = issue(authority, tmp_path, "node")
    state_dir = str(tmp_path / "state")
    write_batch(make_table(state_dir, partitions=2), 0, ROWS)
    node = Node(state_dir, node_id="n0", listen="127.0.0.1:0", **files).start()
    try:
        address = ("127.0.0.1", int((node.url or "").rsplit(":", 1)[1]))
        first = ssl.get_server_certificate(address)
        assert first == Path(files["tls_cert"]).read_text()
        assert node._tls is not None
        Path(files["tls_cert"]).write_text("-----BEGIN CERTIFICATE-----\ntorn")  # mid-copy
        assert not node._tls.reload_if_changed()
        assert ssl.get_server_certificate(address) == first  # the old one stays in use
        renewed = issue(authority, tmp_path, "node")  # writes both files anew
        assert node._tls.reload_if_changed()
        second = ssl.get_server_certificate(address)
        assert second == Path(renewed["tls_cert"]).read_text() != first
        verify = ssl.create_default_context(cafile=files["tls_ca"])
        answer = http_calls.get(f"{node.url}/stores/t/keys/k5", verify=verify)
        assert answer.json()["row"] == {"k": "k5", "n": 5}
    finally:
        node.stop()


def test_the_watcher_reloads_changed_files_by_itself(tmp_path: Path, authority: trustme.CA) -> None:
    files = issue(authority, tmp_path, "node")
    contexts = TlsContexts(
        TlsFiles(files["tls_cert"], files["tls_key"], files["tls_ca"]), reload_every=0.05
    ).start()
    try:
        before = contexts.server()
        issue(authority, tmp_path, "node")
        deadline = time.monotonic() + 30
        while contexts.server() is before:
            assert time.monotonic() < deadline, "the watcher never reloaded the files"
            time.sleep(0.05)
    finally:
        contexts.stop()


def test_tls_settings_are_checked(tmp_path: Path, authority: trustme.CA) -> None:
    files = issue(authority, tmp_path, "node")
    state_dir = str(tmp_path / "state")
    make_table(state_dir)
    with pytest.raises(ConfigError, match="TLS needs both tls_cert and tls_key"):
        Node(state_dir, listen="127.0.0.1:0", tls_cert=files["tls_cert"])
    missing = Node(
        state_dir, listen="127.0.0.1:0", tls_cert=str(tmp_path / "nope.crt"),
        tls_key=files["tls_key"],
    )  # fmt: skip
    with pytest.raises(ConfigError, match=r"cannot load TLS files.*nope\.crt"):
        missing.start()
    missing.stop()


def test_the_command_line_verifies_nodes_and_says_what_to_fix(
    cluster: tuple[list[Node], str, Path],
) -> None:
    nodes, ca, _ = cluster
    url = nodes[1].url or ""

    def sparkiq(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "sparkiq.cli", "query", "SELECT count(*) AS c FROM t"]
        return subprocess.run(
            [*command, "--token", TOKEN, *args], capture_output=True, text=True, timeout=120
        )

    verified = sparkiq("--url", url, "--ca", ca, "--json")
    assert verified.returncode == 0, verified.stderr
    assert json.loads(verified.stdout) == {"c": len(ROWS)}
    unverified = sparkiq("--url", url)
    assert unverified.returncode == 2
    assert "could not be verified: pass the CA that signed it with --ca" in unverified.stderr
    plain = sparkiq("--url", url.replace("https://", "http://"))
    assert plain.returncode == 2
    assert "needs an https:// URL" in plain.stderr
