"""The command line, run as a user runs it: a real subprocess on a real state_dir."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sparkiq import Node
from tests import http_calls
from tests.changelog.helpers import make_table, write_batch
from tests.cli.processes import start_cli
from tests.cluster.cluster_helpers import wait_until


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
    assert sum(" stopped " in line for line in lines) == 3  # the node has closed

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
    assert "--allowed-host" in serve and "SPARKIQ_ALLOWED_HOSTS" in serve
    # the limits groups have no flags: their variables are listed after the flags
    assert "SPARKIQ_SQL_MAX_RESULT_ROWS" in serve
    for group, field in (("SQL", "fragment_min_rows"), ("HTTP", "max_header_bytes")):
        assert f"SPARKIQ_{group}_<NAME>" in serve and field in serve
    for group, field in (("PG", "max_numeric_digits"), ("AUTH", "forget_seconds")):
        assert f"SPARKIQ_{group}_<NAME>" in serve and field in serve


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
                if http_calls.get(f"{url}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline and process.poll() is None
            time.sleep(0.1)
        assert http_calls.get(f"{url}/healthz").json() == {"status": "ok", "node_id": "from-env"}
        assert http_calls.get(f"{url}/stores/t/keys/a").status_code == 401
        auth = {"authorization": "Bearer tok"}
        assert http_calls.get(f"{url}/stores/t/keys/a", headers=auth).json()["row"] == {
            "k": "a",
            "n": 1,
        }
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


def test_demo_refuses_a_trigger_of_no_time(tmp_path: Path) -> None:
    result = sparkiq("demo", "--trigger", "0", "--state-dir", str(tmp_path / "demo"))
    assert result.returncode == 2
    assert result.stderr == (
        "sparkiq demo: --trigger (SPARKIQ_DEMO_TRIGGER) is 0: give the seconds between "
        "micro-batches, more than 0 (default 1)\n"
    )
    assert not (tmp_path / "demo").exists()  # refused before anything started


def test_query_prints_json_lines_from_a_node(tmp_path: Path) -> None:
    changelog = make_table(str(tmp_path), partitions=2)
    write_batch(changelog, 0, {"a": 1, "b": 2, "c": 3})
    with Node(str(tmp_path), node_id="q", listen="127.0.0.1:0", token="tok") as node:
        node.poll_once()
        assert node.url is not None
        ok = sparkiq(
            "query",
            "SELECT k, n FROM t WHERE n >= 2 ORDER BY k",
            "--json",
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
        # the API's caret snippet, under the unknown column
        assert "SELECT nope FROM t\n       ^" in bad.stderr
        assert "Traceback" not in bad.stderr
        refused = sparkiq("query", "SELECT * FROM t", "--url", node.url)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr
        assert refused.stderr == (
            "sparkiq query: the node needs a token: pass --token or SPARKIQ_TOKEN\n"
        )
        wrong = sparkiq("query", "SELECT * FROM t", "--url", node.url, "--token", "nope")
        assert wrong.returncode == 2
        assert "refused the token: check --token or SPARKIQ_TOKEN" in wrong.stderr


def test_query_prints_a_table_by_default_and_csv_for_scripts(tmp_path: Path) -> None:
    changelog = make_table(str(tmp_path), partitions=2)
    write_batch(changelog, 0, {"a": 1, "b": 22, "c,d": 333})
    with Node(str(tmp_path), node_id="q", listen="127.0.0.1:0") as node:
        node.poll_once()
        assert node.url is not None
        table = sparkiq("query", "SELECT k, n FROM t ORDER BY k", "--url", node.url)
        assert table.returncode == 0, table.stderr
        cells = [
            [cell.strip() for cell in line.strip("│┃").split("│")]
            for line in table.stdout.splitlines()
            if line.startswith("│")
        ]
        assert cells == [["a", "1"], ["b", "22"], ["c,d", "333"]]
        assert "┃ k   ┃   n ┃" in table.stdout  # numbers are right-aligned
        assert "3 rows at position p1." in table.stderr

        csv = sparkiq("query", "SELECT k, n FROM t ORDER BY k", "--csv", "--url", node.url)
        assert csv.returncode == 0, csv.stderr
        assert csv.stdout.splitlines() == ["k,n", "a,1", "b,22", '"c,d",333']

        both = sparkiq("query", "SELECT 1", "--csv", "--json", "--url", node.url)
        assert both.returncode == 2 and "not allowed with argument" in both.stderr


def test_query_streams_a_push_query_as_changes_arrive(tmp_path: Path) -> None:
    changelog = make_table(str(tmp_path), partitions=2)
    write_batch(changelog, 0, {"a": 1})
    with Node(str(tmp_path), node_id="q", listen="127.0.0.1:0", poll_interval=0.05) as node:
        node.poll_once()
        assert node.url is not None
        for form, expected in (
            ("--csv", ["batch,k,n", "1,b,2", "2,b deleted"]),
            ("--json", ['{"key":"c","row":{"k":"c","n":3},"batch_id":3,"position":"p1.']),
        ):
            command = ["query", form, "--url", node.url, "SELECT k, n FROM t EMIT CHANGES"]
            # The batches commit once this CLI's subscription is open (its start-up alone takes
            # seconds on a loaded machine); the previous one closes when its client leaves.
            # Deadlines are hang bounds, not speed targets.
            wait_until(lambda: not node.subscriptions().get("t"), 120, "a subscription stays open")
            process = start_cli(command)
            try:
                wait_until(
                    lambda cli=process: cli.poll() is None and node.subscriptions().get("t") == 1,
                    120,
                    "the push query never subscribed",
                )
                if form == "--csv":
                    write_batch(changelog, 1, {"b": 2})
                    write_batch(changelog, 2, {"b": None})
                else:
                    write_batch(changelog, 3, {"c": 3})
                assert process.stdout is not None
                lines = [process.stdout.readline().rstrip("\n") for _ in expected]
                # printed while the stream is still open: nothing waits for its end
                assert process.poll() is None
            finally:
                process.terminate()
                process.wait(10)
            if form == "--csv":
                assert lines == expected
            else:
                assert lines[0].startswith(expected[0])
                assert lines[0].endswith(',"snapshot":false}')


def test_tables_lists_the_tables_of_a_node(tmp_path: Path) -> None:
    changelog = make_table(str(tmp_path), partitions=3)
    write_batch(changelog, 0, {"a": 1})
    with Node(str(tmp_path), node_id="q", listen="127.0.0.1:0") as node:
        node.poll_once()
        assert node.url is not None
        result = sparkiq("tables", "--url", node.url)
    assert result.returncode == 0, result.stderr
    rows = [
        [cell.strip() for cell in line.strip("│").split("│")]
        for line in result.stdout.splitlines()
        if line.startswith("│")
    ]
    assert rows == [["t", "k", "", "3"]]


def test_an_unreachable_node_gets_a_hint_not_a_traceback() -> None:
    from tests.cluster.serve_processes import free_port

    url = f"http://127.0.0.1:{free_port()}"
    for command in ("tables", "query"):
        result = sparkiq(command, *(["SELECT 1"] if command == "query" else []), "--url", url)
        assert result.returncode == 2
        assert result.stderr == (
            f"sparkiq {command}: cannot reach {url}: is `sparkiq serve` running? "
            "set --url or SPARKIQ_URL\n"
        )
