"""The command line, run as a user runs it: a real subprocess on a real state_dir."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sparkiq import Node
from tests.changelog.helpers import make_table, write_batch


def sparkiq(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sparkiq.cli", *args], capture_output=True, text=True, timeout=60
    )


def test_status_and_compact(tmp_path: Path) -> None:
    changelog = make_table(str(tmp_path), partitions=3)
    for batch_id in range(12):
        write_batch(changelog, batch_id, {f"k{i}": batch_id * i for i in range(30)})
    with Node(str(tmp_path), node_id="n1") as node:
        assert node.wait_for("t", 11, timeout=10)
        node.write_status_file()

    status = sparkiq("status", "--state-dir", str(tmp_path))
    assert status.returncode == 0, status.stderr
    lines = status.stdout.splitlines()
    assert lines[1].split()[:6] == ["t", "3", "k", "0..11", "11", "-"]
    assert "node 'n1'" in status.stdout
    assert sum(" live " in line for line in lines) == 3

    compact = sparkiq("compact", "--state-dir", str(tmp_path), "--retention", "0")
    assert compact.returncode == 0, compact.stderr
    assert "t: snapshot at batch 11, 30 rows; retention deleted" in compact.stdout
    after = sparkiq("status", "--state-dir", str(tmp_path)).stdout.splitlines()
    assert after[1].split()[:6] == ["t", "3", "k", "11..11", "11", "11"]


def test_status_of_an_empty_directory_fails_clearly(tmp_path: Path) -> None:
    result = sparkiq("status", "--state-dir", str(tmp_path))
    assert result.returncode == 1
    assert "no sparkiq tables" in result.stderr


def test_every_option_names_its_environment_variable() -> None:
    for command in ("demo", "status", "compact", "serve"):
        text = sparkiq(command, "--help").stdout
        assert "--state-dir" in text and "SPARKIQ_STATE_DIR" in text
    serve = sparkiq("serve", "--help").stdout
    for name in ("NODE_ID", "LISTEN", "ADVERTISE", "PEERS", "STANDBYS", "TOKEN", "LOCAL_DIR"):
        assert f"SPARKIQ_{name}" in serve


def test_serve_takes_its_settings_from_the_environment(tmp_path: Path) -> None:
    import os
    import signal
    import time

    import httpx

    from tests.cluster.serve_processes import free_port

    changelog = make_table(str(tmp_path), partitions=2)
    write_batch(changelog, 0, {"a": 1, "b": 2})
    port = free_port()
    env = os.environ | {
        "SPARKIQ_STATE_DIR": str(tmp_path),
        "SPARKIQ_LISTEN": f"127.0.0.1:{port}",
        "SPARKIQ_NODE_ID": "from-env",
        "SPARKIQ_TOKEN": "tok",
        "SPARKIQ_STANDBYS": "0",
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "sparkiq.cli", "serve"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline and process.poll() is None
            time.sleep(0.1)
        assert httpx.get(f"{url}/healthz").json() == {"status": "ok", "node_id": "from-env"}
        assert httpx.get(f"{url}/stores/t/keys/a").status_code == 401
        auth = {"authorization": "Bearer tok"}
        assert httpx.get(f"{url}/stores/t/keys/a", headers=auth).json()["row"] == {"k": "a", "n": 1}
        process.send_signal(signal.SIGTERM)
        assert process.wait(15) == 0
        assert process.stdout is not None
        assert f"sparkiq node from-env serving ['t'] at {url}" in process.stdout.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_serve_without_a_state_dir_says_what_is_missing() -> None:
    result = sparkiq("serve", "--listen", "127.0.0.1:0")
    assert result.returncode == 2
    assert "--state-dir (or SPARKIQ_STATE_DIR) is required" in result.stderr


def test_query_prints_json_lines_from_a_node(tmp_path: Path) -> None:
    changelog = make_table(str(tmp_path), partitions=2)
    write_batch(changelog, 0, {"a": 1, "b": 2, "c": 3})
    with Node(str(tmp_path), node_id="q", listen="127.0.0.1:0", token="tok") as node:
        node.poll_once()
        assert node.url is not None
        ok = sparkiq(
            "query",
            "SELECT k, n FROM t WHERE n >= 2 ORDER BY k",
            "--url",
            node.url,
            "--token",
            "tok",
        )
        assert ok.returncode == 0, ok.stderr
        assert ok.stdout.splitlines() == ['{"k":"b","n":2}', '{"k":"c","n":3}']
        assert "2 rows at position p1." in ok.stderr
        bad = sparkiq("query", "SELECT nope FROM t", "--url", node.url, "--token", "tok")
        assert bad.returncode == 1
        assert "nope" in bad.stderr
        refused = sparkiq("query", "SELECT * FROM t", "--url", node.url)
        assert refused.returncode == 1 and "token" in refused.stderr
