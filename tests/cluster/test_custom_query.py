"""The guide's custom query type, registered once, answered across a two-node HTTP cluster:
a node that does not host a partition routes the query to the one that does, over the wire.
Public API only."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from sparkiq import Node, StateQueryRequest
from sparkiq.testing import write_table

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guide.md"
FAST = {"heartbeat_interval": 0.1, "failure_timeout": 1.0, "poll_interval": 0.01}


def guide_example() -> str:
    text = GUIDE.read_text()
    section = text[text.index("## Custom query types") :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "the guide's custom query section has a python example"
    return match.group(1)


def split_example() -> tuple[str, str]:
    """The example's definitions, and its query (which the test runs on chosen nodes)."""
    code = guide_example()
    cut = code.index("res = ")
    return code[:cut], code[cut:]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[list[Node]]:
    state = str(tmp_path)
    schema = pa.schema([("product", pa.string()), ("revenue", pa.float64())])
    rows = [{"product": f"p-{i}", "revenue": i * 10.0 if i % 7 else None} for i in range(40)]
    write_table(state, "revenue_by_product", rows, key="product", schema=schema, partitions=4)
    first = Node(state, node_id="a", listen="127.0.0.1:0", peers=[], standbys=0, **FAST).start()
    second = Node(
        state, node_id="b", listen="127.0.0.1:0", peers=[first.url], standbys=0, **FAST
    ).start()
    nodes = [first, second]
    try:
        yield nodes
    finally:
        for node in nodes:
            node.stop()


def hosts(nodes: list[Node], key: str) -> tuple[int, Node, Node]:
    """Wait until both nodes agree which one hosts ``key``'s partition; return the partition,
    the node hosting it and the other one."""
    deadline = time.monotonic() + 30
    while True:
        seen = [n.metadata_for_key("revenue_by_product", key) for n in nodes]
        actives = {m.active_host.node_id if m.active_host else None for m in seen}
        if len(actives) == 1 and None not in actives and all(not m.standby_hosts for m in seen):
            (active,) = actives
            hosting = next(n for n in nodes if n.node_id == active)
            other = next(n for n in nodes if n.node_id != active)
            return seen[0].partition, hosting, other
        assert time.monotonic() < deadline, f"the cluster never agreed on {key!r}: {seen}"
        time.sleep(0.05)


def test_the_guides_custom_query_runs_on_a_node_that_does_not_host_the_partition(
    cluster: list[Node],
) -> None:
    definitions, query = split_example()
    namespace: dict[str, Any] = {"__name__": "guide_custom_query"}
    exec(compile(definitions, str(GUIDE), "exec", dont_inherit=True), namespace)
    count_above = namespace["CountAbove"]("revenue", 100.0)
    expected = {i: 0 for i in range(4)}
    for i in range(40):
        if i * 10 > 100 and i % 7:
            partition = cluster[0].partition_for_key("revenue_by_product", f"p-{i}")
            expected[partition] += 1

    partition, hosting, other = hosts(cluster, "p-17")
    request = (
        StateQueryRequest.in_store("revenue_by_product")
        .with_query(count_above)
        .with_partitions({partition})
    )
    deadline = time.monotonic() + 30
    while True:  # until the hosting node has applied batch 0
        answer = other.query(request).only_partition_result()
        if answer.is_success or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert answer.is_success, answer
    assert answer.result == expected[partition]
    assert answer.position.to_map() == {"revenue_by_product": {partition: 0}}

    # The guide's own lines, on either node: every partition, routed where it lives.
    for node in (other, hosting):
        run = {"node": node, **namespace}
        exec(compile(query, str(GUIDE), "exec", dont_inherit=True), run)
        assert {p: r.result for p, r in run["res"].partition_results.items()} == expected
        assert run["total"] == sum(expected.values()) == 25
